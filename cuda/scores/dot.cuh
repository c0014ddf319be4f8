// The dot-product score (TransformerConv, Graph Transformer; AGNN's fp16 / bf16
// path on normalised rows): s_ij = scale q_i . k_j, summed value v_j. The
// interface is described in scores/score.cuh. Its tensor-core and dense-tile
// kernels (dot_forward_mma.cu, dot_forward_dense.cu, dot_backward_mma.cu) are its
// own.
#pragma once

#include "scores/score.cuh"

namespace dfgnn {

template <typename T> struct DotParams {
  const T* q;  // [N_dst, H, C]
  const T* k;  // [N_src, H, C]
  const T* v;  // [N_src, H, C]
  float scale, scale2;  // scale and scale * log2(e)
  auto tie() const { return std::make_tuple(q, k, v, scale, scale2); }
};

template <typename S> struct DotScore {
  using Shape = S;
  using T = typename S::T;
  static constexpr int VEC = S::VEC, G = S::G, NV = S::NV;
  using P = PackedOf<S>;
  using Frag = FragOf<S>;
  using Params = DotParams<T>;
  static constexpr bool kValueIsKey = false, kSrcScalar = false, kParamGrad = false;
  static constexpr bool kHasKernels = true;

  __device__ __forceinline__ static const T* query_rows(const Params& p) { return p.q; }
  __device__ __forceinline__ static const T* key_rows(const Params& p) { return p.k; }
  __device__ __forceinline__ static const T* value_rows(const Params& p) { return p.v; }
  __device__ __forceinline__ static float src_scalar(const Params&, int64_t, int, int) {
    return 0.f;
  }

  // q_i scale2: the base-2 scale once per row instead of once per edge.
  struct Dst {
    float q[NV][VEC];
    __device__ __forceinline__ Dst(const Params& p, const RowAt& at) {
      load_row<T, VEC, G, NV>(p.q + at.off, at.gl, at.nvec, q);
      scale_frag(p.scale2, q);
    }
    __device__ __forceinline__ float partial(const P (&k)[NV]) const {
      return dot_packed<T, VEC, NV>(q, k);
    }
    __device__ __forceinline__ float finish(float s, float) const { return s; }
    __device__ __forceinline__ void grad(float ds, const P (&k)[NV], Frag& acc, Frag&) const {
      axpy_packed<T, VEC, NV>(ds, k, acc);
    }
    __device__ __forceinline__ float finish_grad(const Params& p, Frag&) const {
      return p.scale;
    }
  };

  // The edge-parallel SDDMM's destination, which serves one edge: the scale
  // goes on the sum (one multiply, not one per element; prescaled rows cost the
  // fp32 SDDMM 1-2 registers).
  struct EdgeDst {
    float q[NV][VEC];
    float scale2;
    __device__ __forceinline__ EdgeDst(const Params& p, const RowAt& at) : scale2(p.scale2) {
      load_row<T, VEC, G, NV>(p.q + at.off, at.gl, at.nvec, q);
    }
    __device__ __forceinline__ float partial(const P (&k)[NV]) const {
      return dot_packed<T, VEC, NV>(q, k);
    }
    __device__ __forceinline__ float finish(float s, float) const { return s * scale2; }
  };

  // The CSC walks' source side: dK_j = scale sum_i dS_ij q_i, dV_j = sum_i P'_ij dO_i.
  struct SrcGrad {
    __device__ __forceinline__ SrcGrad(const Params&, const RowAt&) {}
    __device__ __forceinline__ void grad(float ds, const P (&q)[NV], Frag& acc) const {
      axpy_packed<T, VEC, NV>(ds, q, acc);
    }
    __device__ __forceinline__ float finish_grad(const Params& p, Frag&, Frag&) const {
      return p.scale;
    }
  };

  // k_j scale2 and v_j, for the walk that recomputes the weights.
  struct Src : SrcGrad {
    float k[NV][VEC], v[NV][VEC];
    __device__ __forceinline__ Src(const Params& p, const RowAt& at) : SrcGrad(p, at) {
      load_row<T, VEC, G, NV>(p.k + at.off, at.gl, at.nvec, k);
      scale_frag(p.scale2, k);
      load_row<T, VEC, G, NV>(p.v + at.off, at.gl, at.nvec, v);
    }
    __device__ __forceinline__ float partial(const P (&q)[NV]) const {
      return dot_packed<T, VEC, NV>(k, q);
    }
    __device__ __forceinline__ float finish(float s) const { return s; }
    __device__ __forceinline__ const Frag& value() const { return v; }
  };
};

}  // namespace dfgnn
