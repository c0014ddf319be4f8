// GATv2's score (GATv2Conv): the functor over the row walks (scores/score.cuh),
// its forward, input checks and registration (scores/gatv2.cu) and its backward
// (scores/gatv2_backward.cu: a translation unit of its own, so that the two
// compile in parallel). Per head h, with q = x_r = lin_r(x_dst) [N_dst, H, C],
// k = x_l = lin_l(x_src) [N_src, H, C] and att [H, C]:
//   s_ij = sum_c att_c LeakyReLU(q_ic + k_jc),  out_i = sum_j softmax_j(s_ij) k_j,
// so each edge gathers one row, key and value. The backward, with dS_ij =
// P_ij (z_ij dP_ij - D_i) (dP_ij = dO_i . k_j), g_ijc = LeakyReLU'(q_ic + k_jc):
//   dq_i = att (.) sum_j dS_ij g_ij,  dk_j = att (.) sum_i dS_ij g_ij + sum_i P'_ij dO_i,
//   datt = sum_ij dS_ij LeakyReLU(q_i + k_j),
// datt accumulated by the dq walk (each edge once) per work item and the items'
// rows summed in a fixed order afterwards: no atomics, and nothing of size
// E x H x C. Inputs (q, k, att), params (negative_slope); the forward saves
// nothing beyond out and lse2; the backward returns (dq, dk, datt).
// The plan's pmf, vector_rows, two_rows, merge_in_kernel, bwd_one_launch and
// bwd_merge_in_kernel apply as for the dot score; mma, dense_cells and
// mma_backward are the dot score's and raise.
#pragma once

#include "host/score_ops.h"
#include "scores/score.cuh"

