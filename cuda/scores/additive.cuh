// GAT's additive score (GATConv, paper §5.1 "add-SDDMM"):
//   s_ij = LeakyReLU(a_dst_i + a_src_j [+ a_edge_ij]),  value x_j,
// with the per-node terms a_dst = a_dst^T W x_i, a_src = a_src^T W x_j computed
// densely ([N, H]), and with edge features (AdditiveEdgeScore, GATConv's
// edge_dim) a per-edge term a_edge_ij = a_edge^T W_e e_ij ([E, H], CSR order). A
// score of scalars: its own walks (scores/additive_forward.cu, additive_backward.cu)
// weigh one edge per lane and split the backward by the LeakyReLU branch; these
// functors are what they ask of the score per node and edge, and the walks are
// templates over them (the edge term compiles away for AdditiveScore). The
// node-only score's forward also runs on the shared row walk (its functor is
// scores/additive_row.cuh), where the plan says so.
#pragma once

#include <cstdint>

#include "device/numerics.cuh"

namespace dfgnn {

// LeakyReLU of the additive score (at the pre-activation).
__device__ __forceinline__ float leaky_relu(float x, float slope) { return x > 0.f ? x : x * slope; }
// The score in base 2, rounded once: __fmul_rn is never contracted into an FMA
// with the subtraction that follows, so the forward's row maximum and lse2 and the
// backward's recomputed exp2(score - lse2) see the same value, and a one-edge row
// gets P = 1 exactly (its score gradient is then exactly 0, as in PyG).
__device__ __forceinline__ float gat_score2(float pre, float slope) {
  return __fmul_rn(leaky_relu(pre, slope), kLog2e);
}

template <typename T_> struct AdditiveScore {
  using T = T_;
  static constexpr bool kEdge = false;  // no per-edge term
  const T* a_dst;  // [N_dst, H]
  const T* a_src;  // [N_src, H]
  float slope;     // LeakyReLU's negative slope

  // The walks' one constructor for both functors (a_edge: [E, H] or ignored).
  __device__ __forceinline__ static AdditiveScore make(const T* a_dst, const T* a_src,
                                                       const T*, float slope) {
    return {a_dst, a_src, slope};
  }

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
  // The source's term plus the edge's (CSR position pos): the gathered part of
  // the pre-activation, summed in this order by every walk so that all of them
  // see the same rounded value.
  __device__ __forceinline__ float src_edge_term(int64_t j, int64_t, int h, int H) const {
    return src_term(j, h, H);
  }
};

// GATConv with edge features: the additive score plus a_edge [E, H] (CSR order).
template <typename T_> struct AdditiveEdgeScore : AdditiveScore<T_> {
  using T = T_;
  static constexpr bool kEdge = true;
  const T* a_edge;  // [E, H], the layout's CSR edge order

  __device__ __forceinline__ static AdditiveEdgeScore make(const T* a_dst, const T* a_src,
                                                           const T* a_edge, float slope) {
    AdditiveEdgeScore s;
    s.a_dst = a_dst;
    s.a_src = a_src;
    s.slope = slope;
    s.a_edge = a_edge;
    return s;
  }
  __device__ __forceinline__ float edge_term(int64_t pos, int h, int H) const {
    return to_float(__ldg(a_edge + pos * H + h));
  }
  __device__ __forceinline__ float src_edge_term(int64_t j, int64_t pos, int h, int H) const {
    return this->src_term(j, h, H) + edge_term(pos, h, H);
  }
};

// Calls f(Score{}) with AdditiveEdgeScore<T> where `edge`, else AdditiveScore<T>.
template <typename T, typename F> void with_additive_score(bool edge, F&& f) {
  if (edge) f(AdditiveEdgeScore<T>{});
  else f(AdditiveScore<T>{});
}

}  // namespace dfgnn
