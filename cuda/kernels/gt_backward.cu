// Backward pass of dot-product attention (paper §4.3, Appendix B, Fig. 8).
//
// Nothing of size E x C is saved: the forward keeps only lse2 [N_dst, H] and the
// scores are recomputed. With D_i = dO_i . O_i (= sum_j P'_ij dP_ij, P' the
// dropped-out weights) the softmax backward is dS_ij = P_ij (z_ij dP_ij - D_i),
// where z_ij is 0 or 1 / (1 - p) from the regenerated dropout mask.
//
//   dq kernel (CSR, node-parallel over dst): SDDMM (q.k and dO.v), softmax
//     backward and the SpMM dQ_i = scale * sum_j dS_ij k_j fused in one pass;
//     it also writes each edge's (P'_ij, dS_ij), 8 bytes per edge and head
//     (O(E H), freed when the backward returns).
//   dkv kernel (CSC, node-parallel over src): dV_j = sum_i P'_ij dO_i and
//     dK_j = scale * sum_i dS_ij q_i, an SpMM with those two weights per edge,
//     read through the cached CSC permutation (PubMed's backward kernels: 71.4 us
//     in one launch, which recomputes the weights, against 29.2 + 26.1).
// dQ, dK and dV rows may lie further apart than H * C (ld_q, ld_kv): column slices of
// the GT projections' joined gradient (gt_bwd_into, glue/autograd.cpp).
// Each output row is owned by one lane group: no atomics, deterministic. On small
// graphs both walks run in one launch and the dkv groups recompute the weights,
// each with the D_i it needs (gt_bwd_one_launch_kernel).
#include "device/dropout.cuh"
#include "device/edge_walk.cuh"
#include "device/fragments.cuh"
#include "device/lane_group.cuh"
#include "device/numerics.cuh"
#include "device/split_merge.cuh"
#include "device/work_items.cuh"
#include "host/dispatch.cuh"
#include "host/ops.h"
#include "host/scratch.h"
#include "host/split_merge.h"

