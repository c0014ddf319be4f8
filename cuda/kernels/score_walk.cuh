// What the walks over a destination row's edges (the SMMF forward, D, the dq
// walk) gather per edge for a score (scores/score.cuh): its key row, its value
// row unless the key is the value, its per-source scalar, and its edge row
// (kEdgeRows), added to both, or with kEdgeBeside / kEdgeInKeyOnly handed beside
// the key row to the score's functors, which sum the two in fp32.
#pragma once

#include <cstdint>

#include "device/fragments.cuh"
#include "scores/score.cuh"

namespace dfgnn {

// The rows of U edges whose sources are j[u] (< 0: none) and whose CSR
// positions are e0 + u, every load issued before any is used; vf is left alone
// where the score sums its key rows, sc where it has no per-source scalar. A
// score's edge rows (kEdgeRows) land in ef and are added to kf and vf, or with
// kEdgeBeside / kEdgeInKeyOnly left there. FULL: all U edges exist (j[u] >= 0 is known, not
// tested).
template <typename Score, int U, bool FULL>
__device__ __forceinline__ void gather_src_rows(const typename Score::Params& sp, const int (&j)[U],
                                                int e0, int h, int H, int64_t HC, int64_t head_off,
                                                int gl, int nvec,
                                                PackedOf<typename Score::Shape> (&kf)[U][Score::NV],
                                                PackedOf<typename Score::Shape> (&vf)[U][Score::NV],
                                                PackedOf<typename Score::Shape> (&ef)[U][Score::NV],
                                                float (&sc)[U]) {
  using S = typename Score::Shape;
  using T = typename S::T;
  // A score with a per-source scalar tests every edge, also in full steps: with
  // the test compiled out the fp32 cosine kernels took up to 11 registers more
  // and spilled in three shapes.
  constexpr bool kKnown = FULL && !Score::kSrcScalar;
  constexpr bool kEdge = kEdgeRowsOf<Score>;
  // kEdgeInKeyOnly: the value is the key row as loaded (copied below).
  constexpr bool kKeyOnly = kEdgeInKeyOnlyOf<Score>;
  static_assert(!kKeyOnly || (kEdge && !Score::kValueIsKey),
                "kEdgeInKeyOnly: a score with edge rows that keeps its value row apart");
  // kEdgeTail: keys and values are the rows without the tails, [N_src, H, C - D]
  // (their last D channels would be zeros), loaded up to the tails' first vector
  // and zero past it.
  int64_t kv_row = HC, kv_off = head_off;
  int kv_nvec = nvec;
  if constexpr (kEdgeTailOf<Score>) {
    // The row stride is a kernel argument of its own: derived here as H (C - D),
    // the compiler wrote j H (C - D) + h (C - D) as (j H + h) (C - D), two
    // dependent wide multiplies before every gather.
    const int d = Score::edge_width(sp);
    kv_row = Score::key_stride(sp);
    kv_off = (int64_t)h * (nvec * S::VEC - d);
    kv_nvec = nvec - d / S::VEC;
  }
#pragma unroll
  for (int u = 0; u < U; ++u) {
    if (kKnown || j[u] >= 0) {
      const int64_t off = (int64_t)j[u] * kv_row + kv_off;
      load_packed<T, S::VEC, S::G, S::NV>(Score::key_rows(sp) + off, gl, kv_nvec, kf[u]);
      if constexpr (!Score::kValueIsKey && !kKeyOnly)
        load_packed<T, S::VEC, S::G, S::NV>(Score::value_rows(sp) + off, gl, kv_nvec, vf[u]);
      if constexpr (Score::kSrcScalar) sc[u] = Score::src_scalar(sp, j[u], h, H);
      if constexpr (kEdge) load_edge_row<Score>(sp, e0 + u, HC, head_off, gl, nvec, ef[u]);
    }
  }
  if constexpr (kKeyOnly) {
#pragma unroll
    for (int u = 0; u < U; ++u)
#pragma unroll
      for (int r = 0; r < Score::NV; ++r) vf[u][r] = kf[u][r];
  } else if constexpr (kEdge && !kEdgeBesideOf<Score>) {
#pragma unroll
    for (int u = 0; u < U; ++u) {
      if (FULL || j[u] >= 0) {
        add_packed<T, S::VEC, S::NV>(kf[u], ef[u]);
        if constexpr (!Score::kValueIsKey) add_packed<T, S::VEC, S::NV>(vf[u], ef[u]);
      }
    }
  }
}

// dst.partial at edge u's gathered key row: with kEdgeBeside / kEdgeInKeyOnly the
// edge row goes beside it (gather_src_rows).
template <typename Score, typename Dst, typename R>
__device__ __forceinline__ float key_partial(const Dst& dst, const R& kf, const R& ef) {
  if constexpr (kEdgeApartOf<Score>)
    return dst.partial(kf, ef);
  else
    return dst.partial(kf);
}

// This lane's shares of the U edges' scores s[u] (key_partial) and of dP =
// dO_i . value_j (dp[u], gf: the lane's fp32 slice of dO_i; with kEdgeBeside
// dO_i . (value_j + e_ij), the two dot products summed in fp32); 0 past the
// item's end.
template <typename Score, int U, bool FULL, typename Dst>
__device__ __forceinline__ void lane_scores_dp(
    const Dst& dst, const float (&gf)[Score::NV][Score::VEC], const int (&j)[U],
    const PackedOf<typename Score::Shape> (&kf)[U][Score::NV],
    const PackedOf<typename Score::Shape> (&vf)[U][Score::NV],
    const PackedOf<typename Score::Shape> (&ef)[U][Score::NV], float* s, float* dp) {
  using T = typename Score::T;
  constexpr int VEC = Score::VEC, NV = Score::NV;
#pragma unroll
  for (int u = 0; u < U; ++u) {
    s[u] = FULL || j[u] >= 0 ? key_partial<Score>(dst, kf[u], ef[u]) : 0.f;
    if constexpr (Score::kValueIsKey)
      dp[u] = FULL || j[u] >= 0 ? dot_packed<T, VEC, NV>(gf, kf[u]) : 0.f;
    else
      dp[u] = FULL || j[u] >= 0 ? dot_packed<T, VEC, NV>(gf, vf[u]) : 0.f;
    if constexpr (kEdgeBesideOf<Score>)
      if (FULL || j[u] >= 0) dp[u] += dot_packed<T, VEC, NV>(gf, ef[u]);
  }
}

// The per-source scalar finish() takes for edge u of a step, source j (< 0:
// none, its scalar was not gathered); 0 for scores without one.
template <typename Score, int U>
__device__ __forceinline__ float src_scalar_of(int j, const float (&sc)[U], int u) {
  if constexpr (Score::kSrcScalar) return j >= 0 ? sc[u] : 0.f;
  return 0.f;
}

}  // namespace dfgnn
