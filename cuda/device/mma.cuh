// Tensor-core building blocks of the fp16 / bf16 kernels: the mma.m16n8k16
// wrapper, operand packing, the row loads and stores in the SpMM's channel order,
// the SpMM step and the online-softmax step of the sparse units (a warp walking
// the edges of kMmaRows destination rows 16 at a time). The scores' own units
// live in their folders.
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

// The two T values of a word as floats, the low half in .x (pack2's inverse).
template <typename T> __device__ __forceinline__ float2 unpack2(uint32_t w) {
  if constexpr (std::is_same_v<T, __nv_bfloat16>)
    return __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&w));
  else
    return __half22float2(*reinterpret_cast<const __half2*>(&w));
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

}  // namespace dfgnn
