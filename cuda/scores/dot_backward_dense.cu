// Backward pass of dot-product attention over dense tiles (fp16 / bf16), the two
// launches of the tensor-core backward (dot_backward_mma.cu has the formulas) run
// as flash attention 2 runs its backward:
//   dq launch  (tile plan of the graph, blocks of 64 destination rows):
//     D = dO . O32 of the block's rows (into dsum for the dkv launch),
//     S = Q K^T, P = 2^(scale2 S - lse2) on edges, dP = dO V^T, dS = P (dP - D),
//     dQ = scale dS K; and each edge's (P, dS) into pds (CSR order);
//   dkv launch (tile plan of the transposed graph, blocks of 64 source rows):
//     S^T = K Q^T, P^T as above, dP^T = V dO^T, dS^T = P^T (dP^T - D),
//     dV = P^T dO, dK = scale dS^T Q.
//
// Why: on batch graphs (PATTERN-like: 1024 small graphs) the sparse walks gather
// a k, v (dq) or a q, dO (dkv) row per edge and are bound by L1 wavefronts, as
// the sparse forward was (dot_forward_dense.cu): bf16, 1 x 128, forward 0.09 ms,
// dq walk 0.49, dkv walk 0.43. The in-neighbours of 64 consecutive destination
// rows lie in a narrow window of source rows, and so do the out-neighbours of 64
// consecutive sources in a window of destinations (the transposed graph's tile
// plan, pyg_dfgnn/ops/tiles.py), so both launches are one kernel body over a
// block's "resident" rows X, Y (64 rows, in shared memory for the whole block)
// and "streamed" rows U, W (32 rows of the window per chunk, two cp.async
// buffers, the next loading while this one is computed):
//   dq:  X = q, Y = dO, U = k, W = v;   dkv: X = k, Y = v, U = q, W = dO,
// per warp (16 resident rows) and chunk: S = X U^T and dP = Y W^T (mma.m16n8k16,
// operands by ldmatrix from swizzled shared memory), P and dS in fp32 from the
// masks, lse2 and D (the dq launch's per resident row, in registers; the dkv
// launch's per streamed row, copied with the chunk), then the SpMMs with P, dS
// rounded to T as A fragments (the accumulators' layout) and U, W by
// ldmatrix.trans: acc1 += dS U (dQ / dK), and in the dkv launch acc2 += P W (dV).
// The resident rows sit in shared memory rather than registers: with both
// accumulators (2 x 64 floats per lane at C = 128) they would not fit.
// No online softmax (lse2 and D are known) and no partials: each block writes
// its rows whole, no atomics (deterministic).
// Blocks the plan cannot run dense (window too wide or sparse, duplicate edges)
// run the sparse units of the tensor-core walks (dot_backward_mma.cuh) in the
// same launch. The dkv launch recomputes P and dS; only its sparse units read
// pds, which the dq launch therefore writes for every edge, dense blocks
// included: an edge's CSR position is its row's first edge plus its rank among
// the row's edges ordered by source (its bit's rank in the row's masks), mapped
// through rank_pos where the layout's CSR rows are not sorted by source.
// Where every block of the transposed plan that has edges has a window (batch
// graphs), the plan saves no weights (save_weights = 0, pds null): the dkv
// launch then runs every such block dense whatever its cells per edge, and the
// dq launch writes nothing per edge. Those writes, one 8-byte store per edge
// and head behind a gather of rank_pos, cost more than the dq launch's
// matrix products (bf16 PATTERN-like batch, 4 x 32: the dq launch 1.26 ms with
// them, 0.26 ms without).
#include <c10/cuda/CUDAFunctions.h>

#include <atomic>
#include <cfloat>
#include <string>

#include "device/mma.cuh"
#include "host/dispatch.cuh"
#include "host/ops.h"
#include "scores/dot_backward_mma.cuh"
#include "scores/dot_dense.cuh"
#include "scores/dot_host.h"

