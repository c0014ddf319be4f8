// The dot-product score with edge rows (TransformerConv with edge_dim): per head,
// with e_ij = lin_edge(edge_attr_ij) [E, H, C] in CSR edge order,
//   s_ij = scale q_i . (k_j + e_ij),  out_i = sum_j softmax_j(s_ij) (v_j + e_ij).
// In fp16 / bf16 the walks hand the edge row beside the gathered key and value
// (scores/score.cuh, kEdgeBeside): the destination side sums k_j + e_ij in fp32
// for the score and dq (the walks do the same for dP and the weighted sum). In
// fp32 they add it to both (the same sums; ptxas allocates the fp32 kernels as
// for the dot score), and the functors are the dot score's. Either way the
// destination side adds key_grad for the edge rows' gradient,
//   dE_ij = scale dS_ij q_i + P'_ij dO_i,
// which the dq walk writes per edge (no atomics, nothing of size E x H x C beyond
// the edge rows and their gradient). Its forward, checks and registration are
// scores/dot_edge.cu, its backward scores/dot_edge_backward.cu. The CUDA-core SMMF
// forward and the two-launch CUDA-core backward run it: pmf, mma, dense_cells,
// mma_backward and bwd_one_launch raise.
#pragma once

#include "host/dispatch.cuh"
#include "host/score_ops.h"
#include "scores/dot.cuh"

namespace dfgnn {

template <typename T> struct DotEdgeParams : DotParams<T> {
  const T* e;  // [E, H, C], CSR edge order
  auto tie() const {
    return std::make_tuple(this->q, this->k, this->v, this->scale, this->scale2, e);
  }
};

template <typename S> struct DotEdgeScore : DotScore<S> {
  using Base = DotScore<S>;
  using T = typename S::T;
  using Frag = FragOf<S>;
  using Params = DotEdgeParams<T>;
  static constexpr bool kEdgeRows = true, kEdgeBeside = !std::is_same_v<T, float>;
  static constexpr int VEC = S::VEC, NV = S::NV;

  __device__ __forceinline__ static const T* edge_rows(const Params& p) { return p.e; }

  using P = typename Base::P;

  struct Dst : Base::Dst {
    __device__ __forceinline__ Dst(const Params& p, const RowAt& at) : Base::Dst(p, at) {}
    using Base::Dst::grad;
    using Base::Dst::partial;
    // q_i . (k_j + e_ij), the two rows summed in fp32.
    __device__ __forceinline__ float partial(const P (&k)[NV], const P (&e)[NV]) const {
      float s = 0.f;
#pragma unroll
      for (int r = 0; r < NV; ++r)
#pragma unroll
        for (int c = 0; c < VEC; ++c)
          s = fmaf(this->q[r][c], packed_elem<T, VEC>(k[r], c) + packed_elem<T, VEC>(e[r], c), s);
      return s;
    }
    // acc += ds (k_j + e_ij).
    __device__ __forceinline__ void grad(float ds, const P (&k)[NV], const P (&e)[NV], Frag& acc,
                                         Frag&) const {
      axpy_packed<T, VEC, NV>(ds, k, acc);
      axpy_packed<T, VEC, NV>(ds, e, acc);
    }
    __device__ __forceinline__ void key_grad(float ds, const P (&k)[NV], const P (&)[NV],
                                             Frag& out) const {
      key_grad(ds, k, out);
    }
    // ds d s / d k_j = ds scale q_i (whatever the key); the held q_i carries
    // scale log2(e).
    __device__ __forceinline__ void key_grad(float ds, const P (&)[NV], Frag& out) const {
      const float a = ds * 0.69314718055994531f;  // ln 2 = 1 / log2(e)
#pragma unroll
      for (int r = 0; r < NV; ++r)
#pragma unroll
        for (int c = 0; c < VEC; ++c) out[r][c] = a * this->q[r][c];
    }
  };
};

// The kernels' parameters of a call: make(TypeTag<T>{}) for its kernel type T.
inline auto dot_edge_params(const AttentionCall& c) {
  const at::Tensor &q = c.inputs[0], &k = c.inputs[1], &v = c.inputs[2], &e = c.inputs[3];
  const float scale = (float)c.params[0], scale2 = (float)(c.params[0] * kLog2e);
  return [&q, &k, &v, &e, scale, scale2](auto tag) {
    using T = typename decltype(tag)::type;
    return DotEdgeParams<T>{{cptr<T>(q), cptr<T>(k), cptr<T>(v), scale, scale2}, cptr<T>(e)};
  };
}

// The backward (scores/dot_edge_backward.cu): (dq, dk, dv, de), de in CSR order.
std::vector<at::Tensor> dot_edge_backward(const at::Tensor& grad_out, const at::Tensor& out,
                                          const at::Tensor& lse2, at::TensorList saved,
                                          const AttentionCall& c, at::TensorList into);

}  // namespace dfgnn
