// Shared-memory building blocks of the dot score's dense-tile kernels, the
// forward (dot_forward_dense.cu, where the design is described) and the
// backward (dot_backward_dense.cu): the block shape, cp.async copies, ldmatrix
// loads and the swizzle of 16-byte pieces that keeps ldmatrix free of bank
// conflicts. One header, so that both files build in one translation unit
// (setup.py, UNITY_GROUPS) without defining these twice.
#pragma once

#include <cstdint>

#include "device/mma.cuh"
#include "host/ops.h"

namespace dfgnn {

constexpr int kDenseRows = kTileRows;  // rows per block (4 warps x 16)
constexpr int kDenseThreads = 128;
constexpr int kDenseKeys = 32;       // keys per shared-memory chunk (two buffers)
constexpr int kDenseMaxWidth = 512;  // widest key window run dense
constexpr int kMaxChunks = kDenseMaxWidth / kDenseKeys;  // 16 chunk bits per warp in the plan

__device__ __forceinline__ unsigned smem_addr(const void* p) {
  return (unsigned)__cvta_generic_to_shared(p);
}

// 16 bytes global -> shared, zero-filled when !valid (src is then not read).
__device__ __forceinline__ void cp_async16(unsigned dst, const void* src, bool valid) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src),
               "r"(valid ? 16 : 0));
}
// 4 bytes global -> shared, zero-filled when !valid.
__device__ __forceinline__ void cp_async4(unsigned dst, const void* src, bool valid) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(dst), "l"(src),
               "r"(valid ? 4 : 0));
}
__device__ __forceinline__ void cp_async_commit() {
  asm volatile("cp.async.commit_group;\n" ::: "memory");
}
// Waits until at most N committed groups of this thread are still in flight.
template <int N> __device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

__device__ __forceinline__ void ldsm_x4(uint32_t (&r)[4], unsigned addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}
__device__ __forceinline__ void ldsm_x4_trans(uint32_t (&r)[4], unsigned addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}

// Byte offset of 16-byte chunk x of row r in a tile of NX chunks per row. An
// ldmatrix reads one chunk column of 8 consecutive rows; the XOR spreads those
// over the 8 distinct 16-byte bank groups (rows of 128 bytes or more: x ^ r;
// rows of 64 bytes, two per 128-byte line: x ^ (r / 2)).
template <int NX> __device__ __forceinline__ int swizzle(int r, int x) {
  static_assert(NX == 4 || NX % 8 == 0, "rows of 64 or a multiple of 128 bytes");
  static_assert(kDenseThreads % (8 * NX) == 0, "a copy pass keeps each thread's swizzle");
  const int pos = NX == 4 ? x ^ ((r >> 1) & 3) : x ^ (r & 7);
  return (r * NX + pos) * 16;
}

// Rows row0 + [0, ROWS) of x0 and x1 (C elements from col0 of each, rows HC
// elements apart; zeros from row `end` on) into tiles at shared addresses s0
// and s1, swizzled, by cp.async (not committed). A pass of the block copies
// kDenseThreads / (C / 8) whole rows; this thread's piece of row pr + j pass
// lands at the same swizzled column in every pass.
template <typename T, int C, int ROWS>
__device__ __forceinline__ void copy_rows(unsigned s0, unsigned s1, const T* __restrict__ x0,
                                          const T* __restrict__ x1, int64_t row0, int64_t end,
                                          int64_t HC, int64_t col0) {
  constexpr int NX = C / 8, RB = C * 2, kPass = kDenseThreads / NX;
  const int px = threadIdx.x % NX, pr = threadIdx.x / NX;
  const int pd = swizzle<NX>(pr, px);
  const int64_t base = (row0 + pr) * HC + col0 + 8 * px;
#pragma unroll
  for (int j = 0; j < ROWS / kPass; ++j) {
    const bool ok = row0 + pr + j * kPass < end;
    const int64_t off = ok ? base + (int64_t)j * kPass * HC : 0;
    cp_async16(s0 + pd + j * kPass * RB, x0 + off, ok);
    cp_async16(s1 + pd + j * kPass * RB, x1 + off, ok);
  }
}

// acc [16 rows x C] += W [16 rows x 32 keys] V [32 keys x C] for the calling
// warp: W in the layout of an S accumulator (w[n]: rows g, g + 8 x keys 8 n + 2t,
// + 1), rounded to T as A fragments; V the chunk at shared address vbuf (32 rows
// of C / 8 swizzled 16-byte pieces), by ldmatrix.trans. acc[b]: channels 8 b + 2t,
// + 1 of rows g (0, 1) and g + 8 (2, 3).
template <typename T, int C>
__device__ __forceinline__ void chunk_spmm(float (&acc)[C / 8][4], const float (&w)[4][4],
                                           unsigned vbuf, int lane) {
  const int mi = lane >> 3, mr = lane & 7;  // ldmatrix: matrix and row this lane addresses
#pragma unroll
  for (int kb = 0; kb < 2; ++kb) {
    const uint32_t a0 = pack2<T>(w[2 * kb][0], w[2 * kb][1]);
    const uint32_t a1 = pack2<T>(w[2 * kb][2], w[2 * kb][3]);
    const uint32_t a2 = pack2<T>(w[2 * kb + 1][0], w[2 * kb + 1][1]);
    const uint32_t a3 = pack2<T>(w[2 * kb + 1][2], w[2 * kb + 1][3]);
    const int key = 16 * kb + mr + 8 * (mi & 1);
#pragma unroll
    for (int cb = 0; cb < C / 16; ++cb) {
      uint32_t b[4];
      ldsm_x4_trans(b, vbuf + swizzle<C / 8>(key, 2 * cb + (mi >> 1)));
      mma_16816<T>(acc[2 * cb], a0, a1, a2, a3, b[0], b[1]);
      mma_16816<T>(acc[2 * cb + 1], a0, a1, a2, a3, b[2], b[3]);
    }
  }
}