namespace dfgnn {
namespace {

// One launch's arguments (both launches take the same; each reads its part).
template <typename T> struct DenseBwd {
  const T *dout, *q, *k, *v;
  const float* lse2;          // [N_dst, H]
  const float* out32;         // [N_dst, H, C], the forward's fp32 rows (dq launch)
  float* dsum;                // [N_dst, H] D: written by the dq launch, read by the dkv one
  const int *rowptr, *col;    // CSR (dq launch)
  const int *colptr, *row, *perm;  // CSC (dkv launch's sparse units)
  const int* rank_pos;        // nullable: identity
  const int* plan;            // the launch's tile plan
  int64_t plan_len;
  T *dq, *dk, *dv;
  int64_t ld_q, ld_kv;        // row strides of dq and of dk, dv
  float2* pds;                // [E, H] (P, dS), CSR order
  int64_t n_dst, n_src;
  int H;
  float scale, scale2, cells_per_edge;
};

// Block (blockIdx.x, blockIdx.y) of the launch: resident rows [64 b, 64 b + 64)
// of head blockIdx.y. One head per block: each head's pass is a chain of
// dependent copies (resident rows, then each chunk), and a block walking all H
// heads would wait H chains long (bf16 PATTERN-like batch, both launches: 0.412
// ms against 0.482 at 2 x 64, 0.530 against 0.585 at 4 x 32). KV: the dkv launch.
template <typename T, int C, bool KV>
__device__ __forceinline__ void dense_bwd_block(const DenseBwd<T>& a) {
  constexpr int RB = C * 2;    // bytes of a shared-memory row
  constexpr int NX = RB / 16;  // 16-byte chunks per row
  constexpr int KS = C / 16;   // k-steps of S and dP = 16-channel blocks of the SpMMs
  constexpr int kRes = kDenseRows * RB;  // one resident tile
  constexpr int kStr = kDenseKeys * RB;  // one streamed chunk
  // A buffer: the chunk's U and W rows, then (dkv) their lse2 and D.
  constexpr int kBuf = 2 * kStr + (KV ? 2 * kDenseKeys * 4 : 0);
  extern __shared__ __align__(16) unsigned char smem[];
  const unsigned xs = smem_addr(smem), ys = xs + kRes, bs = xs + 2 * kRes;

  const T* X = KV ? a.k : a.q;
  const T* Y = KV ? a.v : a.dout;
  const T* U = KV ? a.q : a.k;
  const T* W = KV ? a.dout : a.v;
  const int64_t n_res = KV ? a.n_src : a.n_dst, n_str = KV ? a.n_dst : a.n_src;
  const int H = a.H;
  const int64_t HC = (int64_t)H * C;
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, t = lane & 3;
  const int64_t r0 = (int64_t)blockIdx.x * kDenseRows;
  const int h = blockIdx.y;
  const int nrows = (int)min((int64_t)kDenseRows, n_res - r0);

  // The block's plan entry (dense_entry says what it holds and checks).
  const DenseEntry tile = dense_entry(a.plan, a.plan_len, n_str, nrows, a.cells_per_edge, warp);
  if (!tile.dense) {  // block-uniform: the sparse units of 8 rows, two per warp
    for (int u = 0; u < 2; ++u) {
      const int64_t blk = r0 / kMmaRows + 2 * warp + u;
      if (blk * kMmaRows >= n_res) break;
      if constexpr (KV)
        gt_dkv_mma_unit<T, C>(a.dout, a.q, a.pds, a.colptr, a.row, a.perm, a.dk, a.dv,
                              a.ld_kv, a.n_src, H, a.scale, blk * H + h);
      else
        gt_dq_mma_unit<T, C>(a.dout, a.q, a.k, a.v, a.lse2, a.out32, a.dsum, a.rowptr, a.col,
                             a.dq, a.ld_q, a.pds, a.n_dst, H, a.scale, a.scale2, blk * H + h);
    }
    return;
  }
  const int lo = tile.lo, hi = tile.lo + tile.width - 1;

  // Streamed rows lo + 32 ci + [0, 32) of head h into buffer b (zeros past hi);
  // the dkv launch's lse2 and D of those rows after them.
  auto issue = [&](int ci, int b) {
    const unsigned ub = bs + b * kBuf;
    copy_rows<T, C, kDenseKeys>(ub, ub + kStr, U, W, lo + ci * kDenseKeys, hi + 1, HC,
                                (int64_t)h * C);
    if constexpr (KV) {
      if (tid < 2 * kDenseKeys) {
        const int key2 = lo + ci * kDenseKeys + (tid & (kDenseKeys - 1));
        const bool ok = key2 <= hi;
        const float* src = tid < kDenseKeys ? a.lse2 : a.dsum;
        cp_async4(bs + b * kBuf + 2 * kStr + 4 * tid,
                  src + (ok ? (int64_t)key2 * H + h : 0), ok);
      }
    }
    cp_async_commit();
  };

  const int mi = lane >> 3, mr = lane & 7;  // ldmatrix: matrix and row this lane addresses
  const int row_a = 16 * warp + g, row_b = row_a + 8;  // this lane's rows in the block
  const int64_t ga = r0 + row_a, gb = r0 + row_b;
  const bool ok_a = ga < n_res, ok_b = gb < n_res;
  // This lane's A-fragment row of the resident tiles (ldmatrix, matrices
  // rows 0-7 | 8-15 x channels 0-7 | 8-15 of the warp's 16 rows).
  const int xrow = 16 * warp + mr + 8 * (mi & 1);
  // dq: the CSR position of the rows' first edges (pds).
  const int e_a = !KV && ok_a ? __ldg(a.rowptr + ga) : 0;
  const int e_b = !KV && ok_b ? __ldg(a.rowptr + gb) : 0;
  // Resident rows of head h (zeros past the end); committed with the first chunk.
  copy_rows<T, C, kDenseRows>(xs, ys, X, Y, r0, n_res, HC, (int64_t)h * C);
  issue(tile.first, 0);
  // dq: lse2 and D of rows a, b (used only where the row has an edge). D = dO .
  // O32 over the quad's lanes (quad_dsum) while the copies are in flight, and
  // into dsum for the dkv launch: no launch of its own reads dO and O32 again.
  float La = 0.f, Lb = 0.f, Da = 0.f, Db = 0.f;
  if constexpr (!KV) {
    const int64_t off_a = ga * HC + (int64_t)h * C, off_b = gb * HC + (int64_t)h * C;
    uint32_t w[KS][2];
    load_b_frags<T, C>(a.dout + off_a, ok_a, t, w);
    Da = quad_dsum<T, C>(w, a.out32 + off_a, ok_a, t);
    load_b_frags<T, C>(a.dout + off_b, ok_b, t, w);
    Db = quad_dsum<T, C>(w, a.out32 + off_b, ok_b, t);
    if (t == 0) {
      if (ok_a) a.dsum[ga * H + h] = Da;
      if (ok_b) a.dsum[gb * H + h] = Db;
    }
    if (ok_a) La = __ldg(a.lse2 + ga * H + h);
    if (ok_b) Lb = __ldg(a.lse2 + gb * H + h);
  }
  int rank_a = 0, rank_b = 0;  // dq: the rows' edges in earlier chunks

  float acc1[2 * KS][4];              // dQ / dK: 8-channel tiles of rows a (0, 1), b (2, 3)
  float acc2[KV ? 2 * KS : 1][4];     // dV
#pragma unroll
  for (int b = 0; b < 2 * KS; ++b) acc1[b][0] = acc1[b][1] = acc1[b][2] = acc1[b][3] = 0.f;
#pragma unroll
  for (int b = 0; b < (KV ? 2 * KS : 1); ++b)
    acc2[b][0] = acc2[b][1] = acc2[b][2] = acc2[b][3] = 0.f;

  // Chunk ci with the edge masks ma, mb: bit j is the pair (row_a (row_b),
  // streamed row lo + 32 ci + j); rows past the end have none.
  walk_chunks(tile, a.plan, row_a, row_b, [&](int ci, int b) { issue(ci, b); },
              [&](int ci, int buf, unsigned ma, unsigned mb) {
    if ((tile.chunks >> ci) & 1u) {  // warp-uniform
      const unsigned ubuf = bs + buf * kBuf, wbuf = ubuf + kStr;
      // s (S) and d (dP): rows a, b x streamed rows 8 n + 2t, + 1 of the chunk.
      float s[4][4], d[4][4];
#pragma unroll
      for (int n = 0; n < 4; ++n)
#pragma unroll
        for (int e = 0; e < 4; ++e) s[n][e] = d[n][e] = 0.f;
#pragma unroll
      for (int ks = 0; ks < KS; ++ks) {
        uint32_t xa[4], ya[4];
        ldsm_x4(xa, xs + swizzle<NX>(xrow, 2 * ks + (mi >> 1)));
        ldsm_x4(ya, ys + swizzle<NX>(xrow, 2 * ks + (mi >> 1)));
#pragma unroll
        for (int kb = 0; kb < 2; ++kb) {
          uint32_t b[4];
          const int key = 16 * kb + mr + 8 * (mi >> 1);
          ldsm_x4(b, ubuf + swizzle<NX>(key, 2 * ks + (mi & 1)));
          mma_16816<T>(s[2 * kb], xa[0], xa[1], xa[2], xa[3], b[0], b[1]);
          mma_16816<T>(s[2 * kb + 1], xa[0], xa[1], xa[2], xa[3], b[2], b[3]);
          ldsm_x4(b, wbuf + swizzle<NX>(key, 2 * ks + (mi & 1)));
          mma_16816<T>(d[2 * kb], ya[0], ya[1], ya[2], ya[3], b[0], b[1]);
          mma_16816<T>(d[2 * kb + 1], ya[0], ya[1], ya[2], ya[3], b[2], b[3]);
        }
      }
      // P and dS in fp32 where the pair is an edge, else 0 (selected, not
      // multiplied: lse2 is -inf on rows without edges, and the streamed
      // rows past the window are zeros).
      const float* ld_s = reinterpret_cast<const float*>(smem + 2 * kRes + buf * kBuf + 2 * kStr);
#pragma unroll
      for (int n = 0; n < 4; ++n) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int j = 8 * n + 2 * t + (e & 1);
          const bool bit = (((e < 2 ? ma : mb) >> j) & 1u) != 0u;
          float L, Dv;
          if constexpr (KV) {
            L = ld_s[j];
            Dv = ld_s[kDenseKeys + j];
          } else {
            L = e < 2 ? La : Lb;
            Dv = e < 2 ? Da : Db;
          }
          const float p = bit ? fast_exp2(s[n][e] * a.scale2 - L) : 0.f;
          const float ds = bit ? p * (d[n][e] - Dv) : 0.f;
          s[n][e] = p;
          d[n][e] = ds;
          if constexpr (!KV) {
            // The edge's CSR position: its rank among its row's edges by source.
            if (bit && a.pds != nullptr) {
              const unsigned m = e < 2 ? ma : mb;
              int pos = (e < 2 ? e_a + rank_a : e_b + rank_b) + __popc(m & ((1u << j) - 1u));
              if (a.rank_pos != nullptr) pos = __ldg(a.rank_pos + pos);
              a.pds[(int64_t)pos * H + h] = make_float2(p, ds);
            }
          }
        }
      }
      // The SpMMs: dS (and P) as A fragments, U (and W) rows by ldmatrix.trans.
      chunk_spmm<T, C>(acc1, d, ubuf, lane);
      if constexpr (KV) chunk_spmm<T, C>(acc2, s, wbuf, lane);
    }
    if constexpr (!KV) {
      rank_a += __popc(ma);
      rank_b += __popc(mb);
    }
  });  // every buffer, the resident rows included, is free again

