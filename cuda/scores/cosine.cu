// AGNN's cosine score: its host entry points and registration
// (host/score_ops.h): inputs (x [N, H, C], beta [1] float32), params (eps).
//   the plan's normalize_first = 0 (fp32 SMMF): the cosine functor
//     (scores/cosine.cuh) over the unnormalised x, so each edge gathers x_j once
//     for the score and the sum; saved = (rnorm).
//   normalize_first = 1 (fp16 / bf16, whose lse must match the rounded k and q
//     the backward recomputes the scores from, or PMF): the normalisation
//     k = x / max(||x||, eps), q = beta k (l2norm_forward_cuda), then the dot
//     score over (q, k, x) with scale 1, on the kernels the plan names (the
//     tensor-core and dense-tile ones included); saved = (k, q, rnorm).
// The backward is the dot score's over (q, k, x), scale 1 (k, q recomputed
// where the forward did not build them), then the normalisation's backward:
// dx = dxn + dv (x is both v and the source of k, q), dbeta from its per-row
// terms, summed in a fixed order.
#include "host/forward_launch.cuh"
#include "host/input_checks.h"
#include "host/score_ops.h"
#include "scores/cosine.cuh"
#include "scores/dot_host.h"

namespace dfgnn {

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> cosine_forward_cuda(
    const at::Tensor& x, const at::Tensor& beta, double eps, const LayoutView& L,
    bool need_attn, const KernelPlan& plan) {
  constexpr const char* op = "dfgnn::attention_fwd (cosine)";
  TORCH_CHECK(x.scalar_type() == at::kFloat, op, ": the cosine SMMF kernel is float32 only");
  TORCH_CHECK(!plan.mma && plan.dense_cells <= 0.0, op, ": mma and dense_cells are the dot "
              "score's kernels");
  auto rnorm = l2norm_rnorm_cuda(x, eps, plan.vector_rows);
  ForwardCall fc(x, x.size(0), L, false, need_attn);
  check_vector_rows(op, plan.vector_rows, {{"x", &x}, {"out", &fc.out}});
  row_forward<CosineScore, /*HAS_PMF=*/false>(op, fc, x, L, plan, 0.0, 0, [&](auto tag) {
    using T = typename decltype(tag)::type;
    return CosineParams<T>{cptr<T>(x), rnorm.data_ptr<float>(), beta.data_ptr<float>()};
  });
  return {fc.out, fc.lse2, fc.attn, rnorm};
}

namespace {

constexpr const char* kFwd = "dfgnn::attention_fwd (cosine)";
constexpr const char* kBwd = "dfgnn::attention_bwd (cosine)";

void check(const AttentionCall& c, int64_t n_dst, int64_t n_src) {
  TORCH_CHECK(c.inputs.size() == 2 && c.params.size() == 1, kFwd, ": the cosine score takes "
              "inputs (x, beta) and params (eps), got ", num(c.inputs.size()), " inputs and ",
              num(c.params.size()), " params");
  const at::Tensor &x = c.inputs[0], &beta = c.inputs[1];
  check_x(x);
  check_rows(kFwd, x, "x", n_dst, "N_dst");
  check_rows(kFwd, x, "x", n_src, "N_src");
  check_beta(beta, x);
  TORCH_CHECK(c.params[0] > 0.0, kFwd, ": eps must be > 0, got ", std::to_string(c.params[0]));
  check_dropout(c.dropout, kFwd);
  const KernelPlan& p = c.plan;
  TORCH_CHECK(!p.mma || (!p.pmf && c.dropout == 0.0 && !c.need_attn &&
                         gt_forward_mma_supports(x.scalar_type(), x.size(2), /*aligned16=*/true)),
              kFwd, ": mma=True (the tensor-core forward) needs float16 / bfloat16, C in "
              "{32, 64, 128}, pmf=False, dropout 0 and need_attn=False");
  check_tile_plan(kFwd, c.L, p, x);
}

ForwardOut forward(const AttentionCall& c) {
  const at::Tensor &x = c.inputs[0], &beta = c.inputs[1];
  const double eps = c.params[0];
  if (!c.plan.normalize_first) {
    TORCH_CHECK(x.scalar_type() == at::kFloat && !c.plan.pmf && c.dropout == 0.0, kFwd,
                ": normalize_first=0 runs the cosine SMMF kernel, which takes float32, "
                "pmf=0 and no attention dropout; got ", x.scalar_type(), ", pmf=",
                num(c.plan.pmf), ", dropout ", std::to_string(c.dropout));
    auto [out, lse2, attn, rnorm] = cosine_forward_cuda(x, beta, eps, c.L, c.need_attn, c.plan);
    return {out, lse2, attn, {rnorm}};
  }
  auto [k, q, rnorm] = l2norm_forward_cuda(kFwd, x, beta, eps, c.plan.vector_rows);
  auto [out, lse2, attn, out32] = gt_forward_cuda(q, k, x, c.L, 1.0, c.dropout, c.seed,
                                                  c.need_attn, c.plan, c.keep_out32);
  return {out, lse2, attn, {k, q, rnorm}, out32};
}

// saved: (rnorm) from the cosine kernel, or (k, q, rnorm).
std::vector<at::Tensor> backward(const at::Tensor& grad_out, const at::Tensor& out,
                                 const at::Tensor& lse2, at::TensorList saved,
                                 const AttentionCall& c, at::TensorList) {
  const at::Tensor &x = c.inputs[0], &beta = c.inputs[1];
  check_backward_tensors(kBwd, grad_out, out, lse2, x, x.size(0));
  TORCH_CHECK(saved.size() == 1 || saved.size() == 3, kBwd, ": saved holds (rnorm) or "
              "(k, q, rnorm), got ", num(saved.size()), " tensors");
  at::Tensor k, q, rnorm = saved.back();
  if (saved.size() == 3) {
    k = saved[0];
    q = saved[1];
  } else {
    std::tie(k, q, std::ignore) = l2norm_forward_cuda(kBwd, x, beta, c.params[0],
                                                       c.plan.vector_rows);
  }
  auto [dq, dk, dv] = gt_backward_cuda(grad_out, q, k, x, out, lse2, c.out32, c.L, 1.0,
                                       c.dropout, c.seed, c.plan);
  auto [dxn, dbeta_part] = l2norm_backward_cuda(dk, dq, k, rnorm, beta, c.plan.vector_rows);
  return {dxn.add_(dv), dbeta_part.sum().reshape(beta.sizes())};
}

}  // namespace

DFGNN_REGISTER_SCORE(cosine, ScoreOps{"cosine", &check, &forward, &backward, false,
                                       /*normalizes=*/true,
                                       ScorePaths{/*pmf=*/true, /*mma=*/true,
                                                  /*dense_tiles=*/true},
                                       /*keeps_out32=*/true});

}  // namespace dfgnn
