// Attention dropout, counter-based: the backward regenerates the forward's mask
// from the seed, no mask is stored.
#pragma once

#include <cstdint>

namespace dfgnn {

// Counter-based: keep(seed, e * H + h) depends only on the seed and the CSR edge
// position, so the backward (CSR or CSC walk) regenerates the forward's mask.
__device__ __forceinline__ uint64_t mix64(uint64_t z) {  // splitmix64 finaliser
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

// Uniform in [0, 1) with 24 random bits.
__device__ __forceinline__ float uniform01(uint64_t seed, uint64_t counter) {
  const uint64_t r = mix64(seed + 0x9e3779b97f4a7c15ULL * (counter + 1));
  return (float)(r >> 40) * (1.0f / 16777216.0f);
}

// Whether the weight of `counter` is kept (multiplied by 1 / (1 - p)).
__device__ __forceinline__ bool dropout_keep(float p, uint64_t seed, uint64_t counter) {
  return uniform01(seed, counter) >= p;
}

// Multiplier applied to a post-softmax weight: 0 (dropped) or 1 / (1 - p).
__device__ __forceinline__ float dropout_scale(float p, uint64_t seed, uint64_t counter) {
  return dropout_keep(p, seed, counter) ? 1.0f / (1.0f - p) : 0.0f;
}

}  // namespace dfgnn