  // The rows: dQ = scale acc1 (dq); dK = scale acc1, dV = acc2 (dkv).
  T* out1 = KV ? a.dk : a.dq;
  const int64_t ld = KV ? a.ld_kv : a.ld_q;
  const int64_t ch0 = (int64_t)h * C;
#pragma unroll
  for (int b = 0; b < 2 * KS; ++b) {
    const int64_t c = ch0 + 8 * b + 2 * t;
    if (ok_a)
      *reinterpret_cast<uint32_t*>(out1 + ga * ld + c) =
          pack2<T>(acc1[b][0] * a.scale, acc1[b][1] * a.scale);
    if (ok_b)
      *reinterpret_cast<uint32_t*>(out1 + gb * ld + c) =
          pack2<T>(acc1[b][2] * a.scale, acc1[b][3] * a.scale);
    if constexpr (KV) {
      if (ok_a)
        *reinterpret_cast<uint32_t*>(a.dv + ga * ld + c) = pack2<T>(acc2[b][0], acc2[b][1]);
      if (ok_b)
        *reinterpret_cast<uint32_t*>(a.dv + gb * ld + c) = pack2<T>(acc2[b][2], acc2[b][3]);
    }
  }
}

// Blocks per SM that the register budget is cut for. A block's pass is a chain
// of dependent copies and small products, so more resident blocks hide more of it:
// at C = 32 and 64, 5 and 4 blocks cost a few spilled bytes and take the backward
// from 0.533 to 0.451 ms (PATTERN-like batch, bf16, 4 x 32) and from 0.414 to
// 0.341 (2 x 64); cut for 2 blocks, the dkv launch took 136 and 185 registers
// (3 and 2 resident blocks). At C = 128 the dkv launch's accumulators alone take
// 128 registers: 2 blocks (cut for 3 it spills 380 bytes). The dq launch holds one
// accumulator: cut for 3 blocks (shared memory allows 3 of 64 KB) it spills 132
// bytes where it used 228 registers at 2 blocks and ran at 12.5 % occupancy.
template <int C, bool KV> constexpr int dense_bwd_min_blocks() {
  return C <= 32 ? 5 : C <= 64 ? 4 : KV ? 2 : 3;
}

