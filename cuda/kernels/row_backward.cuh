// The CUDA-core backward walks of every score but the additive one (paper §4.3,
// Appendix B, Fig. 8), templates over the score (scores/score.cuh).
//
// Nothing of size E x C is saved: the forward keeps only lse2 [N_dst, H] and the
// scores are recomputed. With D_i = dO_i . O_i (= sum_j P'_ij dP_ij, P' the
// dropped-out weights, dP_ij = dO_i . value_j) the softmax backward is
// dS_ij = P_ij (z_ij dP_ij - D_i), where z_ij is 0 or 1 / (1 - p) from the
// regenerated dropout mask (dS in natural-log units).
//
//   dq walk (CSR, node-parallel over dst): the scores and dP, the softmax
//     backward and the destination side of the gradient, sum_j dS_ij ds_ij/dq_i
//     (dot: scale sum_j dS_ij k_j), fused in one pass; it also writes each
//     edge's (P'_ij, dS_ij), 8 bytes per edge and head (O(E H), freed when the
//     backward returns), and the score's parameter gradient per work item.
//   dkv walk (CSC, node-parallel over src): dV_j = sum_i P'_ij dO_i and the
//     source side sum_i dS_ij ds_ij/dk_j, an SpMM with those two weights per
//     edge, read through the cached CSC permutation (PubMed's backward kernels:
//     71.4 us in one launch, which recomputes the weights, against 29.2 + 26.1).
// dQ, dK and dV rows may lie further apart than H * C (ld_q, ld_kv): column
// slices of the GT projections' joined gradient (glue/projections.cpp).
// Each output row is owned by one lane group: no atomics, deterministic. On small
// graphs both walks run in one launch and the dkv groups recompute the weights,
// each with the D_i it needs (row_bwd_one_launch_kernel).
#pragma once

#include "device/dropout.cuh"
#include "device/edge_walk.cuh"
#include "device/lane_group.cuh"
#include "device/split_merge.cuh"
#include "device/work_items.cuh"
#include "host/dispatch.cuh"
#include "kernels/score_walk.cuh"

