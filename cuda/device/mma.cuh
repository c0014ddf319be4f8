// Tensor-core building blocks of the fp16 / bf16 GT forwards (dot_forward_mma.cu,
// dot_forward_dense.cu): the mma.m16n8k16 wrapper, operand packing, and the sparse
// unit, one warp walking the edges of 8 destination rows 16 at a time.
// The sparse unit's design is described in dot_forward_mma.cu.
#pragma once
#include "device/lane_group.cuh"
#include "device/numerics.cuh"

namespace dfgnn {

constexpr int kMmaRows = 8;  // destination rows per warp (the mma's N)

template <typename T>
__device__ __forceinline__ void mma_16816(float (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2,
                                          uint32_t a3, uint32_t b0, uint32_t b1) {
  if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
        "{%8,%9}, {%0,%1,%2,%3};"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
  } else {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
        "{%8,%9}, {%0,%1,%2,%3};"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
  }
}

// Two floats rounded to T, `lo` in the low half.
template <typename T> __device__ __forceinline__ uint32_t pack2(float lo, float hi) {
  uint32_t r;
  if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    __nv_bfloat162 x = __floats2bfloat162_rn(lo, hi);
    r = *reinterpret_cast<uint32_t*>(&x);
  } else {
    __half2 x = __floats2half2_rn(lo, hi);
    r = *reinterpret_cast<uint32_t*>(&x);
  }
  return r;
}


// The transpose of an 8 x 8 matrix of 16-bit values held one row pair per lane
// (lane l: row l / 4, columns 2 (l % 4) and 2 (l % 4) + 1).
__device__ __forceinline__ uint32_t transpose8x8(uint32_t x) {
  uint32_t y;
  asm("movmatrix.sync.aligned.m8n8.trans.b16 %0, %1;" : "=r"(y) : "r"(x));
  return y;
}

// The SpMM's V fragments need lane (g, t) to hold C / 8 channels (slices g and
// g + 8 of 16 bytes for C = 128, slice g for C = 64, 8-byte slice g for C = 32) of
// 4 edges, 2t, 2t + 1, 2t + 8, 2t + 9: loaded directly, every quarter-warp
// instruction would touch 4 rows, i.e. 4 L1 wavefronts of 32 bytes each, and the
// kernel was bound by L1 wavefronts. So lane
// L = 8q + r loads slice r of the row of the q-th lane group's edge (a quarter-warp
// reads one whole 128-byte line), and the SpMM takes each word from lane 8t + g
// by shuffle when it needs it (4 shuffles per 16 bytes, for half the wavefronts;
// shuffled all at once, the words took the kernel from 128 to 167 registers).
// `j`: this loader lane's neighbour; w: C / 16 words of two channels each, word
// 4c + i of slice r + 8c (store_words writes the output rows the same way).
template <int C, typename T>
__device__ __forceinline__ void load_v_words(const T* __restrict__ v, int j, int64_t HC,
                                             int64_t head_off, int r, uint32_t (&w)[C / 16]) {
  if constexpr (C / 16 >= 4) {
    const uint4* row = reinterpret_cast<const uint4*>(v + j * HC + head_off) + r;
#pragma unroll
    for (int c = 0; c < C / 64; ++c) {
      const uint4 x = __ldg(row + 8 * c);
      w[4 * c] = x.x; w[4 * c + 1] = x.y; w[4 * c + 2] = x.z; w[4 * c + 3] = x.w;
    }
  } else {
    static_assert(C / 16 == 2, "C in {32, 64, 128}");
    const uint2 x = __ldg(reinterpret_cast<const uint2*>(v + j * HC + head_off) + r);
    w[0] = x.x; w[1] = x.y;
  }
}

template <int C>
__device__ __forceinline__ void store_words(uint32_t* __restrict__ row, int g,
                                            const uint32_t (&w)[C / 16]) {
  if constexpr (C / 16 >= 4) {
#pragma unroll
    for (int c = 0; c < C / 64; ++c)
      reinterpret_cast<uint4*>(row)[g + 8 * c] = make_uint4(w[4 * c], w[4 * c + 1], w[4 * c + 2],
                                                            w[4 * c + 3]);
  } else {
    reinterpret_cast<uint2*>(row)[g] = make_uint2(w[0], w[1]);
  }
}