namespace dfgnn {
namespace {


// SAVE: also writes each edge's (P'_ij, dS_ij) to pds [E, H] (CSR order) for the
// two-launch dkv kernel.
template <typename T, int VEC, int G, int NV, bool DROPOUT, bool SAVE>
__device__ __forceinline__ void gt_bwd_dq(
          const T* __restrict__ dout, const T* __restrict__ q, const T* __restrict__ k,
          const T* __restrict__ v, const T* __restrict__ out, const float* __restrict__ lse2,
          const float* __restrict__ dsum, const int* __restrict__ rowptr,
          const int* __restrict__ col, const int* __restrict__ items, int chunk,
          T* __restrict__ dq, int64_t ld_q,
          float* __restrict__ partial, float2* __restrict__ pds, int64_t n_units, int H,
          int C, float scale, float scale2, float p, uint64_t seed,
          int* __restrict__ counters, unsigned block) {
  constexpr int U = edges_in_flight<VEC, NV>();
  static_assert(U <= G, "SAVE stores edge e0 + u's pair from lane u of the group");
  using P = typename Packed<T, VEC>::type;
  GroupItem g;
  if (!group_item<G>(items, rowptr, chunk, n_units, H, g, block)) return;
  const int gl = g.gl, h = g.h, slot = g.slot, beg = g.beg, end = g.end;
  const unsigned mask = g.mask;
  const int64_t i = g.row;
  const int nvec = C / VEC;
  const int64_t HC = (int64_t)H * C;
  const int64_t off_i = i * HC + (int64_t)h * C;

  float qf[NV][VEC], gf[NV][VEC], acc[NV][VEC];
  load_row<T, VEC, G, NV>(q + off_i, gl, nvec, qf);
  scale_frag(scale2, qf);
  load_row<T, VEC, G, NV>(dout + off_i, gl, nvec, gf);
  float D;
  if (dsum != nullptr) {
    D = __ldg(dsum + i * H + h);
  } else {
    load_row<T, VEC, G, NV>(out + off_i, gl, nvec, acc);  // acc holds O_i for a moment
    D = group_sum<G>(dot_frag(gf, acc), mask);  // each item recomputes it (cheap)
  }
  zero_frag(acc);
  const float L = lse2[i * H + h];

  NbrPipe<U, kIndexAhead<T>> nb(col, beg, end);
  for_each_step<U, kFullStepsInBackward<T, G>>(beg, end, [&](int e0, auto full) {
    constexpr bool FULL = decltype(full)::value;
    int j[U];
    P kf[U][NV], vf[U][NV];
    float sd[2 * U];  // scores q.k, then dP = dO.v
    float* s = sd;
    float* dp = sd + U;
    load_edge_rows<T, VEC, G, NV, U, kIndexAhead<T>, FULL>(nb, e0, k, v, HC, (int64_t)h * C, gl,
                                                           nvec, j, kf, vf);
#pragma unroll
    for (int u = 0; u < U; ++u) {
      s[u] = FULL || j[u] >= 0 ? dot_packed<T, VEC, NV>(qf, kf[u]) : 0.f;
      dp[u] = FULL || j[u] >= 0 ? dot_packed<T, VEC, NV>(gf, vf[u]) : 0.f;
    }
    group_sum_many<G, 2 * U>(sd, mask);
    // SAVE: lane u of the group keeps edge e0 + u's pair and stores it after the
    // loop (one address, one store per step: the per-edge stores inside the loop
    // cost 12 registers, a sixth of the fp32 kernel's resident warps).
    [[maybe_unused]] float2 mine = make_float2(0.f, 0.f);
#pragma unroll
    for (int u = 0; u < U; ++u) {
      if (FULL || j[u] >= 0) {
        const float pe = exp2f(s[u] - L);
        float z = 1.f;
        if constexpr (DROPOUT) z = dropout_scale(p, seed, (uint64_t)(e0 + u) * H + h);
        const float ds = pe * (z * dp[u] - D);
        if constexpr (SAVE) {
          if (gl == u) mine = make_float2(pe * z, ds);
        }
        axpy_packed<T, VEC, NV>(ds, kf[u], acc);
      }
    }
    if constexpr (SAVE) {
      if (gl < U && (FULL || e0 + gl < end)) pds[(int64_t)(e0 + gl) * H + h] = mine;
    }
  });
  if (slot < 0) {
    store_row<T, VEC, G, NV>(dq + i * ld_q + (int64_t)h * C, gl, nvec, acc, scale);
  } else {
    scale_frag(scale, acc);
    store_partial<VEC, G, NV>(partial + (int64_t)slot * HC + (int64_t)h * C, gl, nvec, acc);
    if constexpr (kMergeInBackward<T>) {
      if (counters != nullptr)
        merge_split_sums<T, VEC, G, NV, 1>(g, H, C, chunk, rowptr, counters, partial, dq,
                                           nullptr, nullptr, nullptr, nullptr, ld_q);
    }
  }
}

// The one-launch backward's CSC walk, which cannot wait for the dq walk: each
// edge's weights recomputed from q_i, dO_i, lse2_i and D_i (from dsum, else
// dO_i . O_i from a gathered O_i row).
template <typename T, int VEC, int G, int NV, bool DROPOUT>
__device__ __forceinline__ void gt_bwd_dkv_recompute(
           const T* __restrict__ dout, const T* __restrict__ q, const T* __restrict__ k,
           const T* __restrict__ v, const T* __restrict__ out, const float* __restrict__ lse2,
           const float* __restrict__ dsum, const int* __restrict__ colptr,
           const int* __restrict__ row, const int* __restrict__ perm,
           const int* __restrict__ items, int chunk, T* __restrict__ dk, T* __restrict__ dv,
           int64_t ld_kv, float* __restrict__ partial_dk, float* __restrict__ partial_dv, int64_t n_units,
           int H, int C, float scale, float scale2, float p, uint64_t seed,
           int* __restrict__ counters,
           unsigned block) {
  constexpr int U = edges_in_flight<VEC, NV>();
  using P = typename Packed<T, VEC>::type;
  GroupItem g;
  if (!group_item<G>(items, colptr, chunk, n_units, H, g, block)) return;
  const int gl = g.gl, h = g.h, slot = g.slot, beg = g.beg, end = g.end;
  const unsigned mask = g.mask;
  const int64_t j = g.row;
  const int nvec = C / VEC;
  const int64_t HC = (int64_t)H * C;
  const int64_t off_j = j * HC + (int64_t)h * C;

  float kf[NV][VEC], vf[NV][VEC], dk_acc[NV][VEC], dv_acc[NV][VEC];
  load_row<T, VEC, G, NV>(k + off_j, gl, nvec, kf);
  scale_frag(scale2, kf);
  load_row<T, VEC, G, NV>(v + off_j, gl, nvec, vf);
  zero_frag(dk_acc);
  zero_frag(dv_acc);
  NbrPipe<U, kIndexAhead<T>> nb(row, beg, end);
  for_each_step<U, kFullStepsInBackward<T, G>>(beg, end, [&](int e0, auto full) {
    constexpr bool FULL = decltype(full)::value;
    int i[U];
    P qf[U][NV], gf[U][NV];
    float sd[2 * U], lse_i[U], d_i[U];  // scores q.k, then dP = dO.v
    float* s = sd;
    float* dp = sd + U;
    load_edge_rows<T, VEC, G, NV, U, kIndexAhead<T>, FULL>(nb, e0, q, dout, HC, (int64_t)h * C,
                                                           gl, nvec, i, qf, gf);
    P of[U][NV];
    if (dsum == nullptr) {
#pragma unroll
      for (int u = 0; u < U; ++u)
        if (FULL || i[u] >= 0)
          load_packed<T, VEC, G, NV>(out + (int64_t)i[u] * HC + (int64_t)h * C, gl, nvec, of[u]);
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
      s[u] = FULL || i[u] >= 0 ? dot_packed<T, VEC, NV>(kf, qf[u]) : 0.f;
      dp[u] = FULL || i[u] >= 0 ? dot_packed<T, VEC, NV>(vf, gf[u]) : 0.f;
      if (dsum == nullptr) d_i[u] = FULL || i[u] >= 0 ? dot_packed2<T, VEC, NV>(gf[u], of[u]) : 0.f;
    }
    group_sum_many<G, 2 * U>(sd, mask);
    if (dsum == nullptr) group_sum_many<G, U>(d_i, mask);
#pragma unroll
    for (int u = 0; u < U; ++u) {
      if (FULL || i[u] >= 0) {
        const float pe = exp2f(s[u] - lse_i[u]);
        float z = 1.f;
        if constexpr (DROPOUT) z = dropout_scale(p, seed, (uint64_t)__ldg(perm + e0 + u) * H + h);
        axpy_packed<T, VEC, NV>(pe * z, gf[u], dv_acc);
        axpy_packed<T, VEC, NV>(pe * (z * dp[u] - d_i[u]), qf[u], dk_acc);
      }
    }
  });
  if (slot < 0) {
    const int64_t out_j = j * ld_kv + (int64_t)h * C;
    store_row<T, VEC, G, NV>(dk + out_j, gl, nvec, dk_acc, scale);
    store_row<T, VEC, G, NV>(dv + out_j, gl, nvec, dv_acc, 1.f);
  } else {
    scale_frag(scale, dk_acc);
    store_partial<VEC, G, NV>(partial_dk + (int64_t)slot * HC + (int64_t)h * C, gl, nvec,
                              dk_acc);
    store_partial<VEC, G, NV>(partial_dv + (int64_t)slot * HC + (int64_t)h * C, gl, nvec,
                              dv_acc);
    if constexpr (kMergeInBackward<T>) {
      if (counters != nullptr)
        merge_split_sums<T, VEC, G, NV>(g, H, C, chunk, colptr, counters, partial_dk, dk,
                                        partial_dv, dv, nullptr, nullptr, ld_kv);
    }
  }
}

// Two-launch backward, CSC walk over sources with the weights the dq kernel saved:
// dV_j = sum_i P'_ij dO_i and dK_j = scale * sum_i dS_ij q_i, an SpMM with two
// weights per edge (NbrTile: each lane loads its edge's (P', dS) through the CSC
// permutation, one tile ahead, and the steps take them by shuffle). Against
// recomputing them here (gt_bwd_dkv_recompute): no q.k and dO.v dot products and their
// group reductions, no lse / D gathers, no dropout mask.
template <typename S>
__global__ void __launch_bounds__(256)
gt_bwd_dkv_kernel(const typename S::T* __restrict__ dout, const typename S::T* __restrict__ q,
                  const float2* __restrict__ pds, const int* __restrict__ colptr,
                  const int* __restrict__ row, const int* __restrict__ perm,
                  const int* __restrict__ items, int chunk, typename S::T* __restrict__ dk,
                  typename S::T* __restrict__ dv, int64_t ld_kv, float* __restrict__ partial_dk,
                  float* __restrict__ partial_dv, int64_t n_units, int H, int C, float scale,
                  int n_edges, int* __restrict__ counters) {
  using T = typename S::T;
  constexpr int VEC = S::VEC, G = S::G, NV = S::NV;
  constexpr int U = edges_in_flight<VEC, NV>();
  using P = typename Packed<T, VEC>::type;
  GroupItem g;
  if (!group_item<G>(items, colptr, chunk, n_units, H, g)) return;
  const int gl = g.gl, h = g.h;
  const int64_t j = g.row;
  const int nvec = C / VEC;
  const int64_t HC = (int64_t)H * C, head_off = (int64_t)h * C;
  // Speculative like NbrTile's first tile: needs the edge position only, not the
  // item's end; masked by the neighbour (nt.cur < 0) before use.
  auto weights_of = [&](int e) {
    return e < n_edges ? __ldg(pds + (int64_t)__ldg(perm + e) * H + h) : make_float2(0.f, 0.f);
  };

  NbrTile<G, 1> nt(row, g.beg, g.end, gl, g.mask, n_edges);
  float2 cur = weights_of(g.beg + gl);
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
      nt.take(e0, i);
      nt.share(wv, e0, w_v);
      nt.share(wk, e0, w_k);
      gather_rows<T, VEC, G, NV, U>(i, dout, q, HC, head_off, gl, nvec, gf, qf);
#pragma unroll
      for (int u = 0; u < U; ++u) {
        if (i[u] >= 0) {
          axpy_packed<T, VEC, NV>(w_v[u], gf[u], dv_acc);
          axpy_packed<T, VEC, NV>(w_k[u], qf[u], dk_acc);
        }
      }
    }
    cur = next;
  }
  if (g.slot < 0) {
    const int64_t out_j = j * ld_kv + (int64_t)h * C;
    store_row<T, VEC, G, NV>(dk + out_j, gl, nvec, dk_acc, scale);
    store_row<T, VEC, G, NV>(dv + out_j, gl, nvec, dv_acc, 1.f);
  } else {
    scale_frag(scale, dk_acc);
    store_partial<VEC, G, NV>(partial_dk + (int64_t)g.slot * HC + head_off, gl, nvec, dk_acc);
    store_partial<VEC, G, NV>(partial_dv + (int64_t)g.slot * HC + head_off, gl, nvec, dv_acc);
    if constexpr (kMergeInBackward<T>) {
      if (counters != nullptr)
        merge_split_sums<T, VEC, G, NV>(g, H, C, chunk, colptr, counters, partial_dk, dk,
                                        partial_dv, dv, nullptr, nullptr, ld_kv);
    }
  }
}

