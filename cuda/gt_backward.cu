// Backward pass of dot-product attention (paper §4.3, Appendix B, Fig. 8).
//
// Nothing of size E x C is saved: the forward keeps only lse2 [N_dst, H] and the
// scores are recomputed. With D_i = dO_i . O_i (= sum_j P'_ij dP_ij, P' the
// dropped-out weights) the softmax backward is dS_ij = P_ij (z_ij dP_ij - D_i),
// where z_ij is 0 or 1 / (1 - p) from the regenerated dropout mask.
//
//   dq kernel (CSR, node-parallel over dst): SDDMM (q.k and dO.v), softmax
//     backward and the SpMM dQ_i = scale * sum_j dS_ij k_j fused in one pass;
//     it also writes D for the second kernel.
//   dkv kernel (CSC, node-parallel over src): dV_j = sum_i P'_ij dO_i and
//     dK_j = scale * sum_i dS_ij q_i, walking each source's out-edges through
//     the cached CSC permutation.
// Each output row is owned by one lane group: no atomics, deterministic. On small
// graphs both walks run in one launch and the dkv groups compute the D_i they
// need themselves (gt_bwd_one_launch_kernel).
#include <cstdlib>

#include "common.cuh"
#include "ops.h"

namespace dfgnn {
namespace {


template <typename T, int VEC, int G, int NV, bool DROPOUT>
__device__ __forceinline__ void gt_bwd_dq(
          const T* __restrict__ dout, const T* __restrict__ q, const T* __restrict__ k,
          const T* __restrict__ v, const T* __restrict__ out, const float* __restrict__ lse2,
          const int* __restrict__ rowptr, const int* __restrict__ col,
          const int* __restrict__ items, int chunk, T* __restrict__ dq,
          float* __restrict__ partial, float* __restrict__ dsum, int64_t n_units, int H, int C,
          float scale, float scale2, float p, uint64_t seed, int* __restrict__ counters,
          unsigned block) {
  constexpr int U = edges_in_flight<VEC, NV>();
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
  load_row<T, VEC, G, NV>(out + off_i, gl, nvec, acc);  // acc holds O_i for a moment
  load_row<T, VEC, G, NV>(dout + off_i, gl, nvec, gf);
  const float D = group_sum<G>(dot_frag(gf, acc), mask);  // each item recomputes it (cheap)
  if (gl == 0 && beg == g.row_beg) dsum[i * H + h] = D;
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
#pragma unroll
    for (int u = 0; u < U; ++u) {
      if (FULL || j[u] >= 0) {
        const float pe = exp2f(s[u] - L);
        float z = 1.f;
        if constexpr (DROPOUT) z = dropout_scale(p, seed, (uint64_t)(e0 + u) * H + h);
        axpy_packed<T, VEC, NV>(pe * (z * dp[u] - D), kf[u], acc);
      }
    }
  });
  if (slot < 0) {
    store_row<T, VEC, G, NV>(dq + off_i, gl, nvec, acc, scale);
  } else {
    scale_frag(scale, acc);
    store_partial<VEC, G, NV>(partial + (int64_t)slot * HC + (int64_t)h * C, gl, nvec, acc);
    if constexpr (kMergeInBackward<T>) {
      if (counters != nullptr)
        merge_split_sums<T, VEC, G, NV, 1>(g, H, C, chunk, rowptr, counters, partial, dq,
                                           nullptr, nullptr, nullptr, nullptr);
    }
  }
}