// Two kernels of one body, so that a profile names the launches apart.
template <typename T, int C>
__global__ void __launch_bounds__(kDenseThreads, dense_bwd_min_blocks<C, false>())
    gt_bwd_dq_dense_kernel(const DenseBwd<T> a) {
  dense_bwd_block<T, C, false>(a);
}
template <typename T, int C>
__global__ void __launch_bounds__(kDenseThreads, dense_bwd_min_blocks<C, true>())
    gt_bwd_dkv_dense_kernel(const DenseBwd<T> a) {
  dense_bwd_block<T, C, true>(a);
}

template <int C, typename T> constexpr int dense_bwd_smem(bool kv) {
  return 2 * kDenseRows * C * (int)sizeof(T) +
         2 * (2 * kDenseKeys * C * (int)sizeof(T) + (kv ? 2 * kDenseKeys * 4 : 0));
}

template <bool KV>
void launch_dense_bwd(const at::Tensor& grad_out, const at::Tensor& q, const at::Tensor& k,
                      const at::Tensor& v, const at::Tensor& lse2, const float* out32,
                      float* dsum, float* pds, const LayoutView& L, double cells_per_edge,
                      at::Tensor* dq, at::Tensor* dk, at::Tensor* dv, double scale) {
  const int64_t n_dst = q.size(0), n_src = k.size(0), H = q.size(1), C = q.size(2);
  const int64_t n_res = KV ? n_src : n_dst;
  if (n_res == 0) return;
  TORCH_CHECK(H <= 65535, "dfgnn::attention_bwd (dot): the dense tiles take at most 65535 heads "
              "(a grid dimension), got " + std::to_string(H));
  const at::Tensor& plan = KV ? L.tiles_t : L.tiles;
  auto stream = c10::cuda::getCurrentCUDAStream();
  auto by_shape = [&](auto T_) {
    using T = typename decltype(T_)::type;
    DenseBwd<T> a{};
    a.dout = cptr<T>(grad_out);
    a.q = cptr<T>(q);
    a.k = cptr<T>(k);
    a.v = cptr<T>(v);
    a.lse2 = lse2.data_ptr<float>();
    a.out32 = out32;
    a.dsum = dsum;
    a.rowptr = L.rowptr.data_ptr<int>();
    a.col = L.col.data_ptr<int>();
    a.colptr = L.colptr.data_ptr<int>();
    a.row = L.row.data_ptr<int>();
    a.perm = L.perm.data_ptr<int>();
    a.rank_pos = L.rank_pos.defined() ? L.rank_pos.data_ptr<int>() : nullptr;
    a.plan = plan.data_ptr<int>();
    a.plan_len = plan.numel();
    a.pds = reinterpret_cast<float2*>(pds);
    if constexpr (KV) {
      a.dk = mptr<T>(*dk);
      a.dv = mptr<T>(*dv);
      a.ld_kv = dk->stride(0);
    } else {
      a.dq = mptr<T>(*dq);
      a.ld_q = dq->stride(0);
    }
    a.n_dst = n_dst;
    a.n_src = n_src;
    a.H = (int)H;
    a.scale = (float)scale;
    a.scale2 = (float)(scale * kLog2e);
    // No saved weights: the dkv launch's blocks with a window all run dense (a
    // block's cells per edge never exceed this bound), as its sparse units
    // would have nothing to read.
    a.cells_per_edge = KV && pds == nullptr ? FLT_MAX : (float)cells_per_edge;
    auto launch = [&](auto C_) {
      constexpr int kC = decltype(C_)::value;
      constexpr int kSmem = dense_bwd_smem<kC, T>(KV);
      auto kern = KV ? gt_bwd_dkv_dense_kernel<T, kC> : gt_bwd_dq_dense_kernel<T, kC>;
      // Above 48 KB (C = 128: 64 KB) the kernel opts in to more dynamic shared
      // memory, once per device (the attribute lives in the device's context; a
      // driver call on every call would lengthen the host-bound small-graph path).
      if constexpr (kSmem > 48 * 1024) {
        static std::atomic<uint64_t> opted{0};  // bit d: done on device d
        const int dev = c10::cuda::current_device();
        if (dev >= 64 || !((opted.load() >> dev) & 1u)) {
          C10_CUDA_CHECK(cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                              kSmem));
          if (dev < 64) opted.fetch_or(uint64_t{1} << dev);
        }
      }
      const dim3 grid((unsigned)ceil_div(n_res, kDenseRows), (unsigned)H);
      kern<<<grid, kDenseThreads, kSmem, stream>>>(a);
      check_launch();
    };
    if (C == 128) launch(IntC<128>{});
    else if (C == 64) launch(IntC<64>{});
    else launch(IntC<32>{});
  };
  if (q.scalar_type() == at::kBFloat16) by_shape(TypeTag<__nv_bfloat16>{});
  else by_shape(TypeTag<__half>{});
}

}  // namespace

