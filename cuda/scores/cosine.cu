// AGNN's cosine score over unnormalised x (the fp32 SMMF forward): the cosine
// functor (scores/cosine.cuh) over the row walks, so each edge gathers x_j once
// for the score and the sum. fp16 / bf16 AGNN normalises first and runs the dot
// score (glue/agnn.cpp).
#include "host/forward_launch.cuh"
#include "host/ops.h"
#include "scores/cosine.cuh"

namespace dfgnn {

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> cosine_forward_cuda(
    const at::Tensor& x, const at::Tensor& beta, double eps, const LayoutView& L,
    bool need_attn, const KernelPlan& plan) {
  constexpr const char* op = "dfgnn::cos_fwd";
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

}  // namespace dfgnn
