// The additive score's host entry points and registration (host/score_ops.h):
// inputs (a_dst [N_dst, H], a_src [N_src, H], x [N_src, H, C]), params
// (negative_slope); the backward returns (d a_dst, d a_src, dx). Its functor is
// scores/additive.cuh, its walks kernels/gat_forward.cu and gat_backward.cu.
#include "host/input_checks.h"
#include "host/ops.h"
#include "host/score_ops.h"

namespace dfgnn {
namespace {

constexpr const char* kFwd = "dfgnn::attention_fwd (additive)";

void check(const AttentionCall& c, int64_t n_dst, int64_t n_src) {
  TORCH_CHECK(c.inputs.size() == 3 && c.params.size() == 1, kFwd, ": the additive score takes "
              "inputs (a_dst, a_src, x) and params (negative_slope), got ",
              num(c.inputs.size()), " inputs and ", num(c.params.size()), " params");
  const at::Tensor &a_dst = c.inputs[0], &a_src = c.inputs[1], &x = c.inputs[2];
  check_x(x);
  check_rows(kFwd, x, "x", n_src, "N_src");
  for (auto [t, name, n] : {std::make_tuple(&a_dst, "a_dst", n_dst),
                            std::make_tuple(&a_src, "a_src", n_src)}) {
    check_cuda(*t, name, x);
    TORCH_CHECK(t->scalar_type() == x.scalar_type(), "dfgnn: ", name, " has dtype ",
                t->scalar_type(), " but x has ", x.scalar_type());
    TORCH_CHECK(t->dim() == 2 && t->size(0) == n && t->size(1) == x.size(1), "dfgnn: ", name,
                " must be [", num(n), ", ", num(x.size(1)), "], got ", shape(t->sizes()));
  }
  check_dropout(c.dropout, kFwd);
  TORCH_CHECK(!c.plan.mma && !c.L.tiles.defined(), kFwd, ": the tensor-core and dense-tile "
              "forwards are GT's: mma must be 0 and tiles None");
}

ForwardOut forward(const AttentionCall& c) {
  auto [out, lse2, attn] = gat_forward_cuda(c.inputs[0], c.inputs[1], c.inputs[2], c.L,
                                            c.params[0], c.dropout, c.seed, c.need_attn, c.plan);
  return {out, lse2, attn, {}};
}

std::vector<at::Tensor> backward(const at::Tensor& grad_out, const at::Tensor& out,
                                 const at::Tensor& lse2, at::TensorList, const AttentionCall& c,
                                 at::TensorList) {
  const at::Tensor &a_dst = c.inputs[0], &a_src = c.inputs[1], &x = c.inputs[2];
  check_backward_tensors("dfgnn::attention_bwd (additive)", grad_out, out, lse2, x, a_dst.size(0));
  auto [da_dst, da_src, dx] = gat_backward_cuda(grad_out, a_dst, a_src, x, out, lse2, c.L,
                                                c.params[0], c.dropout, c.seed, c.plan);
  return {da_dst, da_src, dx};
}

}  // namespace

DFGNN_REGISTER_SCORE(additive, ScoreOps{"additive", &check, &forward, &backward, false});

}  // namespace dfgnn
