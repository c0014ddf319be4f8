// Walking a work item's edges: the neighbour-index pipelines (NbrPipe, NbrTile),
// the row gathers of a step and the tile SpMM.
#pragma once

#include <cstdint>
#include <type_traits>
#include "device/fragments.cuh"

namespace dfgnn {

// Edges whose k / v rows a lane loads before the first use (all loads of a step
// are independent): 4 x 16 bytes per operand and lane, whatever the dtype. 8
// measured slower (more registers, fewer resident warps): fp32 rows of two vectors
// per lane with 4 edges took 176 registers in the tails' forward, 109 with 2, and
// ran 13 % slower. Scalar rows (VEC = 1, 4-byte loads) keep 4 edges.
template <int VEC, int NV> constexpr int edges_in_flight() {
  return VEC == 1 ? 4 : 4 / NV;
}

// The neighbour indices (col or row) of a work item. With AHEAD they are loaded
// one step of U edges ahead of their use: the next step's index loads go out
// together with this step's row gathers, so a step waits on one dependent memory
// round trip (the rows) instead of two (the indices, then the rows). On small
// graphs the longest item's chain of steps is the kernel time. It costs U to 13
// registers: free for the fp32 GT kernels and both backward families (same
// blocks per SM; 5-11 % faster fwd+bwd), a lost 256-thread block per SM for the
// packed fp16/bf16 kernels (GT forward bf16 up to 41 % slower) and for
// softmax_spmm, and 5-7 % slower in GAT's SMMF forward. With 64-thread blocks the
// bf16 GT forward goes from 24 to 20 warps per SM with it and is 3-10 % faster; the
// GT backward's bf16 kernels moved between 2 % faster and 3 % slower. kIndexAhead<T> picks for the backward kernels,
// kForwardIndexAhead<T, NV> for the SMMF forward.
template <int U, bool AHEAD> struct NbrPipe {
  const int* __restrict__ nbr;
  int end;
  int next[U];
  __device__ __forceinline__ NbrPipe(const int* __restrict__ nbr_, int beg, int end_)
      : nbr(nbr_), end(end_) {
    if constexpr (AHEAD) fetch(beg);
  }
  __device__ __forceinline__ void fetch(int e0) {
#pragma unroll
    for (int u = 0; u < U; ++u) next[u] = (e0 + u < end) ? __ldg(nbr + e0 + u) : -1;
  }
  // j = the neighbours of edges e0 .. e0 + U - 1 (-1 past the end); with AHEAD,
  // starts the loads of the next U.
  __device__ __forceinline__ void take(int e0, int (&j)[U]) {
    if constexpr (!AHEAD) fetch(e0);
#pragma unroll
    for (int u = 0; u < U; ++u) j[u] = next[u];
    if constexpr (AHEAD) fetch(e0 + U);
  }
};

// Calls step(e0, full) for the steps of U edges of an item's edges [beg, end):
// full = std::true_type where all U edges exist, so the step compiles out its
// per-edge existence tests (the bf16 GT forward's loop: 388 -> 309
// instructions), std::false_type for the item's last, partial step. SPLIT
// false: every step is a false_type step (the old loop), for kernels where
// the second copy of the step costs registers (kFullStepsInBackward).
template <int U, bool SPLIT = true, typename F>
__device__ __forceinline__ void for_each_step(int beg, int end, F&& step) {
  if constexpr (SPLIT) {
    int e0 = beg;
    for (; e0 + U <= end; e0 += U) step(e0, std::true_type{});
    if (e0 < end) step(e0, std::false_type{});
  } else {
    for (int e0 = beg; e0 < end; e0 += U) step(e0, std::false_type{});
  }
}

// The GT backward kernels split their steps (for_each_step) in fp32 with 32-lane
// groups only (C >= 128): there their registers stayed within 2 of the old
// loop's, while bf16 dkv went from 120 to 178 and the 8- and 16-lane fp32 dq from
// 80 to 96 (fewer resident blocks; not measured).
template <typename T, int G>
constexpr bool kFullStepsInBackward = std::is_same_v<T, float> && G == 32;

template <typename T> constexpr bool kIndexAhead = sizeof(T) == 4;
// The SMMF forward looks ahead in every dtype where a lane holds one vector per
// row (C <= 256 in fp16 / bf16); wider packed rows keep kIndexAhead (it took the
// C = 512 bf16 kernel from 128 to 146 registers, not measured).
template <typename T, int NV> constexpr bool kForwardIndexAhead = kIndexAhead<T> || NV == 1;

// The neighbour indices of a work item, one tile of G edges at a time: lane gl of
// the group holds the index of edge t0 + gl (one coalesced load per G edges, the
// next tile's issued a whole tile ahead), and a step of U edges takes its indices
// from their holders by shuffle. A step then waits on one memory round trip (the
// rows), like NbrPipe's look-ahead, for two registers instead of U to 2U, and a
// per-edge scalar (weight, score, dropout multiplier) is computed once by the
// edge's holder lane instead of by every lane of the group (`share`). The forward
// kernels use it (docs/design.md, "GAT").
// DEPTH tiles of indices are in flight ahead of the current one (2 lets a kernel
// gather a per-neighbour scalar one tile ahead: GAT's a_src).
// `avail` (the number of edges of the whole graph) makes the constructor's loads
// speculative: they need only the item's first edge, not its end (which comes from
// the row pointer, one more dependent round trip), and are masked once the end is
// known; `raw` is this lane's first-tile neighbour before that mask, for a gather
// that should not wait for the row pointer either (GAT's a_src). The same in
// NbrPipe's first step measured 1 % slower in the GT forward.
template <int G, int DEPTH = 1> struct NbrTile {
  const int* __restrict__ nbr;
  int end, gl;
  unsigned mask;
  int t0;            // first edge of the current tile
  int raw;           // this lane's neighbour in the first tile, unmasked (-1 past avail)
  int cur;           // this lane's neighbour in the current tile (-1 past the end)
  int ahead[DEPTH];  // ... and in the next DEPTH tiles
  __device__ __forceinline__ NbrTile(const int* __restrict__ nbr_, int beg, int end_, int gl_,
                                     unsigned mask_, int avail)
      : nbr(nbr_), end(end_), gl(gl_), mask(mask_), t0(beg) {
    raw = speculate(beg, avail);
    cur = beg + gl < end ? raw : -1;
#pragma unroll
    for (int d = 0; d < DEPTH; ++d) {
      const int t = beg + (d + 1) * G;
      const int v = speculate(t, avail);
      ahead[d] = t + gl < end ? v : -1;
    }
  }
  __device__ __forceinline__ int speculate(int t, int avail) const {
    return t + gl < avail ? __ldg(nbr + t + gl) : -1;
  }
  __device__ __forceinline__ int load(int t) const { return speculate(t, end); }
  __device__ __forceinline__ bool valid() const { return t0 < end; }
  __device__ __forceinline__ int tile_end() const { return min(t0 + G, end); }
  // This lane's edge in the current tile.
  __device__ __forceinline__ int edge() const { return t0 + gl; }
  __device__ __forceinline__ void advance() {
    t0 += G;
    cur = ahead[0];
#pragma unroll
    for (int d = 0; d + 1 < DEPTH; ++d) ahead[d] = ahead[d + 1];
    ahead[DEPTH - 1] = load(t0 + DEPTH * G);
  }
  // Neighbours of edges e0 .. e0 + U - 1 of the current tile (-1 past the end).
  template <int U> __device__ __forceinline__ void take(int e0, int (&j)[U]) const {
#pragma unroll
    for (int u = 0; u < U; ++u) j[u] = __shfl_sync(mask, cur, e0 - t0 + u, G);
  }
  // The per-edge values v (held by each edge's lane) of edges e0 .. e0 + U - 1.
  template <int U> __device__ __forceinline__ void share(float v, int e0, float (&out)[U]) const {
#pragma unroll
    for (int u = 0; u < U; ++u) out[u] = __shfl_sync(mask, v, e0 - t0 + u, G);
  }
};

// Two rows (k and v, or q and dO) of each of U neighbours j[u] (< 0: none), every
// load issued before any is used.
// FULL: all U edges exist (j[u] >= 0 is known, not tested).
template <typename T, int VEC, int G, int NV, int U, bool FULL = false>
__device__ __forceinline__ void gather_rows(const int (&j)[U], const T* __restrict__ a,
                                            const T* __restrict__ b, int64_t HC, int64_t head_off,
                                            int gl, int nvec,
                                            typename Packed<T, VEC>::type (&ra)[U][NV],
                                            typename Packed<T, VEC>::type (&rb)[U][NV]) {
#pragma unroll
  for (int u = 0; u < U; ++u) {
    if (FULL || j[u] >= 0) {
      const int64_t off = (int64_t)j[u] * HC + head_off;
      load_packed<T, VEC, G, NV>(a + off, gl, nvec, ra[u]);
      load_packed<T, VEC, G, NV>(b + off, gl, nvec, rb[u]);
    }
  }
}

// One row of each of U neighbours j[u] (< 0: none).
template <typename T, int VEC, int G, int NV, int U>
__device__ __forceinline__ void gather_row(const int (&j)[U], const T* __restrict__ a, int64_t HC,
                                           int64_t head_off, int gl, int nvec,
                                           typename Packed<T, VEC>::type (&ra)[U][NV]) {
#pragma unroll
  for (int u = 0; u < U; ++u)
    if (j[u] >= 0) load_packed<T, VEC, G, NV>(a + (int64_t)j[u] * HC + head_off, gl, nvec, ra[u]);
}

// The SpMM steps of one tile of NbrTile with K weights per edge: acc[k] +=
// w_e[k] x_e over the tile's edges, each step's neighbours and weights (this
// lane's edge's weights are wl) taken from their lanes by shuffle. K = 1: the
// GAT SMMF and PMF forwards; K = 2: the GAT backward's CSC walk (dx and the
// LeakyReLU'-weighted sum behind d a_src).
template <typename T, int VEC, int G, int NV, int U, int DEPTH, int K>
__device__ __forceinline__ void tile_spmm_k(const NbrTile<G, DEPTH>& nt, const float (&wl)[K],
                                            const T* __restrict__ x, int64_t HC, int64_t head_off,
                                            int gl, int nvec, float (&acc)[K][NV][VEC]) {
  using P = typename Packed<T, VEC>::type;
  const int te = nt.tile_end();
  for (int e0 = nt.t0; e0 < te; e0 += U) {
    int j[U];
    float w[K][U];
    P xf[U][NV];
    nt.take(e0, j);
#pragma unroll
    for (int k = 0; k < K; ++k) nt.share(wl[k], e0, w[k]);
    gather_row<T, VEC, G, NV, U>(j, x, HC, head_off, gl, nvec, xf);
#pragma unroll
    for (int u = 0; u < U; ++u) {
      if (j[u] >= 0) {
#pragma unroll
        for (int k = 0; k < K; ++k) axpy_packed<T, VEC, NV>(w[k][u], xf[u], acc[k]);
      }
    }
  }
}

template <typename T, int VEC, int G, int NV, int U, int DEPTH>
__device__ __forceinline__ void tile_spmm(const NbrTile<G, DEPTH>& nt, float wl,
                                          const T* __restrict__ x, int64_t HC, int64_t head_off,
                                          int gl, int nvec, float (&acc)[NV][VEC]) {
  const float w[1] = {wl};
  tile_spmm_k<T, VEC, G, NV, U>(nt, w, x, HC, head_off, gl, nvec,
                                reinterpret_cast<float(&)[1][NV][VEC]>(acc));
}

}  // namespace dfgnn
