// The SMMF forward of every score (paper §4.2; the additive score also has a
// tile walk of its own, scores/additive_forward.cu): one node-parallel kernel,
// a template over the score (scores/score.cuh).
//   out_i = sum_{j -> i} softmax_j(s_ij) value_j
// A group of G lanes owns one (dst, head) work item: the score prepares the
// destination's state once, edges are consumed U at a time with every gathered
// row of the step loaded before the first use, scores stay in registers and the
// softmax is online (running max / sum, flash-attention style), so any
// in-degree works in one pass with no score buffer. Scores are in base 2, so
// every exponential is one exp2; lse2 [N_dst, H] is what the backward keeps.
#pragma once

#include "device/edge_walk.cuh"
#include "device/lane_group.cuh"
#include "device/online_softmax.cuh"
#include "device/work_items.cuh"
#include "kernels/score_walk.cuh"

namespace dfgnn {

// UF > 0 overrides the edges in flight (the two-rows-per-warp shapes use 2,
// held to 3 blocks per SM like the default shape; they only run on calls without
// split rows, so their merge is compiled out).
// EXTRAS: the variant with attention dropout and attention weights
// (OnlineSoftmax), for calls that ask for either.
// MERGE: the variant that merges split rows in the kernel (with_merge_variant).
// out32: the rows in fp32 too, or nullptr (ForwardCall::out32 says when).
// in...: the fields of the score's Params, as separate arguments (scores/score.cuh,
// "A score's Params reach the kernels as separate arguments", says why).
template <typename Score, bool EXTRAS, int UF, bool MERGE, typename... A>
__global__ void __launch_bounds__(256, UF == 2 ? 3 : 0)
row_fwd_smmf_kernel(const int* __restrict__ rowptr, const int* __restrict__ col,
                    const int* __restrict__ items, int chunk, typename Score::T* __restrict__ out,
                    float* __restrict__ out32, float* __restrict__ lse2, float* __restrict__ attn,
                    float* __restrict__ partial, float* __restrict__ partial_ml, int64_t n_units,
                    int H, int C, float p, uint64_t seed, int* __restrict__ counters, A... in) {
  const typename Score::Params sp{in...};
  using S = typename Score::Shape;
  using T = typename S::T;
  constexpr int VEC = S::VEC, G = S::G, NV = S::NV;
  constexpr int U = UF ? UF : edges_in_flight<VEC, NV>();
  using P = typename Packed<T, VEC>::type;
  GroupItem g;
  if (!group_item<G>(items, rowptr, chunk, n_units, H, g)) return;
  const int gl = g.gl, h = g.h, beg = g.beg, end = g.end;
  const unsigned mask = g.mask;
  const int64_t i = g.row;
  const int nvec = C / VEC;
  const int64_t HC = (int64_t)H * C, head_off = (int64_t)h * C;

  const typename Score::Dst dst(sp, RowAt{i, h, H, i * HC + head_off, head_off, gl, nvec});
  OnlineSoftmax<T, VEC, G, NV, U, EXTRAS> os;
  NbrPipe<U, kForwardIndexAhead<T, NV>> nb(col, beg, end);
  // One step of U edges; FULL: all U exist (for_each_step).
  auto edge_step = [&](int e0, auto full) {
    constexpr bool FULL = decltype(full)::value;
    int j[U];
    float s[U];
    [[maybe_unused]] float sc[U];
    P kf[U][NV];
    [[maybe_unused]] P vf[U][NV], ef[U][NV];
    nb.take(e0, j);
    gather_src_rows<Score, U, FULL>(sp, j, e0, h, H, HC, head_off, gl, nvec, kf, vf, ef, sc);
    if constexpr (kKeyFreeOf<Score>) {  // no lane shares to sum: the score is per edge
#pragma unroll
      for (int u = 0; u < U; ++u) s[u] = dst.finish(0.f, src_scalar_of<Score>(j[u], sc, u));
    } else {
#pragma unroll
      for (int u = 0; u < U; ++u)
        s[u] = FULL || j[u] >= 0 ? key_partial<Score>(dst, kf[u], ef[u]) : 0.f;
      group_sum_many<G, U>(s, mask);
#pragma unroll
      for (int u = 0; u < U; ++u) s[u] = dst.finish(s[u], src_scalar_of<Score>(j[u], sc, u));
    }
    if constexpr (Score::kValueIsKey)
      os.template step<FULL>(j, s, kf, e0, H, h, p, seed, attn, gl);
    else if constexpr (kEdgeBesideOf<Score>)  // value_j + e_ij, summed in fp32
      os.template step<FULL>(j, s, vf, ef, e0, H, h, p, seed, attn, gl);
    else
      os.template step<FULL>(j, s, vf, e0, H, h, p, seed, attn, gl);
  };
  for_each_step<U>(beg, end, edge_step);
  os.template finish<MERGE && UF != 2>(g, H, C, chunk, rowptr, out, out32, lse2, attn, partial,
                                       partial_ml, counters);
}

}  // namespace dfgnn
