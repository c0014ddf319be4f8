// The dot score's sparse tensor-core unit, shared by the sparse forward
// (dot_forward_mma.cu, where its design is described) and the blocks of the
// dense-tile forward that the plan sends to it (dot_forward_dense.cu).
#pragma once

#include <cstdint>

#include "device/mma.cuh"

namespace dfgnn {

// One unit of the sparse tensor-core forward: destination rows
// [8 blk, 8 blk + 8) of head h, walked by the calling warp (all 32 lanes).
template <typename T, int C>
__device__ __forceinline__ void gt_mma_unit(const T* __restrict__ q, const T* __restrict__ k,
                                            const T* __restrict__ v,
                                            const int* __restrict__ rowptr,
                                            const int* __restrict__ col, T* __restrict__ out,
                                            float* __restrict__ out32,
                                            float* __restrict__ lse2, int64_t n_rows, int H,
                                            float scale2, int64_t blk, int h) {
  constexpr int KC = C / 32;  // 16-byte slices of a k / q row per lane
  constexpr int NK = C / 16;  // k-steps of the SDDMM = channel blocks of the SpMM
  const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  const int64_t i0 = blk * kMmaRows;
  const int64_t HC = (int64_t)H * C, head_off = (int64_t)h * C;
  auto ptr = [&](int n) { return __ldg(rowptr + min(i0 + n, n_rows)); };
  const int beg = ptr(0), end = ptr(kMmaRows);
  // Edge ranges of this lane's rows 2t and 2t + 1.
  const int rb0 = ptr(2 * t), rb1 = ptr(2 * t + 1), rb2 = ptr(2 * t + 2);

  // q of row g as the SDDMM's B fragments: k-step s uses words 2 (s % 2) and
  // 2 (s % 2) + 1 of slice s / 2 (the same channels as the K fragments).
  uint32_t qb[NK][2];
  {
    const bool ok = i0 + g < n_rows;
    const T* qrow = q + (i0 + g) * HC + head_off;
#pragma unroll
    for (int c = 0; c < KC; ++c) {
      const uint4 x = ok ? __ldg(reinterpret_cast<const uint4*>(qrow) + t + 4 * c)
                         : make_uint4(0, 0, 0, 0);
      qb[2 * c][0] = x.x; qb[2 * c][1] = x.y; qb[2 * c + 1][0] = x.z; qb[2 * c + 1][1] = x.w;
    }
  }

  float acc[NK][4];
#pragma unroll
  for (int b = 0; b < NK; ++b) acc[b][0] = acc[b][1] = acc[b][2] = acc[b][3] = 0.f;
  float m0 = kNegInf, m1 = kNegInf, l0 = 0.f, l1 = 0.f;  // rows 2t, 2t + 1 (l: lane partial)
  // Neighbours of edges g and g + 8 of the next tile (loaded a tile ahead).
  // Past the block's end a lane takes its last edge instead: every load is then
  // unconditional (no zeroing, no predicates), and those edges' scores are masked.
  auto nbr = [&](int e) { return __ldg(col + min(e, end - 1)); };
  int na = beg < end ? nbr(beg + g) : 0;
  int nb = beg < end ? nbr(beg + g + 8) : 0;
  for (int e0 = beg; e0 < end; e0 += 16) {
    const int ja = na, jb = nb;
    uint4 ka[KC], kb[KC];
    const uint4* krow_a = reinterpret_cast<const uint4*>(k + ja * HC + head_off) + t;
    const uint4* krow_b = reinterpret_cast<const uint4*>(k + jb * HC + head_off) + t;
#pragma unroll
    for (int c = 0; c < KC; ++c) {
      ka[c] = __ldg(krow_a + 4 * c);
      kb[c] = __ldg(krow_b + 4 * c);
    }
    // v rows (load_v_words): this lane loads for the lane group q = lane / 8, whose
    // edges 2q, 2q + 1, 2q + 8, 2q + 9 come from the lanes that hold them.
    int jv[4];
    loader_rows(ja, jb, lane, jv);
    uint32_t vw[4][NK];  // as loaded, for the lanes 8t + g of group t = lane / 8
    load_tile_words<C>(v, jv, HC, head_off, lane, vw);
    na = nbr(e0 + 16 + g);
    nb = nbr(e0 + 24 + g);

    // SDDMM: s[0], s[1] = edge g with rows 2t, 2t + 1; s[2], s[3] = edge g + 8.
    float s[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
    for (int c = 0; c < KC; ++c) {
      mma_16816<T>(s, ka[c].x, kb[c].x, ka[c].y, kb[c].y, qb[2 * c][0], qb[2 * c][1]);
      mma_16816<T>(s, ka[c].z, kb[c].z, ka[c].w, kb[c].w, qb[2 * c + 1][0], qb[2 * c + 1][1]);
    }
    const int ea = e0 + g, eb = e0 + g + 8;
    s[0] = rb0 <= ea && ea < rb1 ? s[0] * scale2 : kNegInf;
    s[1] = rb1 <= ea && ea < rb2 ? s[1] * scale2 : kNegInf;
    s[2] = rb0 <= eb && eb < rb1 ? s[2] * scale2 : kNegInf;
    s[3] = rb1 <= eb && eb < rb2 ? s[3] * scale2 : kNegInf;

    // Online softmax of rows 2t, 2t + 1: the tile's maximum over the 8 lanes
    // g = 0..7 that hold the column.
    float t0 = fmaxf(s[0], s[2]), t1 = fmaxf(s[1], s[3]);
#pragma unroll
    for (int o = 4; o < 32; o <<= 1) {
      t0 = fmaxf(t0, __shfl_xor_sync(0xffffffffu, t0, o));
      t1 = fmaxf(t1, __shfl_xor_sync(0xffffffffu, t1, o));
    }
    const RaisedMax r = raise_max(m0, m1, t0, t1);
    const float base0 = r.base0, base1 = r.base1, c0 = r.c0, c1 = r.c1;
    const float p0 = fast_exp2(s[0] - base0), p1 = fast_exp2(s[1] - base1);
    const float p2 = fast_exp2(s[2] - base0), p3 = fast_exp2(s[3] - base1);
    l0 = l0 * c0 + p0 + p2;
    l1 = l1 * c1 + p1 + p3;
    if (__any_sync(0xffffffffu, r.rescale)) {
#pragma unroll
      for (int b = 0; b < NK; ++b) {
        acc[b][0] *= c0; acc[b][2] *= c0;
        acc[b][1] *= c1; acc[b][3] *= c1;
      }
    }

    // P as the SpMM's B fragments (edges 2t, 2t + 1 | 2t + 8, 2t + 9 of row g).
    const uint32_t pb0 = transpose8x8(pack2<T>(p0, p1));
    const uint32_t pb1 = transpose8x8(pack2<T>(p2, p3));
    spmm16<T, NK>(acc, vw, pb0, pb1, 8 * t + g);
  }

  // Row sums over the 8 lanes of each column, then out = acc / l and lse2.
#pragma unroll
  for (int o = 4; o < 32; o <<= 1) {
    l0 += __shfl_xor_sync(0xffffffffu, l0, o);
    l1 += __shfl_xor_sync(0xffffffffu, l1, o);
  }
  const float inv0 = l0 > 0.f ? 1.f / l0 : 0.f, inv1 = l1 > 0.f ? 1.f / l1 : 0.f;
  uint32_t w0[NK], w1[NK];
#pragma unroll
  for (int b = 0; b < NK; ++b) {
    w0[b] = pack2<T>(acc[b][0] * inv0, acc[b][2] * inv0);
    w1[b] = pack2<T>(acc[b][1] * inv1, acc[b][3] * inv1);
  }
  // c = 0: row 2t (acc[.][0], acc[.][2]); c = 1: row 2t + 1 (acc[.][1], acc[.][3]).
  auto store = [&](int64_t row, const uint32_t (&w)[NK], float m, float l, int c, float inv) {
    if (row >= n_rows) return;
    store_words<C>(reinterpret_cast<uint32_t*>(out + row * HC + head_off), g, w);
    if (out32 != nullptr) {
      float lo[NK], hi[NK];
#pragma unroll
      for (int b = 0; b < NK; ++b) {
        lo[b] = acc[b][c] * inv;
        hi[b] = acc[b][c + 2] * inv;
      }
      store_words_f32<C>(out32 + row * HC + head_off, g, lo, hi);
    }
    if (g == 0) lse2[row * H + h] = l > 0.f ? m + log2f(l) : kNegInf;
  };
  store(i0 + 2 * t, w0, m0, l0, 0, inv0);
  store(i0 + 2 * t + 1, w1, m1, l1, 1, inv1);
}

}  // namespace dfgnn