// OWN_D: D_i = dO_i . O_i computed here per edge from a gathered O_i row instead
// of read from dsum, so the kernel does not wait for the dq kernel (the
// small-graph backward runs both in one launch).
template <typename T, int VEC, int G, int NV, bool DROPOUT, bool OWN_D>
__device__ __forceinline__ void gt_bwd_dkv(
           const T* __restrict__ dout, const T* __restrict__ q, const T* __restrict__ k,
           const T* __restrict__ v, const T* __restrict__ out, const float* __restrict__ lse2,
           const float* __restrict__ dsum, const int* __restrict__ colptr,
           const int* __restrict__ row, const int* __restrict__ perm,
           const int* __restrict__ items, int chunk, T* __restrict__ dk, T* __restrict__ dv,
           float* __restrict__ partial_dk, float* __restrict__ partial_dv, int64_t n_units,
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
    [[maybe_unused]] P of[OWN_D ? U : 1][NV];
    if constexpr (OWN_D) {
#pragma unroll
      for (int u = 0; u < U; ++u)
        if (FULL || i[u] >= 0)
          load_packed<T, VEC, G, NV>(out + (int64_t)i[u] * HC + (int64_t)h * C, gl, nvec,
                                     of[u]);
    }
    // The destination's row statistics are gathers too: issue them with the row
    // loads, not after the reductions (one more dependent L2 trip per step).
#pragma unroll
    for (int u = 0; u < U; ++u) {
      if (FULL || i[u] >= 0) {
        lse_i[u] = __ldg(lse2 + (int64_t)i[u] * H + h);
        if constexpr (!OWN_D) d_i[u] = __ldg(dsum + (int64_t)i[u] * H + h);
      }
    }
#pragma unroll
    for (int u = 0; u < U; ++u) {
      s[u] = FULL || i[u] >= 0 ? dot_packed<T, VEC, NV>(kf, qf[u]) : 0.f;
      dp[u] = FULL || i[u] >= 0 ? dot_packed<T, VEC, NV>(vf, gf[u]) : 0.f;
      if constexpr (OWN_D)
        d_i[u] = FULL || i[u] >= 0 ? dot_packed2<T, VEC, NV>(gf[u], of[u]) : 0.f;
    }
    group_sum_many<G, 2 * U>(sd, mask);
    if constexpr (OWN_D) group_sum_many<G, U>(d_i, mask);
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
    store_row<T, VEC, G, NV>(dk + off_j, gl, nvec, dk_acc, scale);
    store_row<T, VEC, G, NV>(dv + off_j, gl, nvec, dv_acc, 1.f);
  } else {
    scale_frag(scale, dk_acc);
    store_partial<VEC, G, NV>(partial_dk + (int64_t)slot * HC + (int64_t)h * C, gl, nvec,
                              dk_acc);
    store_partial<VEC, G, NV>(partial_dv + (int64_t)slot * HC + (int64_t)h * C, gl, nvec,
                              dv_acc);
    if constexpr (kMergeInBackward<T>) {
      if (counters != nullptr)
        merge_split_sums<T, VEC, G, NV>(g, H, C, chunk, colptr, counters, partial_dk, dk,
                                        partial_dv, dv, nullptr, nullptr);
    }
  }
}

template <typename T, int VEC, int G, int NV, bool DROPOUT>
__global__ void __launch_bounds__(256)
gt_bwd_dq_kernel(const T* __restrict__ dout, const T* __restrict__ q, const T* __restrict__ k,
                 const T* __restrict__ v, const T* __restrict__ out, const float* __restrict__ lse2,
                 const int* __restrict__ rowptr, const int* __restrict__ col,
                 const int* __restrict__ items, int chunk, T* __restrict__ dq,
                 float* __restrict__ partial, float* __restrict__ dsum, int64_t n_units, int H,
                 int C, float scale, float scale2, float p, uint64_t seed,
                 int* __restrict__ counters) {
  gt_bwd_dq<T, VEC, G, NV, DROPOUT>(dout, q, k, v, out, lse2, rowptr, col, items, chunk, dq,
                                    partial, dsum, n_units, H, C, scale, scale2, p, seed,
                                    counters, blockIdx.x);
}

template <typename T, int VEC, int G, int NV, bool DROPOUT>
__global__ void __launch_bounds__(256)
gt_bwd_dkv_kernel(const T* __restrict__ dout, const T* __restrict__ q, const T* __restrict__ k,
                  const T* __restrict__ v, const float* __restrict__ lse2,
                  const float* __restrict__ dsum, const int* __restrict__ colptr,
                  const int* __restrict__ row, const int* __restrict__ perm,
                  const int* __restrict__ items, int chunk, T* __restrict__ dk,
                  T* __restrict__ dv, float* __restrict__ partial_dk, float* __restrict__ partial_dv,
                  int64_t n_units, int H, int C, float scale, float scale2, float p, uint64_t seed,
                  int* __restrict__ counters) {
  gt_bwd_dkv<T, VEC, G, NV, DROPOUT, false>(dout, q, k, v, nullptr, lse2, dsum, colptr, row,
                                            perm, items, chunk, dk, dv, partial_dk, partial_dv,
                                            n_units, H, C, scale, scale2, p, seed, counters,
                                            blockIdx.x);
}

