// GATv2's score with edge rows (GATv2Conv with edge_dim): per head, with
// e_ij = lin_edge(edge_attr_ij) [E, H, C] in CSR edge order,
//   s_ij = sum_c att_c LeakyReLU(q_ic + k_jc + e_ijc),  out_i = sum_j softmax_j(s_ij) k_j,
// so the edge row enters the score only (scores/score.cuh, kEdgeInKeyOnly): the
// walks hand it beside the gathered key row and sum the row as loaded. The functors
// are GATv2's (the score is symmetric in q_i and k_j + e_ij); the destination
// side adds key_grad for the edge rows' gradient,
//   dE_ij = dS_ij att (.) LeakyReLU'(q_i + k_j + e_ij),
// which the dq walk writes per edge, and the CSC walk hands e_ij beside each
// gathered q_i (nothing of size E x H x C beyond the edge rows and their gradient). Its
// forward, checks and registration are scores/gatv2_edge.cu, its backward
// scores/gatv2_edge_backward.cu. The CUDA-core SMMF forward and the two-launch
// CUDA-core backward run it: pmf, mma, dense_cells, mma_backward and
// bwd_one_launch raise.
#pragma once

#include "scores/gatv2.cuh"

namespace dfgnn {

template <typename T> struct GATv2EdgeParams : GATv2Params<T> {
  const T* e;  // [E, H, C], CSR edge order
  auto tie() const { return std::make_tuple(this->q, this->k, this->att, this->slope, e); }
};

template <typename S> struct GATv2EdgeScore : GATv2Score<S> {
  using Base = GATv2Score<S>;
  using T = typename S::T;
  using P = typename Base::P;
  using Frag = typename Base::Frag;
  using Params = GATv2EdgeParams<T>;
  static constexpr int VEC = S::VEC, NV = S::NV;
  // The walks keep the value (k_j) apart from the key (k_j + e_ij).
  static constexpr bool kValueIsKey = false;
  static constexpr bool kEdgeRows = true, kEdgeInKeyOnly = true;

  __device__ __forceinline__ static const T* edge_rows(const Params& p) { return p.e; }

  // The walks hand the edge row beside the gathered row (scores/score.cuh,
  // kEdgeInKeyOnly), and the functors sum the two in fp32: k_j + e_ij rounded to
  // fp16 / bf16 moves a score by up to u |att| |k_j + e_ij| (u = 2^-8 in bf16),
  // and dq, a sum over the row whose dS cancel, by 1-3 % relative to float64.
  static __device__ __forceinline__ auto sum_of(const P (&x)[NV], const P (&e)[NV]) {
    return [&x, &e](int r, int c) {
      return packed_elem<T, VEC>(x[r], c) + packed_elem<T, VEC>(e[r], c);
    };
  }

  struct Dst : Base::Dst {
    __device__ __forceinline__ Dst(const Params& p, const RowAt& at) : Base::Dst(p, at) {}
    __device__ __forceinline__ float partial(const P (&k)[NV], const P (&e)[NV]) const {
      return Base::lane_score_of(this->q, this->att, this->slope, sum_of(k, e));
    }
    __device__ __forceinline__ void grad(float ds, const P (&k)[NV], const P (&e)[NV], Frag& acc,
                                         Frag& param) const {
      Base::template lane_grad_of<true>(this->q, this->slope, ds, sum_of(k, e), acc, param);
    }
    // ds d s / d key_j = ds att (.) LeakyReLU'(q_i + k_j + e_ij).
    __device__ __forceinline__ void key_grad(float ds, const P (&k)[NV], const P (&e)[NV],
                                             Frag& out) const {
#pragma unroll
      for (int r = 0; r < NV; ++r)
#pragma unroll
        for (int c = 0; c < VEC; ++c) {
          const float z =
              this->q[r][c] + (packed_elem<T, VEC>(k[r], c) + packed_elem<T, VEC>(e[r], c));
          out[r][c] = this->att[r][c] * (z > 0.f ? ds : ds * this->slope);
        }
    }
  };

  // The CSC walk's source side: the gathered query q_i with the edge row beside it.
  struct Src : Base::Src {
    __device__ __forceinline__ Src(const Params& p, const RowAt& at) : Base::Src(p, at) {}
    __device__ __forceinline__ void grad(float ds, const P (&q)[NV], const P (&e)[NV],
                                         Frag& acc) const {
      Frag unused;
      Base::template lane_grad_of<false>(this->k, this->slope, ds, sum_of(q, e), acc, unused);
    }
  };
  using SrcGrad = Src;
};

// The kernels' parameters of a call: make(TypeTag<T>{}) for its kernel type T.
inline auto gatv2_edge_params(const AttentionCall& c) {
  const at::Tensor &q = c.inputs[0], &k = c.inputs[1], &att = c.inputs[2], &e = c.inputs[3];
  const float slope = (float)c.params[0];
  return [&q, &k, &att, &e, slope](auto tag) {
    using T = typename decltype(tag)::type;
    return GATv2EdgeParams<T>{{cptr<T>(q), cptr<T>(k), cptr<T>(att), slope}, cptr<T>(e)};
  };
}

// The backward (scores/gatv2_edge_backward.cu): (dq, dk, datt, de), de in CSR order.
std::vector<at::Tensor> gatv2_edge_backward(const at::Tensor& grad_out, const at::Tensor& out,
                                            const at::Tensor& lse2, at::TensorList saved,
                                            const AttentionCall& c, at::TensorList into);

}  // namespace dfgnn
