// A lane's slice of one (node, head) row: 16-byte vector loads that widen to fp32
// registers, packed slices kept as loaded, the row fragments' arithmetic, and the
// fp32 partial rows of split rows.
#pragma once

#include <cstdint>
#include <type_traits>
#include "device/numerics.cuh"

namespace dfgnn {

// Vector I/O: VEC elements of T per access: 16 bytes on the fast path (float4 / 8 halves),
// one element on the generic path (any head size C).
template <typename T, int VEC> struct Vec {
  static_assert(VEC * sizeof(T) == 16 || VEC == 1, "16-byte or scalar vectors");
  __device__ __forceinline__ static void load(const T* __restrict__ p, float (&out)[VEC]) {
    if constexpr (VEC == 1) {
      out[0] = to_float(__ldg(p));
    } else {
      uint4 raw = __ldg(reinterpret_cast<const uint4*>(p));
      const T* e = reinterpret_cast<const T*>(&raw);
#pragma unroll
      for (int i = 0; i < VEC; ++i) out[i] = to_float(e[i]);
    }
  }
  __device__ __forceinline__ static void store(T* __restrict__ p, const float (&in)[VEC]) {
    if constexpr (VEC == 1) {
      *p = from_float<T>(in[0]);
    } else {
      uint4 raw;
      T* e = reinterpret_cast<T*>(&raw);
#pragma unroll
      for (int i = 0; i < VEC; ++i) e[i] = from_float<T>(in[i]);
      *reinterpret_cast<uint4*>(p) = raw;
    }
  }
};

// A row slice kept as loaded (16-byte packets, or one element on the scalar path)
// until the arithmetic needs it: widening to fp32 at load time doubled the
// registers of the fp16/bf16 kernels and halved their occupancy.
template <typename T, int VEC> struct Packed {
  using type = typename std::conditional<VEC == 1, T, uint4>::type;
};

template <typename T, int VEC, int G, int NV>
__device__ __forceinline__ void load_packed(const T* __restrict__ row, int gl, int nvec,
                                            typename Packed<T, VEC>::type (&x)[NV]) {
#pragma unroll
  for (int r = 0; r < NV; ++r) {
    const int t = gl + G * r;
    if constexpr (VEC == 1) {
      x[r] = t < nvec ? __ldg(row + t) : from_float<T>(0.f);
    } else {
      x[r] = t < nvec ? __ldg(reinterpret_cast<const uint4*>(row + (int64_t)t * VEC))
                      : make_uint4(0, 0, 0, 0);
    }
  }
}

// A row's tail: vectors first .. nvec - 1 of a row whose earlier vectors are
// zero, loaded from `tail` (its vector first at tail[0]); lane gl's vectors below
// `first` (and from nvec on) are zero.
template <typename T, int VEC, int G, int NV>
__device__ __forceinline__ void load_packed_tail(const T* __restrict__ tail, int gl, int first,
                                                 int nvec,
                                                 typename Packed<T, VEC>::type (&x)[NV]) {
#pragma unroll
  for (int r = 0; r < NV; ++r) {
    const int t = gl + G * r;
    const bool in = t >= first && t < nvec;
    if constexpr (VEC == 1) {
      x[r] = in ? __ldg(tail + (t - first)) : from_float<T>(0.f);
    } else {
      x[r] = in ? __ldg(reinterpret_cast<const uint4*>(tail + (int64_t)(t - first) * VEC))
                : make_uint4(0, 0, 0, 0);
    }
  }
}

// Element c of a packed slice as fp32. A bf16 is the high half of an fp32, so
// element c of a 32-bit word of two is one shift (c even) or one mask (c odd) of
// the word; the generic conversion extracted the half first and then shifted it
// (three instructions per pair instead of two, in the loops that are issue-bound
// in bf16).
template <typename T, int VEC>
__device__ __forceinline__ float packed_elem(const typename Packed<T, VEC>::type& x, int c) {
  if constexpr (VEC == 1) {
    return to_float(x);
  } else if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    const uint32_t w = reinterpret_cast<const uint32_t*>(&x)[c / 2];
    return __uint_as_float(c % 2 == 0 ? w << 16 : w & 0xffff0000u);
  } else {
    return to_float(reinterpret_cast<const T*>(&x)[c]);
  }
}