// Small graphs (kOneLaunchBackwardMaxEdges): the dq and dkv walks in one launch,
// the first dq_blocks blocks walking the CSR, the others the CSC, each dkv group
// computing the D_i it needs itself (the dq groups still write dsum, which
// nothing reads then: a check would change the dq kernel's code). Such a graph's
// backward is host-bound and its two kernels each fill a fraction of the GPU: one
// launch less on the host, and the two walks run side by side instead of one
// after the other. The split rows of the two walks merge with separate counters
// (counters_kv).
template <typename T, int VEC, int G, int NV, bool DROPOUT>
__global__ void __launch_bounds__(256)
gt_bwd_one_launch_kernel(const T* __restrict__ dout, const T* __restrict__ q,
                         const T* __restrict__ k, const T* __restrict__ v,
                         const T* __restrict__ out, const float* __restrict__ lse2,
                         const int* __restrict__ rowptr, const int* __restrict__ col,
                         const int* __restrict__ row_items, float* __restrict__ dsum,
                         const int* __restrict__ colptr,
                         const int* __restrict__ row, const int* __restrict__ perm,
                         const int* __restrict__ col_items, int chunk, T* __restrict__ dq,
                         T* __restrict__ dk, T* __restrict__ dv, float* __restrict__ partial_q,
                         float* __restrict__ partial_k, float* __restrict__ partial_v,
                         int64_t n_dst_units, int64_t n_src_units, int H, int C, float scale,
                         float scale2, float p, uint64_t seed, int* __restrict__ counters,
                         int* __restrict__ counters_kv, unsigned dq_blocks) {
  if (blockIdx.x < dq_blocks)
    gt_bwd_dq<T, VEC, G, NV, DROPOUT>(dout, q, k, v, out, lse2, rowptr, col, row_items, chunk,
                                      dq, partial_q, dsum, n_dst_units, H, C, scale, scale2,
                                      p, seed, counters, blockIdx.x);
  else
    gt_bwd_dkv<T, VEC, G, NV, DROPOUT, true>(dout, q, k, v, out, lse2, nullptr, colptr, row,
                                             perm, col_items, chunk, dk, dv, partial_k,
                                             partial_v, n_src_units, H, C, scale, scale2, p,
                                             seed, counters_kv, blockIdx.x - dq_blocks);
}

// Graphs of fewer edges than this run the backward in one launch
// (gt_bwd_one_launch_kernel). Measured on the H100 (benchmarks/NOTES.md, v13.1,
// v17): backward GPU time on Cora 22.2 -> 15.3 us, fp32 and bf16 alike; on PubMed
// (89K edges), whose walks each fill the GPU, 71.9 -> 78.3 us, but PubMed's
// fwd+bwd step is host-bound there and one launch fewer won in the end-to-end
// A/B (fused fwd+bwd 0.100-0.180 ms two launches, 0.108-0.142 one), hence 2^17
// since v17. PYG_DFGNN_BWD_TWO_LAUNCHES in the environment turns it off, for
// comparisons and tests (read on each call: a scan of the environment, well
// under a microsecond).
constexpr int64_t kOneLaunchBackwardMaxEdges = int64_t(1) << 17;
bool use_one_launch_backward(int64_t n_edges) {
  return n_edges < kOneLaunchBackwardMaxEdges &&
         std::getenv("PYG_DFGNN_BWD_TWO_LAUNCHES") == nullptr;
}

}  // namespace

