// The dot score's backward (scores/dot.cuh; paper §4.3, Appendix B, Fig. 8):
//   dQ_i = scale sum_j dS_ij k_j,  dK_j = scale sum_i dS_ij q_i,  dV_j = sum_i P'_ij dO_i
// on the walks the plan names: the CUDA-core walks over the dot functor
// (kernels/row_backward.cuh: dq then dkv, or both in one launch) or the
// tensor-core walks (dot_backward_mma.cu) or their dense-tile form
// (dot_backward_dense.cu), with D from the forward's fp32 rows in
// fp16 / bf16 (out_dsum, host/backward_launch.cuh, says why D must not come from
// the rounded output): the tensor-core dq walk and dense dq launch compute it for
// their own rows, the CUDA-core walks read it from out_dsum's pass.
#include "host/backward_launch.cuh"
#include "scores/dot.cuh"
#include "scores/dot_host.h"

namespace dfgnn {
namespace {

// The plan's tensor-core walks (dot_backward_mma.cu), or their dense-tile form
// (dot_backward_dense.cu) where the plan's dense_backward says so: a warp walks 8
// whole rows or columns, a dense block 64 (the work items and their partials are
// unused: a split row is one warp's), and the second launch's sparse units need
// the first one's weights.
struct DotMmaWalks {
  bool on, dense;
  const at::Tensor &grad_out, &q, &k, &v, &lse2;
  const LayoutView& L;
  const float* out32;
  float* dsum;  // D, written by the dense dq launch for the dkv launch
  double scale, cells;
  void dq(at::Tensor& dq, float* pds) const {
    if (dense)
      gt_backward_dq_dense(grad_out, q, k, v, lse2, out32, dsum, L, cells, dq, pds, scale);
    else gt_backward_dq_mma(grad_out, q, k, v, lse2, out32, L, dq, pds, scale);
  }
  void dkv(at::Tensor& dk, at::Tensor& dv, const float* pds) const {
    if (dense)
      gt_backward_dkv_dense(grad_out, q, k, v, lse2, dsum, pds, L, cells, dk, dv, scale);
    else gt_backward_dkv_mma(grad_out, q, pds, L, dk, dv, scale);
  }
};

}  // namespace

std::tuple<at::Tensor, at::Tensor, at::Tensor> gt_backward_cuda(
    const at::Tensor& grad_out, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
    const at::Tensor& out, const at::Tensor& lse2, const at::Tensor& out32, const LayoutView& L,
    double scale, double dropout, int64_t seed, const KernelPlan& plan, const GradsOut* into) {
  constexpr const char* op = "dfgnn::attention_bwd (dot)";
  const int64_t C = q.size(2);
  const at::Tensor none;
  check_vector_rows(op, plan.vector_rows, {{"q", &q}, {"k", &k}, {"v", &v}, {"out", &out},
                               {"grad_out", &grad_out},
                               {"dq (given)", into != nullptr ? &into->dq : &none},
                               {"dk (given)", into != nullptr ? &into->dk : &none},
                               {"dv (given)", into != nullptr ? &into->dv : &none}});
  TORCH_CHECK(!plan.mma_backward ||
                  (!plan.bwd_one_launch && dropout == 0.0 && plan.vector_rows &&
                   gt_backward_mma_supports(q.scalar_type(), C, true)),
              op, ": mma_backward=True (the tensor-core walks) needs float16 / bfloat16, C in "
              "{32, 64, 128}, dropout 0, bwd_one_launch=False and vector_rows=True (16-byte "
              "aligned rows), got bwd_one_launch=", plan.bwd_one_launch ? "True" : "False",
              ", dropout=", std::to_string(dropout));
  TORCH_CHECK(!plan.dense_backward || (plan.mma_backward && plan.dense_cells > 0.0 &&
                                       L.tiles.defined() && L.tiles_t.defined()),
              op, ": dense_backward=True (the dense-tile backward) needs mma_backward, "
              "dense_cells > 0 and both tile plans (the layout's and its transpose's)");
  // D_i in fp32 for half inputs, from the forward's fp32 rows: out_dsum's pass
  // for the CUDA-core walks; the tensor-core dq walks compute it themselves (the
  // dense one into dsum_t for its dkv launch), saving the pass's launch and its
  // second read of dO (bf16 PATTERN-like batch, 1 x 128: backward 0.313 -> 0.299 ms).
  at::Tensor dsum_t;
  if (!plan.mma_backward) {
    dsum_t = out_dsum(op, grad_out, out32);
  } else {
    check_out32(op, out32);
    if (plan.dense_backward)
      dsum_t = at::empty({q.size(0), q.size(1)}, q.options().dtype(at::kFloat));
  }
  float* dsum = dsum_t.defined() ? dsum_t.data_ptr<float>() : nullptr;
  const float sc = (float)scale, scale2 = (float)(scale * kLog2e);
  const BackwardArgs a{op, grad_out, out, lse2, q, k, L, plan, dropout, seed};
  const DotMmaWalks mma{plan.mma_backward, plan.dense_backward, grad_out, q, k, v, lse2, L,
                        plan.mma_backward ? out32.data_ptr<float>() : nullptr, dsum, scale,
                        plan.dense_cells};
  RowGrads r = row_backward<DotScore>(a, into, dsum, [&](auto tag) {
    using T = typename decltype(tag)::type;
    return DotParams<T>{cptr<T>(q), cptr<T>(k), cptr<T>(v), sc, scale2};
  }, mma);
  return {r.dq, r.dk, r.dv};
}

}  // namespace dfgnn
