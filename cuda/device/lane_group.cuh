// Reductions over a lane group, the G consecutive lanes that own one row.
#pragma once

namespace dfgnn {

// A group of G consecutive lanes (G a power of two <= 32) owns one (node, head)
// row. Every lane of a group runs the same trip counts, so shuffles use the
// group's own mask and groups of one warp may diverge from each other.
template <int G> __device__ __forceinline__ unsigned group_mask() {
  if constexpr (G == 32) {
    return 0xffffffffu;
  } else {
    const unsigned lane = threadIdx.x & 31u;
    return ((1u << G) - 1u) << (lane & ~(unsigned)(G - 1));
  }
}

template <int G> __device__ __forceinline__ float group_sum(float x, unsigned mask) {
#pragma unroll
  for (int o = G / 2; o > 0; o >>= 1) x += __shfl_xor_sync(mask, x, o);
  return x;
}

// Sums each of K values over the group and leaves all K sums in every lane:
// a reduce-scatter (each halving step ships half of the remaining values), the
// plain butterfly on what is left, then a broadcast of each sum from its owner.
// 2K - 1 + log2(G / K) shuffles instead of K log2(G): 10 instead of 20 for four
// scores over a warp, 17 instead of 40 for the backward's eight. Shuffles, not
// FMAs, bound the issue rate of the per-edge dot products.
template <int G, int K>
__device__ __forceinline__ void group_sum_many(float* x, unsigned mask) {
  if constexpr (K == 1) {
    x[0] = group_sum<G>(x[0], mask);
  } else if constexpr (K > G) {
    group_sum_many<G, K / 2>(x, mask);
    group_sum_many<G, K / 2>(x + K / 2, mask);
  } else {
    static_assert((K & (K - 1)) == 0, "K must be a power of two");
    const int lane = threadIdx.x & (G - 1);
#pragma unroll
    for (int m = K, o = G / 2; m > 1; m >>= 1, o >>= 1) {
      const bool hi = lane & o;  // keeps the upper half, ships the lower one
#pragma unroll
      for (int k = 0; k < m / 2; ++k) {
        const float send = hi ? x[k] : x[k + m / 2];
        const float keep = hi ? x[k + m / 2] : x[k];
        x[k] = keep + __shfl_xor_sync(mask, send, o);
      }
    }
    // x[0] is now a partial of value lane / (G / K) over the lanes that differ in
    // the upper bits; finish it over the lower bits.
#pragma unroll
    for (int o = G / (2 * K); o > 0; o >>= 1) x[0] += __shfl_xor_sync(mask, x[0], o);
    const float mine = x[0];
#pragma unroll
    for (int k = 0; k < K; ++k) x[k] = __shfl_sync(mask, mine, k * (G / K), G);
  }
}

template <int G> __device__ __forceinline__ float group_max(float x, unsigned mask) {
#pragma unroll
  for (int o = G / 2; o > 0; o >>= 1) x = fmaxf(x, __shfl_xor_sync(mask, x, o));
  return x;
}

}  // namespace dfgnn