namespace dfgnn {

// The outputs of a backward walk and their split-row scratch: rows ld elements
// apart; partial [slots, H, C] floats.
template <typename T> struct WalkOut {
  T* a;             // dq (CSR walk) or dk (CSC walk)
  T* b;             // dv (CSC walk, where the score has a value row), else unused
  int64_t ld;
  float* partial_a;
  float* partial_b;
  T* e = nullptr;   // the CSR walk's edge-row gradient [E, H, C] (kEdgeRows; kEdgeTail [E, H, D])
};

// SAVE: also writes each edge's (P'_ij, dS_ij) to pds [E, H] (CSR order) for the
// two-launch dkv kernel. param: the score's parameter gradient, one fp32 [C] row
// per work item unit (kParamGrad), summed over the items afterwards.
template <typename Score, bool DROPOUT, bool SAVE>
__device__ __forceinline__ void row_bwd_dq(
    const typename Score::Params& sp, const typename Score::T* __restrict__ dout,
    const typename Score::T* __restrict__ out, const float* __restrict__ lse2,
    const float* __restrict__ dsum, const int* __restrict__ rowptr, const int* __restrict__ col,
    const int* __restrict__ items, int chunk, const WalkOut<typename Score::T>& o,
    float2* __restrict__ pds, float* __restrict__ param, int64_t n_units, int H, int C, float p,
    uint64_t seed, int* __restrict__ counters, unsigned block) {
  using S = typename Score::Shape;
  using T = typename S::T;
  constexpr int VEC = S::VEC, G = S::G, NV = S::NV;
  constexpr int U = edges_in_flight<VEC, NV>();
  static_assert(U <= G, "SAVE stores edge e0 + u's pair from lane u of the group");
  using P = typename Packed<T, VEC>::type;
  GroupItem g;
  if (!group_item<G>(items, rowptr, chunk, n_units, H, g, block)) return;
  const int gl = g.gl, h = g.h, slot = g.slot, beg = g.beg, end = g.end;
  const unsigned mask = g.mask;
  const int64_t i = g.row;
  const int nvec = C / VEC;
  const int64_t HC = (int64_t)H * C, head_off = (int64_t)h * C;
  const int64_t off_i = i * HC + head_off;

  const typename Score::Dst dst(sp, RowAt{i, h, H, off_i, head_off, gl, nvec});
  float gf[NV][VEC], acc[NV][VEC];
  [[maybe_unused]] float pg[NV][VEC];
  load_row<T, VEC, G, NV>(dout + off_i, gl, nvec, gf);
  float D;
  if (dsum != nullptr) {
    D = __ldg(dsum + i * H + h);
  } else {
    load_row<T, VEC, G, NV>(out + off_i, gl, nvec, acc);  // acc holds O_i for a moment
    D = group_sum<G>(dot_frag(gf, acc), mask);  // each item recomputes it (cheap)
  }
  zero_frag(acc);
  if constexpr (Score::kParamGrad) zero_frag(pg);
  const float L = lse2[i * H + h];

  NbrPipe<U, kIndexAhead<T>> nb(col, beg, end);
  for_each_step<U, kFullStepsInBackward<T, G>>(beg, end, [&](int e0, auto full) {
    constexpr bool FULL = decltype(full)::value;
    int j[U];
    P kf[U][NV];
    [[maybe_unused]] P vf[U][NV], ef[U][NV];
    [[maybe_unused]] float sc[U];
    float sd[2 * U];  // scores, then dP = dO . value
    float* s = sd;
    float* dp = sd + U;
    nb.take(e0, j);
    gather_src_rows<Score, U, FULL>(sp, j, e0, h, H, HC, head_off, gl, nvec, kf, vf, ef, sc);
    lane_scores_dp<Score, U, FULL>(dst, gf, j, kf, vf, ef, s, dp);
    group_sum_many<G, 2 * U>(sd, mask);
    // SAVE: lane u of the group keeps edge e0 + u's pair and stores it after the
    // loop (one address, one store per step: the per-edge stores inside the loop
    // cost 12 registers, a sixth of the fp32 kernel's resident warps).
    [[maybe_unused]] float2 mine = make_float2(0.f, 0.f);
#pragma unroll
    for (int u = 0; u < U; ++u) {
      if (FULL || j[u] >= 0) {
        const float pe = exp2f(dst.finish(s[u], src_scalar_of<Score>(j[u], sc, u)) - L);
        float z = 1.f;
        if constexpr (DROPOUT) z = dropout_scale(p, seed, (uint64_t)(e0 + u) * H + h);
        const float ds = pe * (z * dp[u] - D);
        if constexpr (SAVE) {
          if (gl == u) mine = make_float2(pe * z, ds);
        }
        if constexpr (kEdgeRowsOf<Score>) {
          // The edge row entered the key and the value: dE = dS ds/dk + P' dO_i
          // (the key alone with kEdgeInKeyOnly: dS ds/dk), whole in this item
          // (each edge lies in one item).
          float de[NV][VEC];
          if constexpr (kEdgeApartOf<Score>)
            dst.key_grad(ds, kf[u], ef[u], de);
          else
            dst.key_grad(ds, kf[u], de);
          if constexpr (!kEdgeInKeyOnlyOf<Score>) axpy_frag<VEC, NV>(pe * z, gf, de);
          store_edge_grad<Score>(o.e, sp, e0 + u, h, H, HC, head_off, gl, nvec, de);
        }
        if constexpr (kEdgeApartOf<Score>)
          dst.grad(ds, kf[u], ef[u], acc, pg);
        else
          dst.grad(ds, kf[u], acc, pg);
      }
    }
    if constexpr (SAVE) {
      if (gl < U && (FULL || e0 + gl < end)) pds[(int64_t)(e0 + gl) * H + h] = mine;
    }
  });
  if constexpr (Score::kParamGrad) store_partial<VEC, G, NV>(param + g.unit * C, gl, nvec, pg);
  const float mul = dst.finish_grad(sp, acc);
  if (slot < 0) {
    store_row<T, VEC, G, NV>(o.a + i * o.ld + head_off, gl, nvec, acc, mul);
  } else {
    scale_frag(mul, acc);
    store_partial<VEC, G, NV>(o.partial_a + (int64_t)slot * HC + head_off, gl, nvec, acc);
    if constexpr (kMergeInBackward<T>) {
      if (counters != nullptr)
        merge_split_sums<T, VEC, G, NV, 1>(g, H, C, chunk, rowptr, counters, o.partial_a, o.a,
                                           nullptr, nullptr, nullptr, nullptr, o.ld);
    }
  }
}

// A source row's gradients (dk times mul, and dv where the score has a value
// row) or its split-row partials, merged in the kernel where it carries the
// merge.
template <typename Score>
__device__ __forceinline__ void store_src_grads(const GroupItem& g, int H, int C, int chunk,
                                                const int* __restrict__ colptr,
                                                const WalkOut<typename Score::T>& o,
                                                float (&dk)[Score::NV][Score::VEC],
                                                const float (&dv)[Score::NV][Score::VEC],
                                                float mul, int* __restrict__ counters) {
  using S = typename Score::Shape;
  using T = typename S::T;
  constexpr int VEC = S::VEC, G = S::G, NV = S::NV;
  constexpr bool kTwo = kOwnValueRowOf<Score>;
  const int nvec = C / VEC;
  const int64_t HC = (int64_t)H * C, head_off = (int64_t)g.h * C;
  if (g.slot < 0) {
    const int64_t out_j = g.row * o.ld + head_off;
    store_row<T, VEC, G, NV>(o.a + out_j, g.gl, nvec, dk, mul);
    if constexpr (kTwo) store_row<T, VEC, G, NV>(o.b + out_j, g.gl, nvec, dv, 1.f);
  } else {
    scale_frag(mul, dk);
    store_partial<VEC, G, NV>(o.partial_a + (int64_t)g.slot * HC + head_off, g.gl, nvec, dk);
    if constexpr (kTwo)
      store_partial<VEC, G, NV>(o.partial_b + (int64_t)g.slot * HC + head_off, g.gl, nvec, dv);
    if constexpr (kMergeInBackward<T>) {
      if (counters != nullptr)
        merge_split_sums<T, VEC, G, NV>(g, H, C, chunk, colptr, counters, o.partial_a, o.a,
                                        kTwo ? o.partial_b : nullptr, o.b, nullptr, nullptr,
                                        o.ld);
    }
  }
}

// The one-launch backward's CSC walk, which cannot wait for the dq walk: each
// edge's weights recomputed from q_i, dO_i, lse2_i and D_i (from dsum, else
// dO_i . O_i from a gathered O_i row).
template <typename Score, bool DROPOUT>
__device__ __forceinline__ void row_bwd_dkv_recompute(
    const typename Score::Params& sp, const typename Score::T* __restrict__ dout,
    const typename Score::T* __restrict__ out, const float* __restrict__ lse2,
    const float* __restrict__ dsum, const int* __restrict__ colptr, const int* __restrict__ row,
    const int* __restrict__ perm, const int* __restrict__ items, int chunk,
    const WalkOut<typename Score::T>& o, int64_t n_units, int H, int C, float p, uint64_t seed,
    int* __restrict__ counters, unsigned block) {
  using S = typename Score::Shape;
  using T = typename S::T;
  constexpr int VEC = S::VEC, G = S::G, NV = S::NV;
  constexpr int U = edges_in_flight<VEC, NV>();
  using P = typename Packed<T, VEC>::type;
  GroupItem g;
  if (!group_item<G>(items, colptr, chunk, n_units, H, g, block)) return;
  const int gl = g.gl, h = g.h, beg = g.beg, end = g.end;
  const unsigned mask = g.mask;
  const int64_t j = g.row;
  const int nvec = C / VEC;
  const int64_t HC = (int64_t)H * C, head_off = (int64_t)h * C;

  const typename Score::Src src(sp, RowAt{j, h, H, j * HC + head_off, head_off, gl, nvec});
  float dk_acc[NV][VEC], dv_acc[NV][VEC];
  zero_frag(dk_acc);
  zero_frag(dv_acc);
  NbrPipe<U, kIndexAhead<T>> nb(row, beg, end);
  for_each_step<U, kFullStepsInBackward<T, G>>(beg, end, [&](int e0, auto full) {
    constexpr bool FULL = decltype(full)::value;
    int i[U];
    P qf[U][NV], gf[U][NV];
    float sd[2 * U], lse_i[U], d_i[U];  // scores, then dP = dO . value
    float* s = sd;
    float* dp = sd + U;
    nb.take(e0, i);
    gather_rows<T, VEC, G, NV, U, FULL>(i, Score::query_rows(sp), dout, HC, head_off, gl, nvec,
                                        qf, gf);
    P of[U][NV];
    if (dsum == nullptr) {
#pragma unroll
      for (int u = 0; u < U; ++u)
        if (FULL || i[u] >= 0)
          load_packed<T, VEC, G, NV>(out + (int64_t)i[u] * HC + head_off, gl, nvec, of[u]);
    }
    // The destination's row statistics are gathers too: issue them with the row
    // loads, not after the reductions (one more dependent L2 trip per step).
#pragma unroll
    for (int u = 0; u < U; ++u) {
      if (FULL || i[u] >= 0) lse_i[u] = __ldg(lse2 + (int64_t)i[u] * H + h);
      if (dsum != nullptr) d_i[u] = FULL || i[u] >= 0 ? __ldg(dsum + (int64_t)i[u] * H + h) : 0.f;
    }
#pragma unroll
    for (int u = 0; u < U; ++u) {
      s[u] = FULL || i[u] >= 0 ? src.partial(qf[u]) : 0.f;
      dp[u] = FULL || i[u] >= 0 ? dot_packed<T, VEC, NV>(src.value(), gf[u]) : 0.f;
      if (dsum == nullptr) d_i[u] = FULL || i[u] >= 0 ? dot_packed2<T, VEC, NV>(gf[u], of[u]) : 0.f;
    }
    group_sum_many<G, 2 * U>(sd, mask);
    if (dsum == nullptr) group_sum_many<G, U>(d_i, mask);
#pragma unroll
    for (int u = 0; u < U; ++u) {
      if (FULL || i[u] >= 0) {
        const float pe = exp2f(src.finish(s[u]) - lse_i[u]);
        float z = 1.f;
        if constexpr (DROPOUT) z = dropout_scale(p, seed, (uint64_t)__ldg(perm + e0 + u) * H + h);
        axpy_packed<T, VEC, NV>(pe * z, gf[u], dv_acc);
        src.grad(pe * (z * dp[u] - d_i[u]), qf[u], dk_acc);
      }
    }
  });
  const float mul = src.finish_grad(sp, dk_acc, dv_acc);
  store_src_grads<Score>(g, H, C, chunk, colptr, o, dk_acc, dv_acc, mul, counters);
}

// kEdgeInKeyOnly scores' CSC walk: the edge rows (CSR positions perm[e0 + u])
// beside the gathered query rows, where the source-side gradient reads
// q_i + e_ij (Src::grad of k_j against it, the two summed in fp32: the score is
// symmetric in the two).
template <typename Score, int U>
__device__ __forceinline__ void load_edge_rows(const typename Score::Params& sp, const int (&i)[U],
                                               const int* __restrict__ perm, int e0, int64_t HC,
                                               int64_t head_off, int gl, int nvec,
                                               PackedOf<typename Score::Shape> (&ef)[U][Score::NV]) {
#pragma unroll
  for (int u = 0; u < U; ++u)
    if (i[u] >= 0) load_edge_row<Score>(sp, __ldg(perm + e0 + u), HC, head_off, gl, nvec, ef[u]);
}

// Two-launch backward, CSC walk over sources with the weights the dq kernel saved:
// dV_j = sum_i P'_ij dO_i and the score's sum_i dS_ij ds_ij/dk_j, an SpMM with two
// weights per edge (NbrTile: each lane loads its edge's (P', dS) through the CSC
// permutation, one tile ahead, and the steps take them by shuffle). Against
// recomputing them here (row_bwd_dkv_recompute): no scores and dP and their
// group reductions, no lse / D gathers, no dropout mask. in...: the score's
// Params fields (scores/score.cuh).
template <typename Score, typename... A>
__global__ void __launch_bounds__(256)
row_bwd_dkv_kernel(const typename Score::T* __restrict__ dout, const float2* __restrict__ pds,
                   const int* __restrict__ colptr, const int* __restrict__ row,
                   const int* __restrict__ perm, const int* __restrict__ items, int chunk,
                   typename Score::T* __restrict__ dk, typename Score::T* __restrict__ dv,
                   int64_t ld_kv, float* __restrict__ partial_dk, float* __restrict__ partial_dv,
                   int64_t n_units, int H, int C, int n_edges, int* __restrict__ counters,
                   A... in) {
  const typename Score::Params sp{in...};
  const WalkOut<typename Score::T> o{dk, dv, ld_kv, partial_dk, partial_dv};
  using S = typename Score::Shape;
  using T = typename S::T;
  constexpr int VEC = S::VEC, G = S::G, NV = S::NV;
  constexpr int U = edges_in_flight<VEC, NV>();
  using P = typename Packed<T, VEC>::type;
  GroupItem g;
  if (!group_item<G>(items, colptr, chunk, n_units, H, g)) return;
  const int gl = g.gl, h = g.h;
  const int nvec = C / VEC;
  const int64_t HC = (int64_t)H * C, head_off = (int64_t)h * C;
  // kEdgeTail: keys and values have no tails ([N_src, H, C - D], score_walk.cuh),
  // so their gradients are rows of C - D channels, summed from the gathered rows'
  // channels before the tails alone.
  int c_kv = C;
  if constexpr (kEdgeTailOf<Score>) c_kv = C - Score::edge_width(sp);
  const int nvec_kv = c_kv / VEC;
  // Speculative like NbrTile's first tile: needs the edge position only, not the
  // item's end; masked by the neighbour (nt.cur < 0) before use.
  auto weights_of = [&](int e) {
    return e < n_edges ? __ldg(pds + (int64_t)__ldg(perm + e) * H + h) : make_float2(0.f, 0.f);
  };

  NbrTile<G, 1> nt(row, g.beg, g.end, gl, g.mask, n_edges);
  float2 cur = weights_of(g.beg + gl);
  const typename Score::SrcGrad src(sp, RowAt{g.row, h, H, g.row * HC + head_off, head_off, gl,
                                              nvec});
  float dk_acc[NV][VEC], dv_acc[NV][VEC];
  zero_frag(dk_acc);
  zero_frag(dv_acc);
  for (; nt.valid(); nt.advance()) {
    const float2 next = weights_of(nt.t0 + G + gl);
    const float wv = nt.cur >= 0 ? cur.x : 0.f, wk = nt.cur >= 0 ? cur.y : 0.f;
    const int te = nt.tile_end();
    for (int e0 = nt.t0; e0 < te; e0 += U) {
      int i[U];
      float w_v[U], w_k[U];
      P gf[U][NV], qf[U][NV];
      [[maybe_unused]] P ef[U][NV];
      nt.take(e0, i);
      nt.share(wv, e0, w_v);
      nt.share(wk, e0, w_k);
      gather_rows<T, VEC, G, NV, U>(i, dout, Score::query_rows(sp), HC, head_off, gl, nvec_kv,
                                    gf, qf);
      if constexpr (kEdgeInKeyOnlyOf<Score>) load_edge_rows<Score, U>(sp, i, perm, e0, HC,
                                                                     head_off, gl, nvec, ef);
#pragma unroll
      for (int u = 0; u < U; ++u) {
        if (i[u] >= 0) {
          axpy_packed<T, VEC, NV>(w_v[u], gf[u], dv_acc);
          if constexpr (kEdgeInKeyOnlyOf<Score>)
            src.grad(w_k[u], qf[u], ef[u], dk_acc);
          else
            src.grad(w_k[u], qf[u], dk_acc);
        }
      }
    }
    cur = next;
  }
  const float mul = src.finish_grad(sp, dk_acc, dv_acc);
  store_src_grads<Score>(g, H, c_kv, chunk, colptr, o, dk_acc, dv_acc, mul, counters);
}

template <typename Score, bool DROPOUT, typename... A>
__global__ void __launch_bounds__(256)
row_bwd_dq_kernel(const typename Score::T* __restrict__ dout,
                  const typename Score::T* __restrict__ out, const float* __restrict__ lse2,
                  const float* __restrict__ dsum, const int* __restrict__ rowptr,
                  const int* __restrict__ col, const int* __restrict__ items, int chunk,
                  typename Score::T* __restrict__ dq, int64_t ld_q, float* __restrict__ partial,
                  float2* __restrict__ pds, float* __restrict__ param,
                  typename Score::T* __restrict__ de, int64_t n_units, int H, int C, float p,
                  uint64_t seed, int* __restrict__ counters, A... in) {
  const typename Score::Params sp{in...};
  const WalkOut<typename Score::T> o{dq, nullptr, ld_q, partial, nullptr, de};
  row_bwd_dq<Score, DROPOUT, true>(sp, dout, out, lse2, dsum, rowptr, col, items, chunk, o, pds,
                                   param, n_units, H, C, p, seed, counters, blockIdx.x);
}

// Small graphs (the kernel plan's bwd_one_launch): the dq and dkv walks in one
// launch, the first dq_blocks blocks walking the CSR, the others the CSC, each
// dkv group recomputing its edges' weights (row_bwd_dkv_recompute). Such a
// graph's backward is host-bound and its two kernels each fill a fraction of the
// GPU: one launch less on the host, and the two walks run side by side instead
// of one after the other. The split rows of the two walks merge with separate
// counters (counters_kv).
template <typename Score, bool DROPOUT, typename... A>
__global__ void __launch_bounds__(256)
row_bwd_one_launch_kernel(const typename Score::T* __restrict__ dout,
                          const typename Score::T* __restrict__ out,
                          const float* __restrict__ lse2, const float* __restrict__ dsum,
                          const int* __restrict__ rowptr, const int* __restrict__ col,
                          const int* __restrict__ row_items, const int* __restrict__ colptr,
                          const int* __restrict__ row, const int* __restrict__ perm,
                          const int* __restrict__ col_items, int chunk,
                          typename Score::T* __restrict__ dq, typename Score::T* __restrict__ dk,
                          typename Score::T* __restrict__ dv, int64_t ld_q, int64_t ld_kv,
                          float* __restrict__ partial_q, float* __restrict__ partial_k,
                          float* __restrict__ partial_v, float* __restrict__ param,
                          int64_t n_dst_units, int64_t n_src_units, int H, int C, float p,
                          uint64_t seed, int* __restrict__ counters,
                          int* __restrict__ counters_kv, unsigned dq_blocks, A... in) {
  static_assert(!kEdgeRowsOf<Score>, "edge rows need the dq walk's saved weights (score.cuh)");
  const typename Score::Params sp{in...};
  if (blockIdx.x < dq_blocks)
    row_bwd_dq<Score, DROPOUT, false>(sp, dout, out, lse2, dsum, rowptr, col, row_items, chunk,
                                      WalkOut<typename Score::T>{dq, nullptr, ld_q, partial_q,
                                                                 nullptr},
                                      nullptr, param, n_dst_units, H, C, p, seed, counters,
                                      blockIdx.x);
  else
    row_bwd_dkv_recompute<Score, DROPOUT>(sp, dout, out, lse2, dsum, colptr, row, perm,
                                          col_items, chunk,
                                          WalkOut<typename Score::T>{dk, dv, ld_kv, partial_k,
                                                                     partial_v},
                                          n_src_units, H, C, p, seed, counters_kv,
                                          blockIdx.x - dq_blocks);
}

}  // namespace dfgnn
