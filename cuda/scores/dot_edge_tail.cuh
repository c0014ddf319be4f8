// The dot score with edge rows that are tails (TransformerConv's edge_dim
// without an [E, H, C] tensor): per head, queries of C channels, keys and values
// of C - D that the edge rows a_ij [E, D] (CSR edge order, one row for every
// head) complete,
//   s_ij = scale q_i . [k_j, a_ij],  out_i = sum_j softmax_j(s_ij) [v_j, a_ij].
// The walks load the tails (scores/score.cuh, kEdgeTail) and the dq walk stores
// the tails of dE_ij = dS_ij ds_ij/dk_j + P'_ij dO_i, [E, H, D]; the backward
// returns their sum over the heads, a_ij's gradient. The functors are the
// dot_edge score's. The layer's rows (nn/transformer_conv.py): queries
// [q_i, W_h^T q_i], keys k_j, values v_j, and W_h (head h's slice of lin_edge's
// weight) times the output's last D channels added to its first C.
// Forward, checks and registration: scores/dot_edge_tail.cu; backward:
// scores/dot_edge_tail_backward.cu. Paths as the dot_edge score's.
#pragma once

#include "scores/dot_edge.cuh"

namespace dfgnn {

template <typename T> struct DotEdgeTailParams : DotEdgeParams<T> {
  int d;          // the tails' width D
  int64_t kv_ld;  // the key and value rows' stride, H (C - D)
  auto tie() const {
    return std::make_tuple(this->q, this->k, this->v, this->scale, this->scale2, this->e, d,
                           kv_ld);
  }
};

template <typename S> struct DotEdgeTailScore : DotEdgeScore<S> {
  using T = typename S::T;
  using Params = DotEdgeTailParams<T>;
  static constexpr bool kEdgeTail = true;

  __device__ __forceinline__ static const T* edge_rows(const Params& p) { return p.e; }
  __host__ __device__ __forceinline__ static int edge_width(const Params& p) { return p.d; }
  __device__ __forceinline__ static int64_t key_stride(const Params& p) { return p.kv_ld; }
};

// The kernels' parameters of a call: make(TypeTag<T>{}) for its kernel type T.
inline auto dot_edge_tail_params(const AttentionCall& c) {
  const at::Tensor &q = c.inputs[0], &k = c.inputs[1], &v = c.inputs[2], &a = c.inputs[3];
  const float scale = (float)c.params[0], scale2 = (float)(c.params[0] * kLog2e);
  const int d = (int)a.size(1);
  const int64_t kv_ld = k.size(1) * k.size(2);
  return [&q, &k, &v, &a, scale, scale2, d, kv_ld](auto tag) {
    using T = typename decltype(tag)::type;
    return DotEdgeTailParams<T>{{{cptr<T>(q), cptr<T>(k), cptr<T>(v), scale, scale2}, cptr<T>(a)},
                                d, kv_ld};
  };
}

// The backward (scores/dot_edge_tail_backward.cu): (dq, dk, dv, da), da [E, D]
// in CSR order.
std::vector<at::Tensor> dot_edge_tail_backward(const at::Tensor& grad_out, const at::Tensor& out,
                                               const at::Tensor& lse2, at::TensorList saved,
                                               const AttentionCall& c, at::TensorList into);

}  // namespace dfgnn
