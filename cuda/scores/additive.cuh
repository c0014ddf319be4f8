// GAT's additive score (GATConv, paper §5.1 "add-SDDMM"):
//   s_ij = LeakyReLU(a_dst_i + a_src_j),  value x_j,
// with the per-node terms a_dst = a_dst^T W x_i, a_src = a_src^T W x_j computed
// densely ([N, H]). A score of per-node scalars: its walks (kernels/gat_forward.cu,
// gat_backward.cu) weigh one edge per lane and split the backward by the
// LeakyReLU branch, so they are their own walk policy, not the row walks of
// scores/score.cuh; this functor is what they ask of the score per node and edge.
#pragma once

#include <cstdint>

#include "device/numerics.cuh"

namespace dfgnn {

template <typename T> struct AdditiveScore {
  const T* a_dst;  // [N_dst, H]
  const T* a_src;  // [N_src, H]
  float slope;     // LeakyReLU's negative slope

  // The per-node terms of destination i and source j, gathered per edge.
  __device__ __forceinline__ float dst_term(int64_t i, int h, int H) const {
    return to_float(__ldg(a_dst + i * H + h));
  }
  __device__ __forceinline__ float src_term(int64_t j, int h, int H) const {
    return to_float(__ldg(a_src + j * H + h));
  }
  // The terms of the walk's own row, once per work item: plain loads, as the
  // walks have always read them (with __ldg, ptxas allocated the fp16 / bf16
  // scalar-row forward with dropout 63 registers instead of 48).
  __device__ __forceinline__ float own_dst_term(int64_t i, int h, int H) const {
    return to_float(a_dst[i * H + h]);
  }
  __device__ __forceinline__ float own_src_term(int64_t j, int h, int H) const {
    return to_float(a_src[j * H + h]);
  }
  // The base-2 score of the pre-activation a_dst_i + a_src_j (gat_score2: rounded
  // once, so forward and backward see the same value).
  __device__ __forceinline__ float score2(float pre) const { return gat_score2(pre, slope); }
  // The LeakyReLU's branch at the pre-activation: derivative 1 where true, else
  // the slope.
  __device__ __forceinline__ static bool positive(float pre) { return pre > 0.f; }
};

}  // namespace dfgnn