template <typename S, bool DROPOUT>
__global__ void __launch_bounds__(256)
gt_bwd_dq_kernel(const typename S::T* __restrict__ dout, const typename S::T* __restrict__ q,
                 const typename S::T* __restrict__ k, const typename S::T* __restrict__ v,
                 const typename S::T* __restrict__ out, const float* __restrict__ lse2,
                 const float* __restrict__ dsum, const int* __restrict__ rowptr,
                 const int* __restrict__ col, const int* __restrict__ items, int chunk,
                 typename S::T* __restrict__ dq, int64_t ld_q, float* __restrict__ partial,
                 float2* __restrict__ pds, int64_t n_units, int H, int C, float scale, float scale2,
                 float p, uint64_t seed, int* __restrict__ counters) {
  using T = typename S::T;
  constexpr int VEC = S::VEC, G = S::G, NV = S::NV;
  gt_bwd_dq<T, VEC, G, NV, DROPOUT, true>(dout, q, k, v, out, lse2, dsum, rowptr, col, items, chunk,
                                          dq, ld_q, partial, pds, n_units, H, C, scale, scale2, p,
                                          seed, counters, blockIdx.x);
}

// Small graphs (the kernel plan's bwd_one_launch): the dq and dkv walks in one launch,
// the first dq_blocks blocks walking the CSR, the others the CSC, each dkv group
// recomputing its edges' weights (gt_bwd_dkv_recompute). Such a graph's backward
// is host-bound and its two kernels each fill a fraction of the GPU: one launch
// less on the host, and the two walks run side by side instead of one after the
// other. The split rows of the two walks merge with separate counters
// (counters_kv).
template <typename S, bool DROPOUT>
__global__ void __launch_bounds__(256)
gt_bwd_one_launch_kernel(const typename S::T* __restrict__ dout,
                         const typename S::T* __restrict__ q, const typename S::T* __restrict__ k,
                         const typename S::T* __restrict__ v, const typename S::T* __restrict__ out,
                         const float* __restrict__ lse2, const float* __restrict__ dsum,
                         const int* __restrict__ rowptr, const int* __restrict__ col,
                         const int* __restrict__ row_items, const int* __restrict__ colptr,
                         const int* __restrict__ row, const int* __restrict__ perm,
                         const int* __restrict__ col_items, int chunk,
                         typename S::T* __restrict__ dq, typename S::T* __restrict__ dk,
                         typename S::T* __restrict__ dv, int64_t ld_q, int64_t ld_kv,
                         float* __restrict__ partial_q,
                         float* __restrict__ partial_k, float* __restrict__ partial_v,
                         int64_t n_dst_units, int64_t n_src_units, int H, int C, float scale,
                         float scale2, float p, uint64_t seed, int* __restrict__ counters,
                         int* __restrict__ counters_kv, unsigned dq_blocks) {
  using T = typename S::T;
  constexpr int VEC = S::VEC, G = S::G, NV = S::NV;
  if (blockIdx.x < dq_blocks)
    gt_bwd_dq<T, VEC, G, NV, DROPOUT, false>(dout, q, k, v, out, lse2, dsum, rowptr, col, row_items,
                                             chunk, dq, ld_q, partial_q, nullptr, n_dst_units, H, C,
                                             scale, scale2, p, seed, counters, blockIdx.x);
  else
    gt_bwd_dkv_recompute<T, VEC, G, NV, DROPOUT>(dout, q, k, v, out, lse2, dsum, colptr, row, perm,
                                                 col_items, chunk, dk, dv, ld_kv, partial_k,
                                                 partial_v, n_src_units, H, C, scale, scale2,
                                                 p, seed, counters_kv, blockIdx.x - dq_blocks);
}

}  // namespace

