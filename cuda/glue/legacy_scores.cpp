// Registrations of the dot, additive and cosine scores over the kernel
// families' host entry points (host/ops.h).
#include <ATen/ATen.h>

#include <vector>

#include "host/checks.h"
#include "host/ops.h"
#include "host/score_ops.h"

namespace dfgnn {
namespace {

using Tensor = at::Tensor;

void check_inputs_n(const AttentionCall& c, size_t n, const char* score, const char* names) {
  TORCH_CHECK(c.inputs.size() == n, "dfgnn: the ", score, " score takes ", num((int64_t)n),
              " inputs (", names, "), got ", num((int64_t)c.inputs.size()));
}

// ---------------------------------------------------------------------- dot
void dot_check(const AttentionCall& c, int64_t n_dst, int64_t n_src) {
  check_inputs_n(c, 3, "dot", "q, k, v");
  check_params(c.params, 1, "dot", "scale");
  const Tensor &q = c.inputs[0], &k = c.inputs[1], &v = c.inputs[2];
  check_float_dtype(q, "q");
  check_features(q, "q", n_dst, q, "q");
  check_features(k, "k", n_src, q, "q");
  check_features(v, "v", n_src, q, "q");
  TORCH_CHECK(!c.plan.mma || (c.dropout == 0.0 && !c.need_attn &&
                              gt_forward_mma_supports(q.scalar_type(), q.size(2), true)),
              "dfgnn: mma=True (the tensor-core forward) needs float16 / bfloat16, C in "
              "{32, 64, 128}, dropout 0 and need_attn=False");
}

ForwardOut dot_forward(const AttentionCall& c) {
  auto [out, lse2, attn] = gt_forward_cuda(c.inputs[0], c.inputs[1], c.inputs[2], c.L,
                                           c.params[0], c.dropout, c.seed, c.need_attn, c.plan);
  return {out, lse2, attn, {}};
}

std::vector<Tensor> dot_backward(const Tensor& grad_out, const Tensor& out, const Tensor& lse2,
                                 at::TensorList, const AttentionCall& c, at::TensorList into) {
  GradsOut g;
  if (!into.empty()) g = GradsOut{into[0], into[1], into[2]};
  auto [dq, dk, dv] = gt_backward_cuda(grad_out, c.inputs[0], c.inputs[1], c.inputs[2], out,
                                       lse2, c.L, c.params[0], c.dropout, c.seed,
                                       c.plan.bwd_one_launch, c.plan.mma_backward,
                                       into.empty() ? nullptr : &g);
  return {dq, dk, dv};
}

DFGNN_REGISTER_SCORE(dot, ScoreOps{"dot", &dot_check, &dot_forward, &dot_backward, true});

// ----------------------------------------------------------------- additive
void additive_check(const AttentionCall& c, int64_t n_dst, int64_t n_src) {
  check_inputs_n(c, 3, "additive", "a_dst, a_src, x");
  check_params(c.params, 1, "additive", "negative_slope");
  const Tensor &a_dst = c.inputs[0], &a_src = c.inputs[1], &x = c.inputs[2];
  check_float_dtype(x, "x");
  check_features(x, "x", n_src, x, "x");
  check_node_terms(a_dst, "a_dst", n_dst, x, "x");
  check_node_terms(a_src, "a_src", n_src, x, "x");
  TORCH_CHECK(!c.plan.mma && !c.L.tiles.defined(), "dfgnn: the tensor-core and dense-tile "
              "forwards are the dot score's: mma must be 0 and tiles None");
}

ForwardOut additive_forward(const AttentionCall& c) {
  auto [out, lse2, attn] = gat_forward_cuda(c.inputs[0], c.inputs[1], c.inputs[2], c.L,
                                            c.params[0], c.dropout, c.seed, c.need_attn, c.plan);
  return {out, lse2, attn, {}};
}

std::vector<Tensor> additive_backward(const Tensor& grad_out, const Tensor& out,
                                      const Tensor& lse2, at::TensorList, const AttentionCall& c,
                                      at::TensorList) {
  auto [da_dst, da_src, dx] = gat_backward_cuda(grad_out, c.inputs[0], c.inputs[1], c.inputs[2],
                                                out, lse2, c.L, c.params[0], c.dropout, c.seed);
  return {da_dst, da_src, dx};
}

DFGNN_REGISTER_SCORE(additive,
                     ScoreOps{"additive", &additive_check, &additive_forward, &additive_backward});

// ------------------------------------------------------------------- cosine
// AGNN: softmax of beta cos(x_i, x_j) over the in-edges, aggregating x_j. fp32
// scores the unnormalised rows (cosine_forward_cuda: one gathered row per edge);
// fp16 / bf16 normalise first (k = x / max(||x||, eps), q = beta k) and run the
// dot forward with scale 1, whose lse matches the rounded k and q the backward
// recomputes its scores from.
void cosine_check(const AttentionCall& c, int64_t n_dst, int64_t n_src) {
  check_inputs_n(c, 2, "cosine", "x, beta");
  check_params(c.params, 1, "cosine", "eps");
  const Tensor &x = c.inputs[0], &beta = c.inputs[1];
  check_float_dtype(x, "x");
  check_features(x, "x", n_src, x, "x");
  TORCH_CHECK(n_src == n_dst, "dfgnn: the cosine score normalises one x for both ends: the "
              "graph must have N_src == N_dst, got ", num(n_src), " and ", num(n_dst));
  TORCH_CHECK(beta.scalar_type() == at::kFloat && beta.numel() == 1,
              "dfgnn: beta must be a float32 tensor with one element, got ", beta.scalar_type(),
              " ", shape(beta.sizes()));
  TORCH_CHECK(c.params[0] > 0.0, "dfgnn: eps must be > 0, got ", std::to_string(c.params[0]));
  TORCH_CHECK(!c.plan.pmf && !c.L.tiles.defined() && c.dropout == 0.0,
              "dfgnn: the cosine score runs SMMF without dense tiles or dropout");
}

ForwardOut cosine_forward(const AttentionCall& c) {
  const Tensor &x = c.inputs[0], &beta = c.inputs[1];
  const double eps = c.params[0];
  if (x.scalar_type() == at::kFloat) {
    auto [out, lse2, attn, rnorm] =
        cosine_forward_cuda(x, beta, eps, c.L, c.need_attn, c.plan.two_rows);
    return {out, lse2, attn, {rnorm}};
  }
  auto [k, q, rnorm] = l2norm_forward_cuda(x, beta, eps);
  auto [out, lse2, attn] = gt_forward_cuda(q, k, x, c.L, 1.0, 0.0, 0, c.need_attn, c.plan);
  return {out, lse2, attn, {rnorm, k, q}};
}

// dx = (the normalisation's backward of dk, dq) + dv, since x is both v and the
// normalised k and q; dbeta from the normalisation's per-row terms.
std::vector<Tensor> cosine_backward(const Tensor& grad_out, const Tensor& out, const Tensor& lse2,
                                    at::TensorList saved, const AttentionCall& c, at::TensorList) {
  const Tensor &x = c.inputs[0], &beta = c.inputs[1];
  TORCH_CHECK(!saved.empty(), "dfgnn: the cosine score's backward needs the forward's rnorm");
  const Tensor rnorm = saved[0];
  Tensor k, q;
  if (saved.size() >= 3) {
    k = saved[1];
    q = saved[2];
  } else {  // the fp32 forward did not build k and q
    std::tie(k, q, std::ignore) = l2norm_forward_cuda(x, beta, c.params[0]);
  }
  auto [dq, dk, dv] = gt_backward_cuda(grad_out, q, k, x, out, lse2, c.L, 1.0, 0.0, 0,
                                       c.plan.bwd_one_launch, c.plan.mma_backward);
  auto [dxn, dbeta_part] = l2norm_backward_cuda(dk, dq, k, rnorm, beta);
  return {dxn.add(dv), dbeta_part.sum().reshape(beta.sizes())};
}

DFGNN_REGISTER_SCORE(cosine,
                     ScoreOps{"cosine", &cosine_check, &cosine_forward, &cosine_backward});

}  // namespace
}  // namespace dfgnn
