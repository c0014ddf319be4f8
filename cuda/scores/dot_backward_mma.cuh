// The dot score's sparse tensor-core backward units, shared by the tensor-core
// walks (dot_backward_mma.cu, where their design is described) and the blocks of
// the dense-tile backward that its plans send to them (dot_backward_dense.cu):
// a warp owns 8 consecutive rows (dq: destinations over the CSR; dkv: sources
// over the CSC) of one head and walks their edges 16 at a time.
#pragma once

#include <cstdint>

#include "device/mma.cuh"

namespace dfgnn {

// Where unit `unit` (8 rows, one head) of a walk over the index pointer `ptr`
// (rowptr or colptr, n + 1 entries) lies, as lane (g, t) of its warp sees it.
struct Unit {
  const int* ptr;
  int64_t n, r0, HC, head_off;  // r0: the first of the unit's rows
  int h, lane, g, t, beg, end;  // beg, end: the edges of the 8 rows

  __device__ __forceinline__ Unit(const int* __restrict__ ptr_, int64_t n_, int H, int C,
                                  int64_t unit)
      : ptr(ptr_), n(n_) {
    const int64_t blk = unit / H;
    h = (int)(unit - blk * H);
    r0 = blk * kMmaRows;
    HC = (int64_t)H * C;
    head_off = (int64_t)h * C;
    lane = threadIdx.x & 31;
    g = lane >> 2;
    t = lane & 3;
    beg = bound(0);
    end = bound(kMmaRows);
  }
  // The first edge of row r0 + i (the end of the last row past it).
  __device__ __forceinline__ int bound(int i) const { return __ldg(ptr + min(r0 + i, n)); }
};

// A row's 16-byte slices t + 4c as B fragments: k-step s uses words 2 (s % 2)
// and 2 (s % 2) + 1 of slice s / 2 (the channels of the SDDMM's A fragments).
template <typename T, int C>
__device__ __forceinline__ void load_b_frags(const T* __restrict__ rowp, bool ok, int t,
                                             uint32_t (&b)[C / 16][2]) {
#pragma unroll
  for (int c = 0; c < C / 32; ++c) {
    const uint4 x = ok ? __ldg(reinterpret_cast<const uint4*>(rowp) + t + 4 * c)
                       : make_uint4(0, 0, 0, 0);
    b[2 * c][0] = x.x; b[2 * c][1] = x.y; b[2 * c + 1][0] = x.z; b[2 * c + 1][1] = x.w;
  }
}

// D = dO . O of one row and head, in fp32, from the row's dO slices t + 4c as
// load_b_frags holds them and the same channels of the forward's fp32 row
// `o32row` (dot_backward.cu says why fp32), summed over the four lanes t of the
// quad: every lane of the quad returns it. Called by whole warps; 0 where !ok.
template <typename T, int C>
__device__ __forceinline__ float quad_dsum(const uint32_t (&w)[C / 16][2],
                                           const float* __restrict__ o32row, bool ok, int t) {
  float d = 0.f;
  if (ok) {
#pragma unroll
    for (int c = 0; c < C / 32; ++c) {
      const float4 lo = __ldg(reinterpret_cast<const float4*>(o32row) + 2 * (t + 4 * c));
      const float4 hi = __ldg(reinterpret_cast<const float4*>(o32row) + 2 * (t + 4 * c) + 1);
      const float2 g0 = unpack2<T>(w[2 * c][0]), g1 = unpack2<T>(w[2 * c][1]);
      const float2 g2 = unpack2<T>(w[2 * c + 1][0]), g3 = unpack2<T>(w[2 * c + 1][1]);
      d = fmaf(g0.x, lo.x, d); d = fmaf(g0.y, lo.y, d);
      d = fmaf(g1.x, lo.z, d); d = fmaf(g1.y, lo.w, d);
      d = fmaf(g2.x, hi.x, d); d = fmaf(g2.y, hi.y, d);
      d = fmaf(g3.x, hi.z, d); d = fmaf(g3.y, hi.w, d);
    }
  }
  d += __shfl_xor_sync(0xffffffffu, d, 1);
  d += __shfl_xor_sync(0xffffffffu, d, 2);
  return d;
}

// s[0], s[1] = row a of the A operand (edge g) with columns 2t, 2t + 1; s[2],
// s[3] = row b (edge g + 8): the SDDMM of 16 gathered rows against 8 B rows.
template <typename T, int C>
__device__ __forceinline__ void sddmm16(const uint4 (&ra)[C / 32], const uint4 (&rb)[C / 32],
                                        const uint32_t (&b)[C / 16][2], float (&s)[4]) {
  s[0] = s[1] = s[2] = s[3] = 0.f;
#pragma unroll
  for (int c = 0; c < C / 32; ++c) {
    mma_16816<T>(s, ra[c].x, rb[c].x, ra[c].y, rb[c].y, b[2 * c][0], b[2 * c][1]);
    mma_16816<T>(s, ra[c].z, rb[c].z, ra[c].w, rb[c].w, b[2 * c + 1][0], b[2 * c + 1][1]);
  }
}

// Stores columns 2t and 2t + 1 of acc (times `mul`) as rows c0 + 2t, c0 + 2t + 1
// of x [n, H, C] (rows ld elements apart), in load_v_words' channel order
// (store_words).
template <typename T, int C>
__device__ __forceinline__ void store_cols(T* __restrict__ x, const float (&acc)[C / 16][4],
                                           float mul, int64_t c0, int64_t n, int64_t ld,
                                           int64_t head_off, int g, int t) {
  uint32_t w0[C / 16], w1[C / 16];
#pragma unroll
  for (int b = 0; b < C / 16; ++b) {
    w0[b] = pack2<T>(acc[b][0] * mul, acc[b][2] * mul);
    w1[b] = pack2<T>(acc[b][1] * mul, acc[b][3] * mul);
  }
  if (c0 + 2 * t < n)
    store_words<C>(reinterpret_cast<uint32_t*>(x + (c0 + 2 * t) * ld + head_off), g, w0);
  if (c0 + 2 * t + 1 < n)
    store_words<C>(reinterpret_cast<uint32_t*>(x + (c0 + 2 * t + 1) * ld + head_off), g, w1);
}

// The CSR walk (dot_backward_mma.cu describes it): one unit of 8 rows and one head.
// `unit`: rows [8 (unit / H), + 8) of head unit % H; called by whole warps.
// D of the unit's rows comes from dO and the forward's fp32 rows out32 [N, H, C]
// here (quad_dsum), and goes to dsum [N, H] where given (the dense-tile dkv
// launch reads it; the tensor-core dkv walk reads the saved weights instead).
template <typename T, int C>
__device__ __forceinline__ void gt_dq_mma_unit(
    const T* __restrict__ dout, const T* __restrict__ q, const T* __restrict__ k,
    const T* __restrict__ v, const float* __restrict__ lse2, const float* __restrict__ out32,
    float* __restrict__ dsum,
    const int* __restrict__ rowptr, const int* __restrict__ col, T* __restrict__ dq,
    int64_t ld_q, float2* __restrict__ pds, int64_t n_rows, int H, float scale, float scale2,
    int64_t unit) {
  constexpr int KC = C / 32;  // 16-byte slices of a row per lane
  constexpr int NK = C / 16;  // k-steps of the SDDMMs = channel blocks of the SpMM
  const Unit u(rowptr, n_rows, H, C, unit);
  const int h = u.h, lane = u.lane, g = u.g, t = u.t, beg = u.beg, end = u.end;
  const int64_t i0 = u.r0, HC = u.HC, head_off = u.head_off;
  // Edge ranges of this lane's rows 2t and 2t + 1.
  const int rb0 = u.bound(2 * t), rb1 = u.bound(2 * t + 1), rb2 = u.bound(2 * t + 2);

  uint32_t qb[NK][2], gb[NK][2];  // q and dO of row g (B fragments)
  const bool ok_g = i0 + g < n_rows;
  load_b_frags<T, C>(q + (i0 + g) * HC + head_off, ok_g, t, qb);
  load_b_frags<T, C>(dout + (i0 + g) * HC + head_off, ok_g, t, gb);
  // D of row g, then of rows 2t, 2t + 1 from their quads (lanes 8t and 8t + 4).
  const float Dg = quad_dsum<T, C>(gb, out32 + (i0 + g) * HC + head_off, ok_g, t);
  if (dsum != nullptr && ok_g && t == 0) dsum[(i0 + g) * H + h] = Dg;
  const float D0 = __shfl_sync(0xffffffffu, Dg, 8 * t);
  const float D1 = __shfl_sync(0xffffffffu, Dg, 8 * t + 4);
  // lse2 of rows 2t, 2t + 1 (clamped to the last row: used only where the row
  // has an edge).
  const int64_t r0 = min(i0 + 2 * t, n_rows - 1), r1 = min(i0 + 2 * t + 1, n_rows - 1);
  const float L0 = __ldg(lse2 + r0 * H + h), L1 = __ldg(lse2 + r1 * H + h);

  float acc[NK][4];
#pragma unroll
  for (int b = 0; b < NK; ++b) acc[b][0] = acc[b][1] = acc[b][2] = acc[b][3] = 0.f;
  // Neighbours of edges g and g + 8 of the next tile (loaded a tile ahead); past
  // the block's end a lane takes its last edge (unconditional loads, masked).
  auto nbr = [&](int e) { return __ldg(col + min(e, end - 1)); };
  int na = beg < end ? nbr(beg + g) : 0;
  int nb = beg < end ? nbr(beg + g + 8) : 0;
  for (int e0 = beg; e0 < end; e0 += 16) {
    const int ja = na, jb = nb;
    uint4 ka[KC], kb[KC], va[KC], vb[KC];
    load_slices<C>(k, ja, HC, head_off, t, ka);
    load_slices<C>(k, jb, HC, head_off, t, kb);
    load_slices<C>(v, ja, HC, head_off, t, va);
    load_slices<C>(v, jb, HC, head_off, t, vb);
    int jw[4];
    loader_rows(ja, jb, lane, jw);
    uint32_t kw[4][NK];
    load_tile_words<C>(k, jw, HC, head_off, lane, kw);
    na = nbr(e0 + 16 + g);
    nb = nbr(e0 + 24 + g);

    float s[4], dp[4];
    sddmm16<T, C>(ka, kb, qb, s);
    sddmm16<T, C>(va, vb, gb, dp);
    const int ea = e0 + g, eb = e0 + g + 8;
    const bool m0 = rb0 <= ea && ea < rb1, m1 = rb1 <= ea && ea < rb2;
    const bool m2 = rb0 <= eb && eb < rb1, m3 = rb1 <= eb && eb < rb2;
    const float p0 = m0 ? fast_exp2(s[0] * scale2 - L0) : 0.f;
    const float p1 = m1 ? fast_exp2(s[1] * scale2 - L1) : 0.f;
    const float p2 = m2 ? fast_exp2(s[2] * scale2 - L0) : 0.f;
    const float p3 = m3 ? fast_exp2(s[3] * scale2 - L1) : 0.f;
    const float d0 = p0 * (dp[0] - D0), d1 = p1 * (dp[1] - D1);
    const float d2 = p2 * (dp[2] - D0), d3 = p3 * (dp[3] - D1);
    // Each edge of the tile belongs to one row, so one lane of its fragment row
    // holds it: that lane stores its (P, dS) (no dropout: P' = P). No pds: the
    // dense-tile dkv launch recomputes every weight (the plan's save_weights).
    if (pds != nullptr) {
      if (m0 || m1) pds[(int64_t)ea * H + h] = m0 ? make_float2(p0, d0) : make_float2(p1, d1);
      if (m2 || m3) pds[(int64_t)eb * H + h] = m2 ? make_float2(p2, d2) : make_float2(p3, d3);
    }

    // dS as the SpMM's B fragments (edges 2t, 2t + 1 | 2t + 8, 2t + 9 of row g).
    const uint32_t db0 = transpose8x8(pack2<T>(d0, d1));
    const uint32_t db1 = transpose8x8(pack2<T>(d2, d3));
    spmm16<T, NK>(acc, kw, db0, db1, 8 * t + g);
  }
  store_cols<T, C>(dq, acc, scale, i0, n_rows, ld_q, head_off, g, t);
}

// The CSC walk on tensor cores: dV_j = sum_i P_ij dO_i and dK_j = scale * sum_i
// dS_ij q_i, with (P, dS) the dq walk saved (pds, CSR order, read through the
// CSC permutation). One warp owns 8 consecutive sources (one head) and walks
// their in-edges 16 at a time; per tile two SpMMs,
//   dV^T [C x 8] += dO^T [C x 16] . P [16 x 8],  dK^T [C x 8] += Q^T [C x 16] . dS [16 x 8],
// the dO and q rows gathered as the forward gathers v (load_v_words), the
// weights rounded to T (fp32 accumulation). Lane (g, t) loads the weights of its
// B fragments itself: edges 2t, 2t + 1, 2t + 8, 2t + 9 of the tile where they
// belong to source g (each edge is loaded by one lane, the others are 0).
// Columns are walked whole, whatever the CSC work items (no partials).
template <typename T, int C>
__device__ __forceinline__ void gt_dkv_mma_unit(
    const T* __restrict__ dout, const T* __restrict__ q, const float2* __restrict__ pds,
    const int* __restrict__ colptr, const int* __restrict__ row, const int* __restrict__ perm,
    T* __restrict__ dk, T* __restrict__ dv, int64_t ld_kv, int64_t n_cols, int H, float scale,
    int64_t unit) {
  constexpr int NK = C / 16;
  const Unit u(colptr, n_cols, H, C, unit);
  const int h = u.h, lane = u.lane, g = u.g, t = u.t, beg = u.beg, end = u.end;
  const int64_t j0 = u.r0, HC = u.HC, head_off = u.head_off;
  const int cb = u.bound(g), ce = u.bound(g + 1);  // in-edges of this lane's source g

  float acc_v[NK][4], acc_k[NK][4];
#pragma unroll
  for (int b = 0; b < NK; ++b)
#pragma unroll
    for (int x = 0; x < 4; ++x) acc_v[b][x] = acc_k[b][x] = 0.f;
  auto nbr = [&](int e) { return __ldg(row + min(e, end - 1)); };
  // The CSR position of edge e where it is one of source g's, else -1; its
  // weights then come one trip later, so positions are loaded a tile ahead.
  auto csr_pos = [&](int e) { return cb <= e && e < ce ? __ldg(perm + e) : -1; };
  // Without pds (a plan that saves no weights sends no column here) the
  // gradients come out NaN rather than read from nowhere.
  const float nan = __int_as_float(0x7fc00000);
  auto weights = [&](int pos) {
    if (pos < 0) return make_float2(0.f, 0.f);
    return pds != nullptr ? __ldg(pds + (int64_t)pos * H + h) : make_float2(nan, nan);
  };
  int na = beg < end ? nbr(beg + g) : 0;
  int nb = beg < end ? nbr(beg + g + 8) : 0;
  int pos[4];  // edges 2t, 2t + 1, 2t + 8, 2t + 9 of the next tile
#pragma unroll
  for (int x = 0; x < 4; ++x) pos[x] = csr_pos(beg + 2 * t + (x & 1) + 8 * (x >> 1));
  const int src = 8 * t + g;
  for (int e0 = beg; e0 < end; e0 += 16) {
    int iw[4];
    loader_rows(na, nb, lane, iw);
    uint32_t gw[4][NK], qw[4][NK];
    load_tile_words<C>(dout, iw, HC, head_off, lane, gw);
    load_tile_words<C>(q, iw, HC, head_off, lane, qw);
    const float2 w0 = weights(pos[0]), w1 = weights(pos[1]);
    const float2 w2 = weights(pos[2]), w3 = weights(pos[3]);
    na = nbr(e0 + 16 + g);
    nb = nbr(e0 + 24 + g);
#pragma unroll
    for (int x = 0; x < 4; ++x) pos[x] = csr_pos(e0 + 16 + 2 * t + (x & 1) + 8 * (x >> 1));
    spmm16<T, NK>(acc_v, gw, pack2<T>(w0.x, w1.x), pack2<T>(w2.x, w3.x), src);
    spmm16<T, NK>(acc_k, qw, pack2<T>(w0.y, w1.y), pack2<T>(w2.y, w3.y), src);
  }
  store_cols<T, C>(dv, acc_v, 1.f, j0, n_cols, ld_kv, head_off, g, t);
  store_cols<T, C>(dk, acc_k, scale, j0, n_cols, ld_kv, head_off, g, t);
}

}  // namespace dfgnn
