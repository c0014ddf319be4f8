// GAT's additive score as a functor of the shared row walk (scores/score.cuh,
// kernels/row_forward.cuh): the SMMF forward that gathers U edges' x rows per
// step with their a_src terms, where the additive score's own forward
// (scores/additive_forward.cu) scores one edge per lane, a tile of G edges per
// step. The plan's row_walk picks between them (pyg_dfgnn/ops/plan.py says
// where each measured faster). The score, in base 2 and rounded as the own walks
// round it (gat_score2), so the additive backward recomputes the same weights:
//   s_ij = LeakyReLU(a_dst_i + a_src_j),  value x_j.
// Forward only: the backward is the additive score's own (additive_backward.cu).
#pragma once

#include <tuple>

#include "device/numerics.cuh"
#include "scores/additive.cuh"
#include "scores/score.cuh"

namespace dfgnn {

template <typename T> struct AdditiveRowParams {
  const T* x;      // [N_src, H, C], the summed rows
  const T* a_dst;  // [N_dst, H]
  const T* a_src;  // [N_src, H]
  float slope;     // LeakyReLU's negative slope
  auto tie() const { return std::make_tuple(x, a_dst, a_src, slope); }
};

template <typename S> struct AdditiveRowScore {
  using Shape = S;
  using T = typename S::T;
  static constexpr int NV = S::NV;
  using P = PackedOf<S>;
  using Params = AdditiveRowParams<T>;
  static constexpr bool kValueIsKey = true, kSrcScalar = true, kParamGrad = false;
  static constexpr bool kHasKernels = true;
  static constexpr bool kKeyFree = true;  // the score is a_src_j's, not the row's

  __device__ __forceinline__ static const T* key_rows(const Params& p) { return p.x; }
  __device__ __forceinline__ static const T* value_rows(const Params& p) { return p.x; }
  __device__ __forceinline__ static float src_scalar(const Params& p, int64_t j, int h, int H) {
    return to_float(__ldg(p.a_src + j * H + h));
  }

  struct Dst {
    float a_dst, slope;
    // A plain load of the row's own term, as the own walk reads it
    // (AdditiveScore::own_dst_term).
    __device__ __forceinline__ Dst(const Params& p, const RowAt& at)
        : a_dst(to_float(p.a_dst[at.row * at.H + at.h])), slope(p.slope) {}
    __device__ __forceinline__ float partial(const P (&)[NV]) const { return 0.f; }
    __device__ __forceinline__ float finish(float, float a_src) const {
      return gat_score2(a_dst + a_src, slope);
    }
  };
};

}  // namespace dfgnn