std::tuple<at::Tensor, at::Tensor, at::Tensor> gt_backward_cuda(
    const at::Tensor& grad_out, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
    const at::Tensor& out, const at::Tensor& lse2, const LayoutView& L, double scale,
    double dropout, int64_t seed, bool one_launch, bool mma_plan, const GradsOut* into) {
  const at::Tensor &rowptr = L.rowptr, &col = L.col, &colptr = L.colptr, &row = L.row,
                   &perm = L.perm;
  const Work &rw = L.rw, &cw = L.cw;
  const int64_t chunk = L.chunk;
  const int64_t H = q.size(1), C = q.size(2), E = col.numel();
  // Given outputs may be column slices of a joined gradient (rows ld apart): the
  // vector stores need each of their rows on a 16-byte boundary too.
  auto rows_aligned16 = [](const at::Tensor& t) {
    return is_aligned16(t) && t.stride(0) * (int64_t)t.element_size() % 16 == 0;
  };
  const bool aligned = is_aligned16(q) && is_aligned16(k) && is_aligned16(v) &&
                       is_aligned16(out) && is_aligned16(grad_out) &&
                       (into == nullptr || (rows_aligned16(into->dq) &&
                                            rows_aligned16(into->dk) && rows_aligned16(into->dv)));
  // The plan's mma_backward: both walks on tensor cores (gt_backward_mma.cu),
  // the dq walk saving (P, dS) for the dkv walk as the CUDA-core one does. A warp
  // walks 8 whole rows or columns (the work items and their partials are unused:
  // a split row is one warp's), and the second walk needs the first one's weights.
  TORCH_CHECK(!mma_plan || (!one_launch && dropout == 0.0 &&
                            gt_backward_mma_supports(q.scalar_type(), C, true)),
              "dfgnn::gt_bwd: mma=True (the tensor-core walks) needs float16 / bfloat16, C "
              "in {32, 64, 128}, dropout 0 and one_launch=False, got one_launch=",
              one_launch ? "True" : "False", ", dropout=", std::to_string(dropout));
  // Rows that are not 16-byte aligned run the CUDA-core walks, as in the forward.
  const bool mma = mma_plan && aligned;
  // D_i = dO_i . O_i is the term the softmax backward subtracts from each dP_ij, and
  // where the dP_ij of a row are close (duplicate or similar neighbours) dS keeps
  // only their difference: with O_i rounded to fp16 / bf16 that difference loses
  // most of its bits (dK off by a median 1.2e-2 relative on a small graph with
  // duplicate edges, against 2e-7 with O_i in fp32). For half inputs D therefore
  // comes from gt_backward_dsum, sum_j P'_ij (dO_i . v_j) in fp32 over the half
  // inputs, which is dO_i . O_i with O_i as the forward accumulated it, and needs
  // no fp32 O_i: a second forward on fp32 copies of q, k, v, with dO . O32, costs
  // about 880 us of ogbn-arxiv's 1.85 ms bf16 fwd+bwd (1 x 128; fp32: 1.70 ms).
  at::Tensor dsum_t;
  if (q.scalar_type() != at::kFloat && rowptr.size(0) > 1)
    dsum_t = gt_backward_dsum(grad_out, q, k, v, lse2, L, scale, dropout, seed);  // [N_dst, H]
  const float* dsum = dsum_t.defined() ? dsum_t.data_ptr<float>() : nullptr;
  // The split rows' partial dQ, dK, dV rows and, in two launches, the dq kernel's
  // per-edge (P', dS) [E, H, 2] for the dkv kernel; small ones in dQ's allocation
  // (host/scratch.h).
  const int64_t q_slots = mma ? 0 : rw.num_slots, kv_slots = mma ? 0 : cw.num_slots;
  Scratch scratch({q_slots * H * C, kv_slots * H * C, kv_slots * H * C,
                   one_launch ? 0 : E * H * 2});
  at::Tensor dq;
  if (into != nullptr) {
    dq = into->dq;
    scratch.allocate(q.options());
  } else {
    dq = scratch.empty_with(q.sizes(), q.options());
  }
  // dK and dV are allocated after the dq kernel's launch in two launches: a small
  // graph's backward is host-bound, and their allocations then run while the dq
  // kernel does instead of before it.
  at::Tensor dk, dv;
  auto alloc_dkv = [&] {
    dk = into != nullptr ? into->dk : at::empty_like(k);
    dv = into != nullptr ? into->dv : at::empty_like(v);
  };
  float *part_q = scratch[0], *part_k = scratch[1], *part_v = scratch[2];
  float2* pds = reinterpret_cast<float2*>(scratch[3]);
  const float p = (float)dropout, sc = (float)scale, scale2 = (float)(scale * kLog2e);
  const bool drop = p > 0.f;
  auto stream = at::cuda::getCurrentCUDAStream();
  constexpr int kThreads = kNodeBlock;
  const int64_t n_dst_units = rw.items.size(0) * H, n_src_units = cw.items.size(0) * H;
  const BackwardCounters cnt = backward_split_counters(q.scalar_type(), rw, cw, H, one_launch);
  int *counters = cnt.csr, *counters_kv = cnt.csc;
  dispatch_rows(q.scalar_type(), C, aligned, "dfgnn::gt_bwd", [&](auto shape) {
    using S = decltype(shape);
    using T = typename S::T;
    constexpr int G = S::G;
    const int64_t dq_blocks = ceil_div(n_dst_units * G, kThreads);
    const int64_t dkv_blocks = ceil_div(n_src_units * G, kThreads);
    if (one_launch) {
      alloc_dkv();
      if (dq_blocks + dkv_blocks > 0) {
        auto kern = drop ? gt_bwd_one_launch_kernel<S, true> : gt_bwd_one_launch_kernel<S, false>;
        kern<<<dq_blocks + dkv_blocks, kThreads, 0, stream>>>(
            cptr<T>(grad_out), cptr<T>(q), cptr<T>(k), cptr<T>(v), cptr<T>(out),
            lse2.data_ptr<float>(), dsum, rowptr.data_ptr<int>(), col.data_ptr<int>(),
            rw.items.data_ptr<int>(), colptr.data_ptr<int>(), row.data_ptr<int>(),
            perm.data_ptr<int>(), cw.items.data_ptr<int>(), (int)chunk, mptr<T>(dq),
            mptr<T>(dk), mptr<T>(dv), dq.stride(0), dk.stride(0), part_q, part_k, part_v,
            n_dst_units, n_src_units, H, C,
            sc, scale2, p, (uint64_t)seed, counters, counters_kv, (unsigned)dq_blocks);
        check_launch();
      }
      return;
    }
    if (mma) {  // before dkv: it writes (P', dS)
      gt_backward_dq_mma(grad_out, q, k, v, lse2, dsum, L, dq, scratch[3], scale);
    } else if (dq_blocks > 0) {
      auto kern = drop ? gt_bwd_dq_kernel<S, true> : gt_bwd_dq_kernel<S, false>;
      kern<<<dq_blocks, kThreads, 0, stream>>>(
          cptr<T>(grad_out), cptr<T>(q), cptr<T>(k), cptr<T>(v), cptr<T>(out),
          lse2.data_ptr<float>(), dsum, rowptr.data_ptr<int>(), col.data_ptr<int>(),
          rw.items.data_ptr<int>(), (int)chunk, mptr<T>(dq), dq.stride(0), part_q, pds,
          n_dst_units, H, C,
          sc, scale2, p, (uint64_t)seed, counters);
      check_launch();
    }
    alloc_dkv();
    if (mma) {
      gt_backward_dkv_mma(grad_out, q, scratch[3], L, dk, dv, scale);
    } else if (dkv_blocks > 0) {
      gt_bwd_dkv_kernel<S><<<dkv_blocks, kThreads, 0, stream>>>(
          cptr<T>(grad_out), cptr<T>(q), pds, colptr.data_ptr<int>(), row.data_ptr<int>(),
          perm.data_ptr<int>(), cw.items.data_ptr<int>(), (int)chunk, mptr<T>(dk), mptr<T>(dv),
          dk.stride(0), part_k, part_v, n_src_units, H, C, sc, (int)E, counters_kv);
      check_launch();
    }
  });
  if (counters == nullptr && !mma) {  // the tensor-core walks write whole rows
    combine_partials(part_q, rw.num_slots, rw.combine, dq);
    combine_partials(part_k, cw.num_slots, cw.combine, dk);
    combine_partials(part_v, cw.num_slots, cw.combine, dv);
  }
  return {dq, dk, dv};
}

}  // namespace dfgnn