std::tuple<at::Tensor, at::Tensor, at::Tensor> gt_backward_cuda(
    const at::Tensor& grad_out, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
    const at::Tensor& out, const at::Tensor& lse2, const at::Tensor& rowptr, const at::Tensor& col,
    const Work& rw, const at::Tensor& colptr, const at::Tensor& row, const at::Tensor& perm,
    const Work& cw, int64_t chunk, double scale, double dropout, int64_t seed) {
  const int64_t N_dst = q.size(0), H = q.size(1), C = q.size(2);
  // D = rowsum(P * dP) [N_dst, H] and the split rows' partial dQ, dK, dV rows,
  // small ones in dQ's allocation (ops.h, Scratch).
  Scratch scratch({N_dst * H, rw.num_slots * H * C, cw.num_slots * H * C, cw.num_slots * H * C});
  auto dq = scratch.empty_with(q.sizes(), q.options());
  auto dk = at::empty_like(k);
  auto dv = at::empty_like(v);
  float *dsum = scratch[0], *part_q = scratch[1], *part_k = scratch[2], *part_v = scratch[3];
  const float p = (float)dropout, sc = (float)scale, scale2 = (float)(scale * kLog2e);
  const bool drop = p > 0.f;
  const bool aligned = is_aligned16(q) && is_aligned16(k) && is_aligned16(v) &&
                       is_aligned16(out) && is_aligned16(grad_out);
  auto stream = at::cuda::getCurrentCUDAStream();
  constexpr int kThreads = kNodeBlock;
  const int64_t n_dst_units = rw.items.size(0) * H, n_src_units = cw.items.size(0) * H;
  const bool one_launch = use_one_launch_backward(col.numel());
  const BackwardCounters cnt = backward_split_counters(q.scalar_type(), rw, cw, H, one_launch);
  int *counters = cnt.csr, *counters_kv = cnt.csc;
  dispatch_rows(q.scalar_type(), C, aligned, "dfgnn::gt_bwd", [&](auto T_, auto VEC_, auto G_,
                                                                 auto NV_) {
    using T = typename decltype(T_)::type;
    constexpr int VEC = decltype(VEC_)::value, G = decltype(G_)::value, NV = decltype(NV_)::value;
    const int64_t dq_blocks = ceil_div(n_dst_units * G, kThreads);
    const int64_t dkv_blocks = ceil_div(n_src_units * G, kThreads);
    if (one_launch) {
      if (dq_blocks + dkv_blocks > 0) {
        auto kern = drop ? gt_bwd_one_launch_kernel<T, VEC, G, NV, true>
                         : gt_bwd_one_launch_kernel<T, VEC, G, NV, false>;
        kern<<<dq_blocks + dkv_blocks, kThreads, 0, stream>>>(
            cptr<T>(grad_out), cptr<T>(q), cptr<T>(k), cptr<T>(v), cptr<T>(out),
            lse2.data_ptr<float>(), rowptr.data_ptr<int>(), col.data_ptr<int>(),
            rw.items.data_ptr<int>(), dsum, colptr.data_ptr<int>(), row.data_ptr<int>(),
            perm.data_ptr<int>(), cw.items.data_ptr<int>(), (int)chunk, mptr<T>(dq),
            mptr<T>(dk), mptr<T>(dv), part_q, part_k, part_v, n_dst_units, n_src_units, H, C,
            sc, scale2, p, (uint64_t)seed, counters, counters_kv, (unsigned)dq_blocks);
        check_launch();
      }
      return;
    }
    if (dq_blocks > 0) {  // before dkv: it writes D
      auto kern = drop ? gt_bwd_dq_kernel<T, VEC, G, NV, true> : gt_bwd_dq_kernel<T, VEC, G, NV, false>;
      kern<<<dq_blocks, kThreads, 0, stream>>>(
          cptr<T>(grad_out), cptr<T>(q), cptr<T>(k), cptr<T>(v), cptr<T>(out),
          lse2.data_ptr<float>(), rowptr.data_ptr<int>(), col.data_ptr<int>(),
          rw.items.data_ptr<int>(), (int)chunk, mptr<T>(dq),
          part_q, dsum, n_dst_units, H, C, sc, scale2, p,
          (uint64_t)seed, counters);
      check_launch();
    }
    if (dkv_blocks > 0) {
      auto kern = drop ? gt_bwd_dkv_kernel<T, VEC, G, NV, true> : gt_bwd_dkv_kernel<T, VEC, G, NV, false>;
      kern<<<dkv_blocks, kThreads, 0, stream>>>(
          cptr<T>(grad_out), cptr<T>(q), cptr<T>(k), cptr<T>(v), lse2.data_ptr<float>(),
          dsum, colptr.data_ptr<int>(), row.data_ptr<int>(),
          perm.data_ptr<int>(), cw.items.data_ptr<int>(), (int)chunk, mptr<T>(dk), mptr<T>(dv),
          part_k, part_v, n_src_units, H, C, sc, scale2, p,
          (uint64_t)seed, counters_kv);
      check_launch();
    }
  });
  if (counters == nullptr) {
    combine_partials(part_q, rw.num_slots, rw.combine, dq);
    combine_partials(part_k, cw.num_slots, cw.combine, dk);
    combine_partials(part_v, cw.num_slots, cw.combine, dv);
  }
  return {dq, dk, dv};
}

}  // namespace dfgnn