template <typename T, int VEC, int NV>
__device__ __forceinline__ float dot_packed(const float (&a)[NV][VEC],
                                            const typename Packed<T, VEC>::type (&b)[NV]) {
  float s = 0.f;
#pragma unroll
  for (int r = 0; r < NV; ++r)
#pragma unroll
    for (int c = 0; c < VEC; ++c) s = fmaf(a[r][c], packed_elem<T, VEC>(b[r], c), s);
  return s;
}

// The dot product of two packed row slices (dot_packed: fp32 and packed).
template <typename T, int VEC, int NV>
__device__ __forceinline__ float dot_packed2(const typename Packed<T, VEC>::type (&a)[NV],
                                             const typename Packed<T, VEC>::type (&b)[NV]) {
  float s = 0.f;
#pragma unroll
  for (int r = 0; r < NV; ++r)
#pragma unroll
    for (int c = 0; c < VEC; ++c)
      s = fmaf(packed_elem<T, VEC>(a[r], c), packed_elem<T, VEC>(b[r], c), s);
  return s;
}

template <typename T, int VEC, int NV>
__device__ __forceinline__ void axpy_packed(float a, const typename Packed<T, VEC>::type (&x)[NV],
                                            float (&y)[NV][VEC]) {
#pragma unroll
  for (int r = 0; r < NV; ++r)
#pragma unroll
    for (int c = 0; c < VEC; ++c) y[r][c] = fmaf(a, packed_elem<T, VEC>(x[r], c), y[r][c]);
}

// x += y, element by element in T: one rounding per element, as the framework's
// own addition of two T rows rounds (an edge row added to a key row).
template <typename T, int VEC, int NV>
__device__ __forceinline__ void add_packed(typename Packed<T, VEC>::type (&x)[NV],
                                           const typename Packed<T, VEC>::type (&y)[NV]) {
#pragma unroll
  for (int r = 0; r < NV; ++r) {
    if constexpr (VEC == 1) {
      x[r] = from_float<T>(to_float(x[r]) + to_float(y[r]));
    } else {
      uint4 sum;
      T* e = reinterpret_cast<T*>(&sum);
#pragma unroll
      for (int c = 0; c < VEC; ++c)
        e[c] = from_float<T>(packed_elem<T, VEC>(x[r], c) + packed_elem<T, VEC>(y[r], c));
      x[r] = sum;
    }
  }
}

// Loads lane `gl`'s slice of one C-long row: vectors gl, gl + G, ... (< nvec).
template <typename T, int VEC, int G, int NV>
__device__ __forceinline__ void load_row(const T* __restrict__ row, int gl, int nvec,
                                         float (&x)[NV][VEC]) {
#pragma unroll
  for (int r = 0; r < NV; ++r) {
    const int t = gl + G * r;
    if (t < nvec) {
      Vec<T, VEC>::load(row + (int64_t)t * VEC, x[r]);
    } else {
#pragma unroll
      for (int c = 0; c < VEC; ++c) x[r][c] = 0.f;
    }
  }
}

// Vectors first .. nvec - 1 of lane gl's slice of a row (scaled by mul), stored
// from `tail` on (vector first at tail[0]): load_packed_tail's inverse.
template <typename T, int VEC, int G, int NV>
__device__ __forceinline__ void store_row_tail(T* __restrict__ tail, int gl, int first, int nvec,
                                               const float (&x)[NV][VEC], float mul) {
#pragma unroll
  for (int r = 0; r < NV; ++r) {
    const int t = gl + G * r;
    if (t >= first && t < nvec) {
      float y[VEC];
#pragma unroll
      for (int c = 0; c < VEC; ++c) y[c] = x[r][c] * mul;
      Vec<T, VEC>::store(tail + (int64_t)(t - first) * VEC, y);
    }
  }
}