// A block's entry of a tile plan (pyg_dfgnn/ops/tiles.py): window [lo, lo +
// width) of streamed rows (keys), 16 chunk bits per warp (chunks where its rows
// have an edge), the masks. Whatever the plan holds, a block reads only inside
// its inputs and the plan: a window outside the n_keys streamed rows or masks
// past plan_len send it to the sparse units (dense false), as does a window of
// more than cells_per_edge cells per edge.
struct DenseEntry {
  int lo, width, first;      // first: the first chunk with an edge
  int moff;  // the masks: bit j of plan word moff + 64 c + r is (row r, key lo + 32 c + j)
  unsigned any_chunks;       // chunks where one of the block's rows has an edge
  unsigned chunks;           // ... one of this warp's rows
  bool dense;
};

__device__ __forceinline__ DenseEntry dense_entry(const int* __restrict__ plan, int64_t plan_len,
                                                  int64_t n_keys, int nrows,
                                                  float cells_per_edge, int warp) {
  const int4* meta = reinterpret_cast<const int4*>(plan + (int64_t)kTileMetaInts * blockIdx.x);
  const int4 meta0 = __ldg(meta), meta1 = __ldg(meta + 1);
  DenseEntry e;
  e.lo = meta0.x;
  e.width = meta0.y;
  const int n_edges = meta0.z, moff = meta0.w;
  const int n_chunks = (e.width + kDenseKeys - 1) / kDenseKeys;
  const unsigned valid = (1u << max(0, min(n_chunks, kMaxChunks))) - 1u;
  const unsigned w01 = (unsigned)meta1.x, w23 = (unsigned)meta1.y;
  e.any_chunks = (w01 | (w01 >> 16) | w23 | (w23 >> 16)) & valid;
  e.chunks = ((warp < 2 ? w01 : w23) >> (16 * (warp & 1))) & valid;
  e.first = __ffs(e.any_chunks) - 1;
  e.moff = moff;
  e.dense = e.lo >= 0 && e.width > 0 && e.width <= kDenseMaxWidth && n_edges > 0 &&
            (int64_t)e.lo + e.width <= n_keys && moff >= 0 &&
            (int64_t)moff + (int64_t)n_chunks * kDenseRows <= plan_len && e.any_chunks &&
            (float)nrows * (float)e.width <= cells_per_edge * (float)n_edges;
  return e;
}

// The chunks with edges of a dense block, in order, chunk ci in buffer buf
// while the next one (and its masks) loads into the other: issue(ci, b) starts
// chunk ci's copies into buffer b as one cp.async group; body(ci, buf, ma, mb)
// computes chunk ci with the masks of this lane's rows row_a, row_b (`plan`: the
// tile plan e came from). The caller
// has issued the first chunk into buffer 0; every buffer is free on return.
template <typename Issue, typename Body>
__device__ __forceinline__ void walk_chunks(const DenseEntry& e, const int* __restrict__ plan,
                                            int row_a, int row_b, Issue&& issue, Body&& body) {
  const unsigned* masks = reinterpret_cast<const unsigned*>(plan) + e.moff;
  unsigned ma = __ldg(masks + e.first * kDenseRows + row_a);
  unsigned mb = __ldg(masks + e.first * kDenseRows + row_b);
  int ci = e.first, buf = 0;
  unsigned rest = e.any_chunks & (e.any_chunks - 1u);
  unsigned na = 0u, nb = 0u;
  while (true) {
    const int nxt = rest ? __ffs(rest) - 1 : -1;
    rest &= rest - 1;
    if (nxt >= 0) {
      issue(nxt, buf ^ 1);
      na = __ldg(masks + nxt * kDenseRows + row_a);
      nb = __ldg(masks + nxt * kDenseRows + row_b);
      cp_async_wait<1>();
    } else {
      cp_async_wait<0>();
    }
    __syncthreads();  // chunk ci is in buffer buf for every warp
    body(ci, buf, ma, mb);
    __syncthreads();  // buffer buf is free for the next issue
    if (nxt < 0) break;
    ci = nxt;
    buf ^= 1;
    ma = na;
    mb = nb;
  }
}

}  // namespace dfgnn
