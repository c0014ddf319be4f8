// Backward pass of dot-product attention on tensor cores (fp16 / bf16), the two
// walks of the two-launch backward (dot_backward.cu) with mma.m16n8k16:
//   dq walk (CSR):  dQ_i = scale * sum_{j -> i} dS_ij k_j,
//                   dS_ij = P_ij (dO_i . v_j - D_i),  P_ij = 2^(scale2 q_i . k_j - lse2_i),
//                   and each edge's (P_ij, dS_ij) in fp32 into pds [E, H] (CSR order);
//   dkv walk (CSC): dV_j = sum_i P_ij dO_i,  dK_j = scale * sum_i dS_ij q_i,
//                   the weights read back from pds through the CSC permutation.
//
// Why: the CUDA-core walks spend per edge and channel widening converts and FMAs
// (q . k, dO . v, dS k; P dO, dS q) and a shuffle reduction per edge for each
// dot product; bf16 forward+backward was only 0.96-1.28x fp32 on batch and
// power-law graphs. Both walks are the forward's sparse unit (scores/dot_mma.cuh,
// gt_mma_unit) rearranged: one warp owns 8 consecutive rows (dq: destinations,
// dkv: sources) of one head and walks their edges, contiguous in CSR / CSC, 16
// at a time:
//   dq:  S [16 edges x 8 rows] = K . Q^T,  dP = V . dO^T,
//        dS = P (dP - D) where the edge belongs to the column's row, else 0,
//        dQ^T [C x 8] += K^T [C x 16] . dS;
//   dkv: dV^T [C x 8] += dO^T [C x 16] . P,  dK^T [C x 8] += Q^T [C x 16] . dS,
// the SpMM weights rounded to T (fp32 accumulation, as flash attention's
// backward). No online softmax: lse2 comes from the forward, and each unit
// takes D = dO . O of its 8 rows from dO and the forward's fp32 rows (quad_dsum)
// before its first tile, so no launch of its own computes D. The dq walk loads k
// twice per tile: as 16-byte row slices for the SDDMM (A operand, rows = edges)
// and by whole 128-byte lines for the SpMM (A operand, rows = channels;
// load_v_words), the second from L1.
// Rows and columns are walked whole, whatever the work items: each output row is
// written once, no partials, no atomics (deterministic); a split row or column
// is one warp's, slow but not wrong. A non-finite gathered row makes the output
// of all 8 rows of its block non-finite (masked edges multiply it by 0), as in
// the forward.
// Runs where the kernel plan's mma_backward says so (pyg_dfgnn/ops/plan.py: by
// default where no row is split, as a warp waits for its longest of 8 rows):
// fp16 / bf16, C in {32, 64, 128}, no dropout.
#include "device/mma.cuh"
#include "host/dispatch.cuh"
#include "scores/dot_backward_mma.cuh"
#include "scores/dot_host.h"

