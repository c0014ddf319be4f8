// D_i = dO_i . O_i in fp32 for an fp16 / bf16 backward (row_backward.cuh), a
// template over the score (scores/score.cuh), without O_i itself:
//   D_i = sum_j P'_ij (dO_i . value_j),  P'_ij = z_ij exp2(s_ij - lse2_i),
// the forward's fp32 accumulator dotted with dO_i, from the half inputs as they
// are. Where the dP_ij of a row are close (duplicate or similar neighbours) dS
// keeps only their difference with D_i, and with O_i rounded to fp16 / bf16
// that difference loses most of its bits (dK off by a median 1.2e-2 relative on
// a small graph with duplicate edges, against 2e-7 with O_i in fp32). One pass
// over the CSR work items like the dq walk's (the same scores, lse2 and dropout
// mask), keeping one float per (row, head) instead of a dQ row.
#pragma once

#include "device/dropout.cuh"
#include "device/edge_walk.cuh"
#include "device/lane_group.cuh"
#include "device/work_items.cuh"
#include "kernels/score_walk.cuh"

namespace dfgnn {

// Each lane keeps its share of sum_j P'_ij (dO_i . value_j) over its slice of
// the row: only the scores are reduced over the group per step, the dP share of
// an edge needs no reduction before it is weighted. With dropout, lane u of the
// group draws edge e0 + u's mask bit and one ballot hands the step's U bits to
// every lane (one hash per lane and step instead of U; the U hashes per lane
// spill 8-16 bytes in the 16-byte fp16 / bf16 shapes). An item of a split row
// (slot >= 0) writes its partial to partial [num_slots, H]. in...: the score's
// Params fields (scores/score.cuh).
template <typename Score, bool DROPOUT, typename... A>
__global__ void __launch_bounds__(256)
row_bwd_dsum_kernel(const typename Score::T* __restrict__ dout, const float* __restrict__ lse2,
                    const int* __restrict__ rowptr, const int* __restrict__ col,
                    const int* __restrict__ items, int chunk, float* __restrict__ dsum,
                    float* __restrict__ partial, int64_t n_units, int H, int C, float p,
                    uint64_t seed, A... in) {
  const typename Score::Params sp{in...};
  using S = typename Score::Shape;
  using T = typename S::T;
  constexpr int VEC = S::VEC, G = S::G, NV = S::NV;
  constexpr int U = edges_in_flight<VEC, NV>();
  static_assert(U <= G, "lane u of the group draws edge e0 + u's dropout mask bit");
  using P = typename Packed<T, VEC>::type;
  GroupItem g;
  if (!group_item<G>(items, rowptr, chunk, n_units, H, g)) return;
  const int gl = g.gl, h = g.h;
  const int64_t i = g.row;
  const int nvec = C / VEC;
  const int64_t HC = (int64_t)H * C, head_off = (int64_t)h * C;
  const int64_t off_i = i * HC + head_off;

  const typename Score::Dst dst(sp, RowAt{i, h, H, off_i, head_off, gl, nvec});
  float gf[NV][VEC];
  load_row<T, VEC, G, NV>(dout + off_i, gl, nvec, gf);
  const float L = lse2[i * H + h];
  const float zs = DROPOUT ? 1.f / (1.f - p) : 1.f;  // a kept weight's multiplier
  const int lane0 = (threadIdx.x & 31) & ~(G - 1);   // the group's first lane in the warp
  float d = 0.f;

  NbrPipe<U, kIndexAhead<T>> nb(col, g.beg, g.end);
  for_each_step<U, kFullStepsInBackward<T, G>>(g.beg, g.end, [&](int e0, auto full) {
    constexpr bool FULL = decltype(full)::value;
    int j[U];
    P kf[U][NV];
    [[maybe_unused]] P vf[U][NV], ef[U][NV];
    [[maybe_unused]] float sc[U];
    float s[U], dp[U];  // scores (group sums), this lane's share of dO . value
    nb.take(e0, j);
    gather_src_rows<Score, U, FULL>(sp, j, e0, h, H, HC, head_off, gl, nvec, kf, vf, ef, sc);
    lane_scores_dp<Score, U, FULL>(dst, gf, j, kf, vf, ef, s, dp);
    unsigned keep = ~0u;  // bit u: edge e0 + u is kept
    if constexpr (DROPOUT)
      keep = __ballot_sync(g.mask, dropout_keep(p, seed, (uint64_t)(e0 + gl) * H + h)) >> lane0;
    group_sum_many<G, U>(s, g.mask);
#pragma unroll
    for (int u = 0; u < U; ++u)
      if ((FULL || j[u] >= 0) && (keep >> u & 1u))
        d = fmaf(exp2f(dst.finish(s[u], src_scalar_of<Score>(j[u], sc, u)) - L) * zs, dp[u], d);
  });
  d = group_sum<G>(d, g.mask);
  if (gl == 0) {
    if (g.slot < 0) dsum[i * H + h] = d;
    else partial[(int64_t)g.slot * H + h] = d;
  }
}

}  // namespace dfgnn
