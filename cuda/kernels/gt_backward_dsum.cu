// D = dO . O in fp32 for the dot score's fp16 / bf16 backward (kernels/row_dsum.cuh
// over the dot functor): its own translation unit, compiled beside
// gt_backward.cu's walks.
#include "host/backward_launch.cuh"
#include "host/ops.h"
#include "scores/dot.cuh"

namespace dfgnn {

at::Tensor gt_backward_dsum(const at::Tensor& grad_out, const at::Tensor& q, const at::Tensor& k,
                            const at::Tensor& v, const at::Tensor& lse2, const LayoutView& L,
                            const KernelPlan& plan, double scale, double dropout,
                            int64_t seed) {
  const float sc = (float)scale, scale2 = (float)(scale * kLog2e);
  const at::Tensor none;
  const BackwardArgs a{"dfgnn::attention_bwd (dot)", grad_out, none, lse2, q, k, L, plan, dropout, seed};
  return row_dsum<DotScore>(a, [&](auto tag) {
    using T = typename decltype(tag)::type;
    return DotParams<T>{cptr<T>(q), cptr<T>(k), cptr<T>(v), sc, scale2};
  });
}

}  // namespace dfgnn
