// Forward pass of dot-product attention over dense tiles (fp16 / bf16):
//   out_i = sum_{j -> i} softmax_j(scale * q_i . k_j) * v_j      (paper eq. 1-2)
//
// Why: on the batch graphs (PATTERN-, CLUSTER-, MNIST-like: 1024 small graphs, one
// after the other) the sparse tensor-core forward (dot_forward_mma.cu) gathers a k
// and a v row per edge and is bound by L1 wavefronts: PATTERN's 6 M edges move
// 3.1 GB through L1. But the in-neighbours of 64
// consecutive destination rows there lie in a window of a few hundred consecutive
// source rows (their graphs), and 30-40 % of a PATTERN or CLUSTER graph's node
// pairs are edges.
// So a block of 64 rows loads its window's k and v rows once, 32 keys at a time,
// into shared memory (coalesced cp.async into two buffers, the next chunk loading
// while this one is computed; 16-byte pieces swizzled against bank conflicts), and
// computes the whole tile as flash attention does:
//   SDDMM  S[16 rows x 32 keys] = Q K^T per warp (mma.m16n8k16, operands by ldmatrix),
//   mask   S kept where the (row, key) pair is an edge, -inf elsewhere,
//   SpMM   O[16 x C] += P V (P rounded to T, fp32 accumulation),
// with an online softmax per row (base 2). The window and the edge masks (a bit
// per (row, key) pair, a word per row and 32-key chunk) come from the layout's
// tile plan (pyg_dfgnn/ops/tiles.py), built once per graph: finding each block's
// window and building a count table in shared memory on every call put a chain
// of dependent loads and three barriers before the first chunk (PATTERN 0.142 ->
// 0.090 ms with the plan).
// A block's first q loads go out before its plan entry, so only the plan entry
// and the first chunk are on the way to its first tile.
// A warp skips the chunks where none of its 16 rows has an edge, the block those
// where none of its 64 rows has. The tensor cores do about 64 W / E_b times the
// useful work (W the window, E_b the block's edges), so a block runs dense only
// where the plan has it (W <= 512, no duplicate edge) and that ratio is at most
// `cells_per_edge`; the other blocks run the sparse units of dot_forward_mma.cu in
// the same launch. Heads: one head per block (blockIdx.y), each block reading the
// masks: a head's pass is a chain of dependent loads (q, the plan entry, each
// chunk), and a block walking all H heads would wait H chains long (PATTERN-like,
// 4 x 32: 0.117 ms against 0.128; 2 or 4 heads per pass take more registers and
// spill).
// As in the sparse kernel, a non-finite v row of the window makes the rows of its
// block non-finite even where it is no neighbour (0 * inf in the product).
#include <string>

#include "device/mma.cuh"
#include "host/dispatch.cuh"
#include "host/ops.h"
#include "scores/dot_dense.cuh"
#include "scores/dot_host.h"
#include "scores/dot_mma.cuh"

