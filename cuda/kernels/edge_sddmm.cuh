// PMF step 1 of every score but the additive one (paper §4.1 "PMF"): the
// edge-parallel SDDMM, one lane group per (edge, head) in CSR order, writing the
// base-2 scores [E, H] that softmax_spmm (softmax_spmm.cu) normalises and sums.
// Balanced whatever the degrees: a destination's state is prepared per edge.
#pragma once

#include "device/lane_group.cuh"
#include "scores/score.cuh"

namespace dfgnn {

template <typename Score, typename... A>
__global__ void __launch_bounds__(256)
edge_sddmm_kernel(const int* __restrict__ csr_row, const int* __restrict__ col,
                  float* __restrict__ score, int64_t n_units, int H, int C, A... in) {
  const typename Score::Params sp{in...};
  using S = typename Score::Shape;
  using T = typename S::T;
  constexpr int VEC = S::VEC, G = S::G, NV = S::NV;
  const int64_t unit = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) / G;
  if (unit >= n_units) return;
  const int gl = threadIdx.x & (G - 1);
  const unsigned mask = group_mask<G>();
  const int64_t e = unit / H;
  const int h = (int)(unit - e * H);
  const int nvec = C / VEC;
  const int64_t HC = (int64_t)H * C, head_off = (int64_t)h * C;
  const int64_t i = __ldg(csr_row + e);
  const typename EdgeDstOf<Score>::type dst(sp,
                                            RowAt{i, h, H, i * HC + head_off, head_off, gl, nvec});
  const int64_t j = __ldg(col + e);
  PackedOf<S> kf[NV];
  load_packed<T, VEC, G, NV>(Score::key_rows(sp) + j * HC + head_off, gl, nvec, kf);
  const float sc = Score::kSrcScalar ? Score::src_scalar(sp, j, h, H) : 0.f;
  const float s = dst.finish(group_sum<G>(dst.partial(kf), mask), sc);
  if (gl == 0) score[unit] = s;
}

}  // namespace dfgnn
