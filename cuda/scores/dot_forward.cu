// The dot score's forward (scores/dot.cuh):
//   out_i = sum_{j -> i} softmax_j(scale * q_i . k_j) * v_j      (paper eq. 1-2)
// on the kernels the plan names: the tensor-core forward (dot_forward_mma.cu) or
// its dense-tile variant (dot_forward_dense.cu), else the CUDA-core walks over
// the dot functor, SMMF (kernels/row_forward.cuh) or PMF (edge_sddmm.cuh, then
// softmax_spmm).
#include "host/forward_launch.cuh"
#include "scores/dot.cuh"
#include "scores/dot_host.h"

namespace dfgnn {

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> gt_forward_cuda(
    const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const LayoutView& L,
    double scale, double dropout, int64_t seed, bool need_attn, const KernelPlan& plan,
    bool keep_out32) {
  constexpr const char* op = "dfgnn::attention_fwd (dot)";
  ForwardCall fc(q, q.size(0), L, plan.pmf, need_attn, keep_out32);
  check_vector_rows(op, plan.vector_rows, {{"q", &q}, {"k", &k}, {"v", &v}, {"out", &fc.out}});
  if (plan.mma) {
    // The plan's tensor-core forward (the caller checked dtype, C, dropout,
    // attention weights); it loads 16-byte row slices.
    TORCH_CHECK(plan.vector_rows && gt_forward_mma_supports(q.scalar_type(), q.size(2), true),
                op, ": mma=True needs float16 / bfloat16, C in {32, 64, 128} and "
                "vector_rows=True (16-byte aligned rows)");
    if (plan.dense_cells > 0.0) {
      TORCH_CHECK(L.tiles.defined(), op, ": dense_cells > 0 runs the dense tiles of the "
                  "layout's tile plan, and the call has none (csr entry 5 is None)");
      gt_forward_dense(q, k, v, L, plan.dense_cells, fc.out, fc.out32_ptr(), fc.lse2, scale);
    } else {
      gt_forward_mma(q, k, v, L, fc.out, fc.out32_ptr(), fc.lse2, scale);
    }
    return {fc.out, fc.lse2, fc.attn, fc.out32};
  }
  const float sc = (float)scale, scale2 = (float)(scale * kLog2e);
  row_forward<DotScore>(op, fc, v, L, plan, dropout, seed, [&](auto tag) {
    using T = typename decltype(tag)::type;
    return DotParams<T>{cptr<T>(q), cptr<T>(k), cptr<T>(v), sc, scale2};
  });
  return {fc.out, fc.lse2, fc.attn, fc.out32};
}

}  // namespace dfgnn