namespace dfgnn {
namespace {

// Rows [r0, r0 + 64) of n_rows, head blockIdx.y of H, C channels per head.
// `plan`: the layout's tile plan (pyg_dfgnn/ops/tiles.py), kTileMetaInts ints per
// block, then the blocks' edge masks; plan_len ints in all.
template <typename T, int C>
__global__ void __launch_bounds__(kDenseThreads, 3)
gt_fwd_dense_kernel(const T* __restrict__ q, const T* __restrict__ k, const T* __restrict__ v,
                    const int* __restrict__ rowptr, const int* __restrict__ col,
                    const int* __restrict__ plan, int64_t plan_len, T* __restrict__ out,
                    float* __restrict__ out32,
                    float* __restrict__ lse2, int64_t n_rows, int64_t n_src, int H,
                    float scale2, float cells_per_edge) {
  constexpr int RB = C * 2;     // bytes of a shared-memory row
  constexpr int NX = RB / 16;   // 16-byte chunks per row
  constexpr int KS = C / 16;    // k-steps of the SDDMM = 16-channel blocks of the SpMM
  constexpr int kBuf = 2 * kDenseKeys * RB;  // one k + v chunk
  extern __shared__ __align__(16) unsigned char smem[];
  const unsigned sbase = smem_addr(smem);   // chunk buffers b = 0, 1: k at b kBuf, v after it

  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, t = lane & 3;
  const int64_t r0 = (int64_t)blockIdx.x * kDenseRows;
  const int nrows = (int)min((int64_t)kDenseRows, n_rows - r0);

  // q of rows g, g + 8 (head h) as A fragments, straight from global memory:
  // qa[s] = rows g | g + 8 x channels 16 s + 2t (+ 8). The loads go out first,
  // before the plan entry they do not depend on.
  const int h = blockIdx.y;
  const int64_t HC = (int64_t)H * C;
  const int64_t ga = r0 + 16 * warp + g, gb = ga + 8;
  uint32_t qa[KS][4];
  {
    const uint32_t* qr_a = reinterpret_cast<const uint32_t*>(q + ga * HC + (int64_t)h * C) + t;
    const uint32_t* qr_b = reinterpret_cast<const uint32_t*>(q + gb * HC + (int64_t)h * C) + t;
    const bool ok_a = ga < n_rows, ok_b = gb < n_rows;
#pragma unroll
    for (int s = 0; s < KS; ++s) {
      qa[s][0] = ok_a ? __ldg(qr_a + 8 * s) : 0u;
      qa[s][1] = ok_b ? __ldg(qr_b + 8 * s) : 0u;
      qa[s][2] = ok_a ? __ldg(qr_a + 8 * s + 4) : 0u;
      qa[s][3] = ok_b ? __ldg(qr_b + 8 * s + 4) : 0u;
    }
  }
  // The block's plan entry (dense_entry says what it holds and checks).
  const DenseEntry e = dense_entry(plan, plan_len, n_src, nrows, cells_per_edge, warp);
  if (!e.dense) {  // block-uniform: the sparse units of 8 rows, two per warp
    for (int u = 0; u < 2; ++u) {
      const int64_t blk = r0 / kMmaRows + 2 * warp + u;
      if (blk * kMmaRows >= n_rows) break;
      gt_mma_unit<T, C>(q, k, v, rowptr, col, out, out32, lse2, n_rows, H, scale2, blk, h);
    }
    return;
  }
  const int lo = e.lo, hi = e.lo + e.width - 1;

  // k and v rows lo + 32 ci + [0, 32) of head h into buffer b (zeros past hi).
  auto issue = [&](int ci, int b) {
    const unsigned kb = sbase + b * kBuf;
    copy_rows<T, C, kDenseKeys>(kb, kb + kDenseKeys * RB, k, v, lo + ci * kDenseKeys, hi + 1,
                                HC, (int64_t)h * C);
    cp_async_commit();
  };
  issue(e.first, 0);

  const int mi = lane >> 3, mr = lane & 7;  // ldmatrix: matrix and row this lane addresses
  const int row_a = 16 * warp + g, row_b = row_a + 8;  // this lane's rows in the block
  const int64_t ch0 = (int64_t)h * C;

  float acc[2 * KS][4];  // 8-channel tiles of rows g (0, 1) and g + 8 (2, 3)
#pragma unroll
  for (int b = 0; b < 2 * KS; ++b) acc[b][0] = acc[b][1] = acc[b][2] = acc[b][3] = 0.f;
  float m0 = kNegInf, m1 = kNegInf, l0 = 0.f, l1 = 0.f;  // rows g, g + 8 (l: lane partial)

  // Chunk ci with the edge masks ma, mb: bit j is the pair (row_a (row_b), key
  // lo + 32 ci + j); rows past the end have none.
  walk_chunks(e, plan, row_a, row_b, [&](int ci, int b) { issue(ci, b); },
              [&](int ci, int buf, unsigned ma, unsigned mb) {
    if ((e.chunks >> ci) & 1u) {  // warp-uniform
      const unsigned kbuf = sbase + buf * kBuf, vbuf = kbuf + kDenseKeys * RB;
      // SDDMM: s[n] = rows g, g + 8 x keys 8 n + 2t, + 1 of the chunk.
      float s[4][4];
#pragma unroll
      for (int n = 0; n < 4; ++n) s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.f;
#pragma unroll
      for (int ks = 0; ks < KS; ++ks) {
#pragma unroll
        for (int kb = 0; kb < 2; ++kb) {
          uint32_t b[4];
          const int key = 16 * kb + mr + 8 * (mi >> 1);
          ldsm_x4(b, kbuf + swizzle<NX>(key, 2 * ks + (mi & 1)));
          mma_16816<T>(s[2 * kb], qa[ks][0], qa[ks][1], qa[ks][2], qa[ks][3], b[0], b[1]);
          mma_16816<T>(s[2 * kb + 1], qa[ks][0], qa[ks][1], qa[ks][2], qa[ks][3], b[2], b[3]);
        }
      }
      // The lane's entries of tile n are keys 8 n + 2t, + 1: a pair that is no
      // edge gets score -inf, so weight 2^(-inf - base) = 0.
      float t0 = kNegInf, t1 = kNegInf;
#pragma unroll
      for (int n = 0; n < 4; ++n) {
        const int sh = 8 * n + 2 * t;
        s[n][0] = (ma >> sh) & 1u ? s[n][0] * scale2 : kNegInf;
        s[n][1] = (ma >> (sh + 1)) & 1u ? s[n][1] * scale2 : kNegInf;
        s[n][2] = (mb >> sh) & 1u ? s[n][2] * scale2 : kNegInf;
        s[n][3] = (mb >> (sh + 1)) & 1u ? s[n][3] * scale2 : kNegInf;
        t0 = fmaxf(t0, fmaxf(s[n][0], s[n][1]));
        t1 = fmaxf(t1, fmaxf(s[n][2], s[n][3]));
      }
#pragma unroll
      for (int o = 1; o < 4; o <<= 1) {  // the quad holds a row's 32 keys
        t0 = fmaxf(t0, __shfl_xor_sync(0xffffffffu, t0, o));
        t1 = fmaxf(t1, __shfl_xor_sync(0xffffffffu, t1, o));
      }
      const RaisedMax r = raise_max(m0, m1, t0, t1);
      const float base0 = r.base0, base1 = r.base1, c0 = r.c0, c1 = r.c1;
      float sum0 = 0.f, sum1 = 0.f;
#pragma unroll
      for (int n = 0; n < 4; ++n) {
        s[n][0] = fast_exp2(s[n][0] - base0);
        s[n][1] = fast_exp2(s[n][1] - base0);
        s[n][2] = fast_exp2(s[n][2] - base1);
        s[n][3] = fast_exp2(s[n][3] - base1);
        sum0 += s[n][0] + s[n][1];
        sum1 += s[n][2] + s[n][3];
      }
      l0 = l0 * c0 + sum0;
      l1 = l1 * c1 + sum1;
      if (__any_sync(0xffffffffu, r.rescale)) {
#pragma unroll
        for (int b = 0; b < 2 * KS; ++b) {
          acc[b][0] *= c0; acc[b][1] *= c0;
          acc[b][2] *= c1; acc[b][3] *= c1;
        }
      }
      // SpMM: P (the S accumulators are the A fragments' layout) times V.
      chunk_spmm<T, C>(acc, s, vbuf, lane);
    }
  });

  // Row sums over the quad, then out = acc / l and lse2 = m + log2(l).
  l0 += __shfl_xor_sync(0xffffffffu, l0, 1);
  l0 += __shfl_xor_sync(0xffffffffu, l0, 2);
  l1 += __shfl_xor_sync(0xffffffffu, l1, 1);
  l1 += __shfl_xor_sync(0xffffffffu, l1, 2);
  const float i0 = l0 > 0.f ? 1.f / l0 : 0.f, i1 = l1 > 0.f ? 1.f / l1 : 0.f;
#pragma unroll
  for (int b = 0; b < 2 * KS; ++b) {
    const int64_t c = ch0 + 8 * b + 2 * t;
    if (ga < n_rows)
      *reinterpret_cast<uint32_t*>(out + ga * HC + c) = pack2<T>(acc[b][0] * i0, acc[b][1] * i0);
    if (gb < n_rows)
      *reinterpret_cast<uint32_t*>(out + gb * HC + c) = pack2<T>(acc[b][2] * i1, acc[b][3] * i1);
    if (out32 != nullptr) {
      if (ga < n_rows)
        *reinterpret_cast<float2*>(out32 + ga * HC + c) =
            make_float2(acc[b][0] * i0, acc[b][1] * i0);
      if (gb < n_rows)
        *reinterpret_cast<float2*>(out32 + gb * HC + c) =
            make_float2(acc[b][2] * i1, acc[b][3] * i1);
    }
  }
  if (t == 0) {
    if (ga < n_rows) lse2[ga * H + h] = l0 > 0.f ? m0 + log2f(l0) : kNegInf;
    if (gb < n_rows) lse2[gb * H + h] = l1 > 0.f ? m1 + log2f(l1) : kNegInf;
  }
}

template <typename T, int C>
void launch_dense(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                  const at::Tensor& rowptr, const at::Tensor& col, const at::Tensor& plan,
                  at::Tensor& out, float* out32, at::Tensor& lse2, float scale2,
                  float cells_per_edge) {
  constexpr int kSmem = 2 * 2 * kDenseKeys * C * (int)sizeof(T);  // two k + v chunks
  static_assert(kSmem <= 48 * 1024, "no opt-in for more dynamic shared memory");
  const int64_t N = q.size(0);
  TORCH_CHECK(q.size(1) <= 65535, "dfgnn::attention_fwd (dot): the dense tiles take at most "
              "65535 heads (a grid dimension), got " + std::to_string(q.size(1)));
  gt_fwd_dense_kernel<T, C><<<dim3((unsigned)ceil_div(N, kDenseRows), (unsigned)q.size(1)),
                              kDenseThreads, kSmem,
                              c10::cuda::getCurrentCUDAStream()>>>(
      cptr<T>(q), cptr<T>(k), cptr<T>(v), rowptr.data_ptr<int>(), col.data_ptr<int>(),
      plan.data_ptr<int>(), plan.numel(), mptr<T>(out), out32, lse2.data_ptr<float>(), N,
      k.size(0),
      (int)q.size(1), scale2, cells_per_edge);
  check_launch();
}

}  // namespace

void gt_forward_dense(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                      const LayoutView& L, double cells_per_edge, at::Tensor& out,
                      float* out32, at::Tensor& lse2, double scale) {
  const at::Tensor &rowptr = L.rowptr, &col = L.col, &plan = L.tiles;
  const float cells = (float)cells_per_edge;
  const int64_t N = q.size(0), C = q.size(2);
  if (N == 0) return;
  const float scale2 = (float)(scale * kLog2e);
  auto by_shape = [&](auto T_) {
    using T = typename decltype(T_)::type;
    auto launch = [&](auto C_) {
      launch_dense<T, decltype(C_)::value>(q, k, v, rowptr, col, plan, out, out32, lse2, scale2,
                                           cells);
    };
    if (C == 128) launch(IntC<128>{});
    else if (C == 64) launch(IntC<64>{});
    else launch(IntC<32>{});
  };
  if (q.scalar_type() == at::kBFloat16) by_shape(TypeTag<__nv_bfloat16>{});
  else by_shape(TypeTag<__half>{});
}

}  // namespace dfgnn