namespace dfgnn {

template <typename T> struct GATv2Params {
  const T* q;    // x_r [N_dst, H, C]
  const T* k;    // x_l [N_src, H, C], key and value
  const T* att;  // [H, C]
  float slope;   // LeakyReLU's negative slope
  auto tie() const { return std::make_tuple(q, k, att, slope); }
};

template <typename S> struct GATv2Score {
  using Shape = S;
  using T = typename S::T;
  static constexpr int VEC = S::VEC, G = S::G, NV = S::NV;
  using P = PackedOf<S>;
  using Frag = FragOf<S>;
  using Params = GATv2Params<T>;
  static constexpr bool kValueIsKey = true, kSrcScalar = false, kParamGrad = true;
  static constexpr bool kHasKernels = true;

  __device__ __forceinline__ static const T* query_rows(const Params& p) { return p.q; }
  __device__ __forceinline__ static const T* key_rows(const Params& p) { return p.k; }
  __device__ __forceinline__ static const T* value_rows(const Params& p) { return p.k; }
  __device__ __forceinline__ static float src_scalar(const Params&, int64_t, int, int) {
    return 0.f;
  }

  // A held row h (fp32) and att, against a gathered row whose element (r, c) in
  // fp32 is x(r, c): this lane's share of att . LeakyReLU(h + x) (natural units).
  // The accessor lets the edge form sum k_j + e_ij in fp32 (scores/gatv2_edge.cuh).
  template <typename X>
  __device__ __forceinline__ static float lane_score_of(const Frag& h, const Frag& att,
                                                        float slope, X&& x) {
    float s = 0.f;
#pragma unroll
    for (int r = 0; r < NV; ++r)
#pragma unroll
      for (int c = 0; c < VEC; ++c) {
        const float z = h[r][c] + x(r, c);
        s = fmaf(att[r][c], z > 0.f ? z : z * slope, s);
      }
    return s;
  }
  __device__ __forceinline__ static float lane_score(const Frag& h, const Frag& att, float slope,
                                                     const P (&x)[NV]) {
    return lane_score_of(h, att, slope, elems(x));
  }
  // acc += ds LeakyReLU'(h + x), and param += ds LeakyReLU(h + x) where PARAM.
  template <bool PARAM, typename X>
  __device__ __forceinline__ static void lane_grad_of(const Frag& h, float slope, float ds, X&& x,
                                                      Frag& acc, Frag& param) {
#pragma unroll
    for (int r = 0; r < NV; ++r)
#pragma unroll
      for (int c = 0; c < VEC; ++c) {
        const float z = h[r][c] + x(r, c);
        const float dg = z > 0.f ? ds : ds * slope;
        acc[r][c] += dg;
        if constexpr (PARAM) param[r][c] = fmaf(dg, z, param[r][c]);
      }
  }
  template <bool PARAM>
  __device__ __forceinline__ static void lane_grad(const Frag& h, float slope, float ds,
                                                   const P (&x)[NV], Frag& acc, Frag& param) {
    lane_grad_of<PARAM>(h, slope, ds, elems(x), acc, param);
  }
  // A packed row's elements in fp32, as lane_score_of and lane_grad_of take them.
  __device__ __forceinline__ static auto elems(const P (&x)[NV]) {
    return [&x](int r, int c) { return packed_elem<T, VEC>(x[r], c); };
  }

  // x_r_i and att.
  struct Dst {
    float q[NV][VEC], att[NV][VEC];
    float slope;
    __device__ __forceinline__ Dst(const Params& p, const RowAt& at) : slope(p.slope) {
      load_row<T, VEC, G, NV>(p.q + at.off, at.gl, at.nvec, q);
      load_row<T, VEC, G, NV>(p.att + at.head_off, at.gl, at.nvec, att);
    }
    __device__ __forceinline__ float partial(const P (&k)[NV]) const {
      return lane_score(q, att, slope, k);
    }
    __device__ __forceinline__ float finish(float s, float) const { return s * kLog2e; }
    __device__ __forceinline__ void grad(float ds, const P (&k)[NV], Frag& acc,
                                         Frag& param) const {
      lane_grad<true>(q, slope, ds, k, acc, param);
    }
    __device__ __forceinline__ float finish_grad(const Params&, Frag& acc) const {
#pragma unroll
      for (int r = 0; r < NV; ++r)
#pragma unroll
        for (int c = 0; c < VEC; ++c) acc[r][c] *= att[r][c];
      return 1.f;
    }
  };

  // x_l_j and att; the value is the key, so dk and dv are one gradient.
  struct Src {
    float k[NV][VEC], att[NV][VEC];
    float slope;
    __device__ __forceinline__ Src(const Params& p, const RowAt& at) : slope(p.slope) {
      load_row<T, VEC, G, NV>(p.k + at.off, at.gl, at.nvec, k);
      load_row<T, VEC, G, NV>(p.att + at.head_off, at.gl, at.nvec, att);
    }
    __device__ __forceinline__ float partial(const P (&q)[NV]) const {
      return lane_score(k, att, slope, q);
    }
    __device__ __forceinline__ float finish(float s) const { return s * kLog2e; }
    __device__ __forceinline__ const Frag& value() const { return k; }
    __device__ __forceinline__ void grad(float ds, const P (&q)[NV], Frag& acc) const {
      Frag unused;
      lane_grad<false>(k, slope, ds, q, acc, unused);
    }
    __device__ __forceinline__ float finish_grad(const Params&, Frag& dk, Frag& dv) const {
#pragma unroll
      for (int r = 0; r < NV; ++r)
#pragma unroll
        for (int c = 0; c < VEC; ++c) dk[r][c] = fmaf(att[r][c], dk[r][c], dv[r][c]);
      return 1.f;
    }
  };
  using SrcGrad = Src;
};

// The kernels' parameters of a call: make(TypeTag<T>{}) for its kernel type T.
inline auto gatv2_params(const AttentionCall& c) {
  const at::Tensor &q = c.inputs[0], &k = c.inputs[1], &att = c.inputs[2];
  const float slope = (float)c.params[0];
  return [&q, &k, &att, slope](auto tag) {
    using T = typename decltype(tag)::type;
    return GATv2Params<T>{cptr<T>(q), cptr<T>(k), cptr<T>(att), slope};
  };
}

// The backward (scores/gatv2_backward.cu): (dq, dk, datt).
std::vector<at::Tensor> gatv2_backward(const at::Tensor& grad_out, const at::Tensor& out,
                                       const at::Tensor& lse2, at::TensorList saved,
                                       const AttentionCall& c, at::TensorList into);

}  // namespace dfgnn