// store_words' layout in float32 (O32, a half-precision backward's source of
// D): word b's two values (lo[b], hi[b]) at elements 2 * (its word index).
template <int C>
__device__ __forceinline__ void store_words_f32(float* __restrict__ row, int g,
                                                const float (&lo)[C / 16],
                                                const float (&hi)[C / 16]) {
#pragma unroll
  for (int b = 0; b < C / 16; ++b) {
    const int word = C / 16 >= 4 ? 4 * (g + 8 * (b / 4)) + b % 4 : 2 * g + b;
    reinterpret_cast<float2*>(row)[word] = make_float2(lo[b], hi[b]);
  }
}

// Slices t + 4c (16 bytes each) of row j: the SDDMM's A fragments of one edge.
template <int C, typename T>
__device__ __forceinline__ void load_slices(const T* __restrict__ x, int j, int64_t HC,
                                            int64_t head_off, int t, uint4 (&r)[C / 32]) {
  const uint4* row = reinterpret_cast<const uint4*>(x + j * HC + head_off) + t;
#pragma unroll
  for (int c = 0; c < C / 32; ++c) r[c] = __ldg(row + 4 * c);
}

// The rows this lane loads for the SpMM (load_v_words): those of edges 2q,
// 2q + 1, 2q + 8, 2q + 9 of the tile (q = lane / 8), taken from the lanes (g, t)
// that hold edges g (ja) and g + 8 (jb).
__device__ __forceinline__ void loader_rows(int ja, int jb, int lane, int (&r)[4]) {
  const int q8 = lane >> 3;
  r[0] = __shfl_sync(0xffffffffu, ja, 8 * q8);
  r[1] = __shfl_sync(0xffffffffu, ja, 8 * q8 + 4);
  r[2] = __shfl_sync(0xffffffffu, jb, 8 * q8);
  r[3] = __shfl_sync(0xffffffffu, jb, 8 * q8 + 4);
}

template <int C, typename T>
__device__ __forceinline__ void load_tile_words(const T* __restrict__ x, const int (&r)[4],
                                                int64_t HC, int64_t head_off, int lane,
                                                uint32_t (&w)[4][C / 16]) {
#pragma unroll
  for (int u = 0; u < 4; ++u) load_v_words<C>(x, r[u], HC, head_off, lane & 7, w[u]);
}

// The SpMM step of the sparse units (forward and backward):
//   acc^T [C x 8 columns] += A^T [C x 16 edges] . W [16 edges x 8 columns],
// A's rows as load_tile_words loaded them, W as B fragments wb0 (edges 2t, 2t + 1
// of column g) and wb1 (edges 2t + 8, 2t + 9). Channel block b is word b of this
// lane's channels, held by lane src = 8t + g (load_v_words): its low channel is
// fragment row g, its high one g + 8.
template <typename T, int NK>
__device__ __forceinline__ void spmm16(float (&acc)[NK][4], const uint32_t (&aw)[4][NK],
                                       uint32_t wb0, uint32_t wb1, int src) {
#pragma unroll
  for (int b = 0; b < NK; ++b) {
    uint32_t w[4];
#pragma unroll
    for (int u = 0; u < 4; ++u) w[u] = __shfl_sync(0xffffffffu, aw[u][b], src);
    mma_16816<T>(acc[b], __byte_perm(w[0], w[1], 0x5410), __byte_perm(w[0], w[1], 0x7632),
                 __byte_perm(w[2], w[3], 0x5410), __byte_perm(w[2], w[3], 0x7632), wb0, wb1);
  }
}

// One online-softmax step of a lane's two rows: the running maxima m0, m1 rise to
// include the tile maxima t0, t1. base: the new maximum, or 0 while the row has no
// score (so 2^(s - base) of a -inf score is 0, not NaN); c: the factor that moves
// the row's sum and accumulator to the new base. A row needs that rescale only
// when its max rose from a finite value (while m = -inf its accumulator is zero).
struct RaisedMax {
  float base0, base1, c0, c1;
  bool rescale;
};
__device__ __forceinline__ RaisedMax raise_max(float& m0, float& m1, float t0, float t1) {
  const float n0 = fmaxf(m0, t0), n1 = fmaxf(m1, t1);
  RaisedMax r;
  r.base0 = n0 == kNegInf ? 0.f : n0;
  r.base1 = n1 == kNegInf ? 0.f : n1;
  r.rescale = (m0 != kNegInf && n0 > m0) || (m1 != kNegInf && n1 > m1);
  r.c0 = fast_exp2(m0 - r.base0);
  r.c1 = fast_exp2(m1 - r.base1);
  m0 = n0;
  m1 = n1;
  return r;
}

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