template <typename T, int VEC, int G, int NV>
__device__ __forceinline__ void store_row(T* __restrict__ row, int gl, int nvec,
                                          const float (&x)[NV][VEC], float mul) {
#pragma unroll
  for (int r = 0; r < NV; ++r) {
    const int t = gl + G * r;
    if (t < nvec) {
      float y[VEC];
#pragma unroll
      for (int c = 0; c < VEC; ++c) y[c] = x[r][c] * mul;
      Vec<T, VEC>::store(row + (int64_t)t * VEC, y);
    }
  }
}

template <int VEC, int NV>
__device__ __forceinline__ float dot_frag(const float (&a)[NV][VEC], const float (&b)[NV][VEC]) {
  float s = 0.f;
#pragma unroll
  for (int r = 0; r < NV; ++r)
#pragma unroll
    for (int c = 0; c < VEC; ++c) s = fmaf(a[r][c], b[r][c], s);
  return s;
}

template <int VEC, int NV>
__device__ __forceinline__ void axpy_frag(float a, const float (&x)[NV][VEC], float (&y)[NV][VEC]) {
#pragma unroll
  for (int r = 0; r < NV; ++r)
#pragma unroll
    for (int c = 0; c < VEC; ++c) y[r][c] = fmaf(a, x[r][c], y[r][c]);
}

template <int VEC, int NV>
__device__ __forceinline__ void scale_frag(float a, float (&y)[NV][VEC]) {
#pragma unroll
  for (int r = 0; r < NV; ++r)
#pragma unroll
    for (int c = 0; c < VEC; ++c) y[r][c] *= a;
}

template <int VEC, int NV>
__device__ __forceinline__ void zero_frag(float (&y)[NV][VEC]) {
#pragma unroll
  for (int r = 0; r < NV; ++r)
#pragma unroll
    for (int c = 0; c < VEC; ++c) y[r][c] = 0.f;
}

// Partial sums of split rows are kept in fp32 whatever the input dtype.
template <int VEC, int G, int NV>
__device__ __forceinline__ void store_partial(float* __restrict__ row, int gl, int nvec,
                                              const float (&x)[NV][VEC]) {
#pragma unroll
  for (int r = 0; r < NV; ++r) {
    const int t = gl + G * r;
    if (t < nvec) {
#pragma unroll
      for (int c = 0; c < VEC; ++c) row[(int64_t)t * VEC + c] = x[r][c];
    }
  }
}

// A finished row times `mul` in fp32 (O32, the forward's output before its
// rounding to fp16 / bf16, which a half-precision backward takes D from);
// nothing where `row` is null.
template <int VEC, int G, int NV>
__device__ __forceinline__ void store_row_f32(float* __restrict__ row, int gl, int nvec,
                                              const float (&x)[NV][VEC], float mul) {
  if (row == nullptr) return;
#pragma unroll
  for (int r = 0; r < NV; ++r) {
    const int t = gl + G * r;
    if (t < nvec) {
#pragma unroll
      for (int c = 0; c < VEC; ++c) row[(int64_t)t * VEC + c] = x[r][c] * mul;
    }
  }
}

// Lane gl's vectors of an fp32 partial row written by other blocks (L2 loads).
template <int VEC, int G, int NV>
__device__ __forceinline__ void load_partial(const float* __restrict__ row, int gl, int nvec,
                                             float (&x)[NV][VEC]) {
#pragma unroll
  for (int r = 0; r < NV; ++r) {
    const int t = gl + G * r;
#pragma unroll
    for (int c = 0; c < VEC; c += (VEC % 4 == 0 ? 4 : 1)) {
      if constexpr (VEC % 4 == 0) {
        float4 v = make_float4(0.f, 0.f, 0.f, 0.f);
        if (t < nvec) v = __ldcg(reinterpret_cast<const float4*>(row + (int64_t)t * VEC + c));
        x[r][c] = v.x; x[r][c + 1] = v.y; x[r][c + 2] = v.z; x[r][c + 3] = v.w;
      } else {
        x[r][c] = t < nvec ? __ldcg(row + (int64_t)t * VEC + c) : 0.f;
      }
    }
  }
}

}  // namespace dfgnn
