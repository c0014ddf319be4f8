// The dot score's host entry points and registration (host/score_ops.h):
// inputs (q [N_dst, H, C], k, v [N_src, H, C]), params (scale). Its functor is
// scores/dot.cuh; its kernels are instantiated in scores/dot_forward.cu and
// dot_backward.cu (beside the tensor-core and dense-tile kernels that only this
// score has).
#include "host/input_checks.h"
#include "host/ops.h"
#include "host/score_ops.h"
#include "scores/dot_host.h"

namespace dfgnn {
namespace {

constexpr const char* kFwd = "dfgnn::attention_fwd (dot)";
constexpr const char* kBwd = "dfgnn::attention_bwd (dot)";

void check(const AttentionCall& c, int64_t n_dst, int64_t n_src) {
  TORCH_CHECK(c.inputs.size() == 3 && c.params.size() == 1, kFwd, ": the dot score takes "
              "inputs (q, k, v) and params (scale), got ", num(c.inputs.size()), " inputs and ",
              num(c.params.size()), " params");
  const at::Tensor &q = c.inputs[0], &k = c.inputs[1], &v = c.inputs[2];
  check_qkv(q, k, v);
  check_rows(kFwd, q, "q", n_dst, "N_dst");
  check_rows(kFwd, k, "k", n_src, "N_src");
  check_dropout(c.dropout, kFwd);
  const KernelPlan& p = c.plan;
  TORCH_CHECK(!p.mma || (!p.pmf && c.dropout == 0.0 && !c.need_attn &&
                         gt_forward_mma_supports(q.scalar_type(), q.size(2), /*aligned16=*/true)),
              kFwd, ": mma=True (the tensor-core forward) needs float16 / bfloat16, C in "
              "{32, 64, 128}, pmf=False, dropout 0 and need_attn=False");
  check_tile_plan(kFwd, c.L, p, q);
}

ForwardOut forward(const AttentionCall& c) {
  auto [out, lse2, attn, out32] =
      gt_forward_cuda(c.inputs[0], c.inputs[1], c.inputs[2], c.L, c.params[0], c.dropout, c.seed,
                      c.need_attn, c.plan, c.keep_out32);
  return {out, lse2, attn, {}, out32};
}

// into: (dq, dk, dv) to write into, undefined entries allocated (GradsOut).
std::vector<at::Tensor> backward(const at::Tensor& grad_out, const at::Tensor& out,
                                 const at::Tensor& lse2, at::TensorList, const AttentionCall& c,
                                 at::TensorList into) {
  const at::Tensor &q = c.inputs[0], &k = c.inputs[1], &v = c.inputs[2];
  check_backward_tensors(kBwd, grad_out, out, lse2, q, q.size(0));
  GradsOut given;
  if (!into.empty()) {
    TORCH_CHECK(into.size() == 3, kBwd, ": into holds (dq, dk, dv), got ", num(into.size()),
                " tensors");
    given = {into[0], into[1], into[2]};
    const char* names[] = {"dq", "dk", "dv"};
    for (size_t i = 0; i < 3; ++i)
      if (into[i].defined()) check_grad_into(kBwd, into[i], names[i], c.inputs[i]);
    TORCH_CHECK(!given.dk.defined() || !given.dv.defined() || given.dk.size(0) <= 1 ||
                    given.dk.stride(0) == given.dv.stride(0),
                kBwd, ": dk and dv need the same row stride, got ", num(given.dk.stride(0)),
                " and ", num(given.dv.stride(0)));
  }
  auto [dq, dk, dv] = gt_backward_cuda(grad_out, q, k, v, out, lse2, c.out32, c.L, c.params[0],
                                       c.dropout, c.seed, c.plan,
                                       into.empty() ? nullptr : &given);
  return {dq, dk, dv};
}

}  // namespace

DFGNN_REGISTER_SCORE(dot, ScoreOps{"dot", &check, &forward, &backward, true, false,
                                   ScorePaths{/*pmf=*/true, /*mma=*/true, /*dense_tiles=*/true},
                                   /*keeps_out32=*/true});

}  // namespace dfgnn
