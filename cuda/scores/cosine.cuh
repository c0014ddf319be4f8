// AGNN's cosine score over unnormalised rows x (the fp32 SMMF forward):
//   s_ij = beta cos(x_i, x_j) = beta rnorm_i rnorm_j (x_i . x_j),  value x_j,
// with rnorm [N, H] = +-1 / max(||x||, eps) (l2norm_rnorm_cuda; negative where
// clamped). Each edge gathers one row (key and value) and one scalar, rnorm_j,
// instead of a normalised key row and a value row. The interface is described
// in scores/score.cuh; the backward runs the dot score on the normalised rows
// (scores/cosine.cu).
#pragma once

#include <cmath>
#include <type_traits>

#include "device/numerics.cuh"
#include "host/params.h"
#include "host/tensor.h"
#include "scores/score.cuh"

namespace dfgnn {

template <typename T> struct CosineParams {
  const T* x;          // [N, H, C]
  const float* rnorm;  // [N, H]
  const float* beta;   // [1]
  auto tie() const { return std::make_tuple(x, rnorm, beta); }
};

template <typename S> struct CosineScore {
  using Shape = S;
  using T = typename S::T;
  static constexpr int VEC = S::VEC, G = S::G, NV = S::NV;
  using P = PackedOf<S>;
  using Params = CosineParams<T>;
  static constexpr bool kValueIsKey = true, kSrcScalar = true, kParamGrad = false;
  // fp32 only: fp16 / bf16 calls normalise first and run the dot score
  // (scores/cosine.cu says why).
  static constexpr bool kHasKernels = std::is_same_v<T, float>;

  __device__ __forceinline__ static const T* key_rows(const Params& p) { return p.x; }
  __device__ __forceinline__ static const T* value_rows(const Params& p) { return p.x; }
  __device__ __forceinline__ static float src_scalar(const Params& p, int64_t j, int h, int H) {
    return fabsf(__ldg(p.rnorm + j * H + h));
  }

  // x_i beta log2(e) |rnorm_i|: all of the score's scale but rnorm_j, once per row.
  struct Dst {
    float q[NV][VEC];
    __device__ __forceinline__ Dst(const Params& p, const RowAt& at) {
      load_row<T, VEC, G, NV>(p.x + at.off, at.gl, at.nvec, q);
      scale_frag(__ldg(p.beta) * kLog2e * fabsf(__ldg(p.rnorm + at.row * at.H + at.h)), q);
    }
    __device__ __forceinline__ float partial(const P (&k)[NV]) const {
      return dot_packed<T, VEC, NV>(q, k);
    }
    __device__ __forceinline__ float finish(float s, float rnorm_j) const { return s * rnorm_j; }
  };
};

// AGNN's attention over x (scores/cosine.cu): softmax of beta cos(x_i, x_j) over
// the in-edges, aggregating the unnormalised x_j; SMMF, no dropout, fp32. Returns
// (out, lse2, attn, rnorm), lse2 as the dot score's (scores/dot_host.h) for q = beta k,
// k = x / max(||x||, eps), scale 1. The plan's vector_rows, two_rows and
// merge_in_kernel; pmf raises.
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> cosine_forward_cuda(
    const at::Tensor& x, const at::Tensor& beta, double eps, const LayoutView& L,
    bool need_attn, const KernelPlan& plan);

// Row L2 normalisation (scores/cosine_normalize.cu): k = x / max(||x||, eps),
// q = beta k, rnorm [N, H] = +-1 / max(||x||, eps) (negative: clamped); beta is a
// 1-element float32 tensor. The backward returns dx and the per-row terms of dbeta.
// `vector_rows`: 16-byte row accesses (x's rows must be 16-byte aligned) or
// scalar ones, as the calling plan says. `op` names the op in errors (the cosine
// score's forward, or its backward, which recomputes k and q).
std::tuple<at::Tensor, at::Tensor, at::Tensor> l2norm_forward_cuda(const char* op,
                                                                   const at::Tensor& x,
                                                                   const at::Tensor& beta,
                                                                   double eps, bool vector_rows);
// rnorm [N, H] of l2norm_forward_cuda alone (no k, q written).
at::Tensor l2norm_rnorm_cuda(const at::Tensor& x, double eps, bool vector_rows);

std::tuple<at::Tensor, at::Tensor> l2norm_backward_cuda(const at::Tensor& dk, const at::Tensor& dq,
                                                        const at::Tensor& k,
                                                        const at::Tensor& rnorm,
                                                        const at::Tensor& beta,
                                                        bool vector_rows);

}  // namespace dfgnn