namespace dfgnn {
namespace {

constexpr int kMmaBwdBlock = 32;  // one warp per block, as the forward (dot_forward_mma.cu)

// One warp per unit (8 rows of one head), as the forward (dot_forward_mma.cu).
template <typename T, int C>
__global__ void __launch_bounds__(kMmaBwdBlock)
gt_bwd_dq_mma_kernel(const T* __restrict__ dout, const T* __restrict__ q,
                     const T* __restrict__ k, const T* __restrict__ v,
                     const float* __restrict__ lse2, const float* __restrict__ out32,
                     const int* __restrict__ rowptr, const int* __restrict__ col,
                     T* __restrict__ dq, int64_t ld_q, float2* __restrict__ pds, int64_t n_rows,
                     int64_t n_units, int H, float scale, float scale2) {
  const int64_t unit = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
  if (unit >= n_units) return;  // whole warps
  gt_dq_mma_unit<T, C>(dout, q, k, v, lse2, out32, nullptr, rowptr, col, dq, ld_q, pds, n_rows,
                       H, scale, scale2, unit);
}

template <typename T, int C>
__global__ void __launch_bounds__(kMmaBwdBlock)
gt_bwd_dkv_mma_kernel(const T* __restrict__ dout, const T* __restrict__ q,
                      const float2* __restrict__ pds, const int* __restrict__ colptr,
                      const int* __restrict__ row, const int* __restrict__ perm,
                      T* __restrict__ dk, T* __restrict__ dv, int64_t ld_kv, int64_t n_cols,
                      int64_t n_units, int H, float scale) {
  const int64_t unit = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
  if (unit >= n_units) return;  // whole warps
  gt_dkv_mma_unit<T, C>(dout, q, pds, colptr, row, perm, dk, dv, ld_kv, n_cols, H, scale, unit);
}

// launch(TypeTag<T>, IntC<C>, blocks, n_units) for a half dtype and C in {32, 64,
// 128}, over the 8-row units of n rows and H heads (one warp, one block each);
// nothing where there are none.
template <typename F>
void launch_units(at::ScalarType st, int64_t C, int64_t n, int64_t H, F&& launch) {
  const int64_t n_units = (n + kMmaRows - 1) / kMmaRows * H;
  if (n_units == 0) return;
  const int64_t blocks = ceil_div(n_units * 32, kMmaBwdBlock);
  auto by_c = [&](auto T_) {
    if (C == 32) launch(T_, IntC<32>{}, blocks, n_units);
    else if (C == 64) launch(T_, IntC<64>{}, blocks, n_units);
    else launch(T_, IntC<128>{}, blocks, n_units);
  };
  if (st == at::kBFloat16) by_c(TypeTag<__nv_bfloat16>{});
  else by_c(TypeTag<__half>{});
}

}  // namespace

bool gt_backward_mma_supports(at::ScalarType st, int64_t C, bool aligned16) {
  return gt_forward_mma_supports(st, C, aligned16);
}

void gt_backward_dq_mma(const at::Tensor& grad_out, const at::Tensor& q, const at::Tensor& k,
                        const at::Tensor& v, const at::Tensor& lse2, const float* out32,
                        const LayoutView& L, at::Tensor& dq, float* pds, double scale) {
  TORCH_CHECK(out32 != nullptr || q.size(0) == 0,
              "dfgnn::attention_bwd (dot): the tensor-core dq walk needs the forward's "
              "float32 rows");
  const float sc = (float)scale, scale2 = (float)(scale * kLog2e);
  auto stream = c10::cuda::getCurrentCUDAStream();
  launch_units(q.scalar_type(), q.size(2), q.size(0), q.size(1),
               [&](auto T_, auto C_, int64_t blocks, int64_t n_units) {
    using T = typename decltype(T_)::type;
    gt_bwd_dq_mma_kernel<T, decltype(C_)::value><<<blocks, kMmaBwdBlock, 0, stream>>>(
        cptr<T>(grad_out), cptr<T>(q), cptr<T>(k), cptr<T>(v), lse2.data_ptr<float>(), out32,
        L.rowptr.data_ptr<int>(), L.col.data_ptr<int>(), mptr<T>(dq), dq.stride(0),
        reinterpret_cast<float2*>(pds), q.size(0), n_units, (int)q.size(1), sc, scale2);
    check_launch();
  });
}

void gt_backward_dkv_mma(const at::Tensor& grad_out, const at::Tensor& q, const float* pds,
                         const LayoutView& L, at::Tensor& dk, at::Tensor& dv, double scale) {
  auto stream = c10::cuda::getCurrentCUDAStream();
  launch_units(q.scalar_type(), q.size(2), dk.size(0), q.size(1),
               [&](auto T_, auto C_, int64_t blocks, int64_t n_units) {
    using T = typename decltype(T_)::type;
    gt_bwd_dkv_mma_kernel<T, decltype(C_)::value><<<blocks, kMmaBwdBlock, 0, stream>>>(
        cptr<T>(grad_out), cptr<T>(q), reinterpret_cast<const float2*>(pds),
        L.colptr.data_ptr<int>(), L.row.data_ptr<int>(), L.perm.data_ptr<int>(), mptr<T>(dk),
        mptr<T>(dv), dk.stride(0), dk.size(0), n_units, (int)q.size(1), (float)scale);
    check_launch();
  });
}

}  // namespace dfgnn
