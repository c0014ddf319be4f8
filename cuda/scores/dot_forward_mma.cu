// Forward pass of dot-product attention on tensor cores (fp16 / bf16):
//   out_i = sum_{j -> i} softmax_j(scale * q_i . k_j) * v_j      (paper eq. 1-2)
//
// Why: the CUDA-core SMMF kernel (dot_forward.cu) spends per edge and channel a
// widening convert and an FMA for q . k, another pair for p v, and a shuffle
// reduction per edge; in bf16 that, not the bytes, bounded the batch graphs (bf16
// only 1.1-1.2x faster than fp32 there).
// Here one warp owns 8 consecutive destination rows (one head) and walks their
// edges, which are contiguous in CSR, 16 at a time, with mma.m16n8k16:
//   SDDMM  S[16 edges x 8 rows] = K[16 x C] . Q^T[C x 8], a score is kept where
//          the edge belongs to the column's row (the others are masked);
//   SpMM   O^T[C x 8 rows] += V^T[C x 16] . P[16 x 8], P the masked softmax
//          numerators of the tile, rounded to T (fp32 accumulation, as in
//          flash attention).
// The order of the channels inside a dot product is free, so the K fragments
// come straight from 16-byte row slices; V is loaded by whole 128-byte lines and
// shuffled to its fragments (load_v_words), whose channel order the store
// follows. P goes from the SDDMM's accumulator layout to the SpMM's operand
// layout with two movmatrix transposes. The softmax is online per row (running
// max and sum, base 2), so rows of any length are one pass; a tile may hold edges
// of up to 8 rows, so a row's maximum is the column maximum. The kernel is bound
// by L1 wavefronts and load latency, not by its arithmetic.
// Because a tile's product runs over all its edges for each of the 8 rows (the
// masked ones with weight 0), a non-finite v row makes all 8 rows of its block
// non-finite, not only the rows it is a neighbour of.
// Runs where the kernel plan says so (pyg_dfgnn/ops/plan.py: by default calls
// without split rows; never with dropout or returned attention weights, and C in
// {32, 64, 128}, 16-byte rows); the others run the CUDA-core walks.
#include "host/dispatch.cuh"
#include "scores/dot_host.h"
#include "scores/dot_mma.cuh"

namespace dfgnn {
namespace {

// One warp per block. A block holds its SM slot until its slowest warp is done
// (kNodeBlock, host/dispatch.cuh); this kernel's warps are independent, so single-warp
// blocks free each slot as soon as its warp ends: 1.5-3 % faster than 64 threads
// on the sparse batches (MNIST, CIFAR10, COCO-SP), the same on PATTERN / CLUSTER.
constexpr int kMmaBlock = 32;

template <typename T, int C>
__global__ void __launch_bounds__(kMmaBlock)
gt_fwd_mma_kernel(const T* __restrict__ q, const T* __restrict__ k, const T* __restrict__ v,
                  const int* __restrict__ rowptr, const int* __restrict__ col, T* __restrict__ out,
                  float* __restrict__ out32, float* __restrict__ lse2, int64_t n_rows,
                  int64_t n_units, int H, float scale2) {
  const int64_t unit = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
  if (unit >= n_units) return;  // whole warps
  const int64_t blk = unit / H;
  gt_mma_unit<T, C>(q, k, v, rowptr, col, out, out32, lse2, n_rows, H, scale2, blk,
                    (int)(unit - blk * H));
}

}  // namespace

bool gt_forward_mma_supports(at::ScalarType st, int64_t C, bool aligned16) {
  return (st == at::kHalf || st == at::kBFloat16) && aligned16 &&
         (C == 32 || C == 64 || C == 128);
}

void gt_forward_mma(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                    const LayoutView& L, at::Tensor& out, float* out32, at::Tensor& lse2,
                    double scale) {
  const at::Tensor &rowptr = L.rowptr, &col = L.col;
  const int64_t N = q.size(0), H = q.size(1), C = q.size(2);
  const int64_t n_units = (N + kMmaRows - 1) / kMmaRows * H;
  if (n_units == 0) return;
  const float scale2 = (float)(scale * kLog2e);
  auto stream = c10::cuda::getCurrentCUDAStream();
  auto launch = [&](auto T_, auto C_) {
    using T = typename decltype(T_)::type;
    constexpr int CC = decltype(C_)::value;
    gt_fwd_mma_kernel<T, CC><<<ceil_div(n_units * 32, kMmaBlock), kMmaBlock, 0, stream>>>(
        cptr<T>(q), cptr<T>(k), cptr<T>(v), rowptr.data_ptr<int>(), col.data_ptr<int>(),
        mptr<T>(out), out32, lse2.data_ptr<float>(), N, n_units, (int)H, scale2);
    check_launch();
  };
  auto by_c = [&](auto T_) {
    if (C == 32) launch(T_, IntC<32>{});
    else if (C == 64) launch(T_, IntC<64>{});
    else launch(T_, IntC<128>{});
  };
  if (q.scalar_type() == at::kBFloat16) by_c(TypeTag<__nv_bfloat16>{});
  else by_c(TypeTag<__half>{});
}

}  // namespace dfgnn