void gt_backward_dq_dense(const at::Tensor& grad_out, const at::Tensor& q, const at::Tensor& k,
                          const at::Tensor& v, const at::Tensor& lse2, const float* out32,
                          float* dsum, const LayoutView& L, double cells_per_edge,
                          at::Tensor& dq, float* pds, double scale) {
  TORCH_CHECK((out32 != nullptr && dsum != nullptr) || q.size(0) == 0,
              "dfgnn::attention_bwd (dot): the dense-tile dq launch needs the forward's "
              "float32 rows and room for D");
  launch_dense_bwd<false>(grad_out, q, k, v, lse2, out32, dsum, pds, L, cells_per_edge, &dq,
                          nullptr, nullptr, scale);
}

void gt_backward_dkv_dense(const at::Tensor& grad_out, const at::Tensor& q, const at::Tensor& k,
                           const at::Tensor& v, const at::Tensor& lse2, const float* dsum,
                           const float* pds, const LayoutView& L, double cells_per_edge,
                           at::Tensor& dk, at::Tensor& dv, double scale) {
  TORCH_CHECK(dsum != nullptr || q.size(0) == 0,
              "dfgnn::attention_bwd (dot): the dense-tile dkv launch needs D in fp32");
  launch_dense_bwd<true>(grad_out, q, k, v, lse2, nullptr, const_cast<float*>(dsum),
                         const_cast<float*>(pds), L, cells_per_edge, nullptr, &dk, &dv, scale);
}

}  // namespace dfgnn
