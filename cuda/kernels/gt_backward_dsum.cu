// D_i = dO_i . O_i in fp32 for the fp16 / bf16 GT backward (gt_backward.cu says
// why D must not come from the rounded output), without O_i itself:
//   D_i = sum_j P'_ij (dO_i . v_j),  P'_ij = z_ij exp2(q_i . k_j scale2 - lse2_i),
// the forward's fp32 accumulator dotted with dO_i, from the half inputs as they
// are. One pass over the CSR work items like the dq kernel's (the same scores,
// lse2 and dropout mask), keeping one float per (row, head) instead of a dQ row.
#include <type_traits>

#include "device/dropout.cuh"
#include "device/edge_walk.cuh"
#include "device/fragments.cuh"
#include "device/lane_group.cuh"
#include "device/work_items.cuh"
#include "host/dispatch.cuh"
#include "host/ops.h"
#include "host/split_merge.h"

namespace dfgnn {
namespace {

// Each lane keeps its share of sum_j P'_ij (dO_i . v_j) over its slice of the
// row: only the scores are reduced over the group per step, the dP share of an
// edge needs no reduction before it is weighted. With dropout, lane u of the
// group draws edge e0 + u's mask bit and one ballot hands the step's U bits to
// every lane (one hash per lane and step instead of U; the U hashes per lane
// spill 8-16 bytes in the 16-byte fp16 / bf16 shapes). An item of a split row
// (slot >= 0) writes its partial to partial [num_slots, H].
template <typename S, bool DROPOUT>
__global__ void __launch_bounds__(256)
gt_bwd_dsum_kernel(const typename S::T* __restrict__ dout, const typename S::T* __restrict__ q,
                   const typename S::T* __restrict__ k, const typename S::T* __restrict__ v,
                   const float* __restrict__ lse2, const int* __restrict__ rowptr,
                   const int* __restrict__ col, const int* __restrict__ items, int chunk,
                   float* __restrict__ dsum, float* __restrict__ partial, int64_t n_units,
                   int H, int C, float scale2, float p, uint64_t seed) {
  using T = typename S::T;
  constexpr int VEC = S::VEC, G = S::G, NV = S::NV;
  constexpr int U = edges_in_flight<VEC, NV>();
  static_assert(U <= G, "lane u of the group draws edge e0 + u's dropout mask bit");
  using P = typename Packed<T, VEC>::type;
  GroupItem g;
  if (!group_item<G>(items, rowptr, chunk, n_units, H, g)) return;
  const int gl = g.gl, h = g.h;
  const int64_t i = g.row;
  const int nvec = C / VEC;
  const int64_t HC = (int64_t)H * C, head_off = (int64_t)h * C;
  const int64_t off_i = i * HC + head_off;

  float qf[NV][VEC], gf[NV][VEC];
  load_row<T, VEC, G, NV>(q + off_i, gl, nvec, qf);
  scale_frag(scale2, qf);
  load_row<T, VEC, G, NV>(dout + off_i, gl, nvec, gf);
  const float L = lse2[i * H + h];
  const float zs = DROPOUT ? 1.f / (1.f - p) : 1.f;  // a kept weight's multiplier
  const int lane0 = (threadIdx.x & 31) & ~(G - 1);   // the group's first lane in the warp
  float d = 0.f;

  NbrPipe<U, kIndexAhead<T>> nb(col, g.beg, g.end);
  for_each_step<U, kFullStepsInBackward<T, G>>(g.beg, g.end, [&](int e0, auto full) {
    constexpr bool FULL = decltype(full)::value;
    int j[U];
    P kf[U][NV], vf[U][NV];
    float s[U], dp[U];  // scores q.k (group sums), this lane's share of dO.v
    load_edge_rows<T, VEC, G, NV, U, kIndexAhead<T>, FULL>(nb, e0, k, v, HC, head_off, gl,
                                                           nvec, j, kf, vf);
#pragma unroll
    for (int u = 0; u < U; ++u) {
      s[u] = FULL || j[u] >= 0 ? dot_packed<T, VEC, NV>(qf, kf[u]) : 0.f;
      dp[u] = FULL || j[u] >= 0 ? dot_packed<T, VEC, NV>(gf, vf[u]) : 0.f;
    }
    unsigned keep = ~0u;  // bit u: edge e0 + u is kept
    if constexpr (DROPOUT)
      keep = __ballot_sync(g.mask, dropout_keep(p, seed, (uint64_t)(e0 + gl) * H + h)) >> lane0;
    group_sum_many<G, U>(s, g.mask);
#pragma unroll
    for (int u = 0; u < U; ++u)
      if ((FULL || j[u] >= 0) && (keep >> u & 1u)) d = fmaf(exp2f(s[u] - L) * zs, dp[u], d);
  });
  d = group_sum<G>(d, g.mask);
  if (gl == 0) {
    if (g.slot < 0) dsum[i * H + h] = d;
    else partial[(int64_t)g.slot * H + h] = d;
  }
}

}  // namespace

at::Tensor gt_backward_dsum(const at::Tensor& grad_out, const at::Tensor& q, const at::Tensor& k,
                            const at::Tensor& v, const at::Tensor& lse2, const LayoutView& L,
                            double scale, double dropout, int64_t seed) {
  TORCH_INTERNAL_ASSERT(q.scalar_type() != at::kFloat, "gt_backward_dsum: fp16 / bf16 only");
  const Work& rw = L.rw;
  const int64_t N = L.rowptr.size(0) - 1, H = q.size(1), C = q.size(2);
  // D [N, H], then the split rows' partials [num_slots, H]: one allocation.
  at::Tensor buf = at::empty({(N + rw.num_slots) * H}, q.options().dtype(at::kFloat));
  at::Tensor dsum = buf.narrow(0, 0, N * H).view({N, H});
  float* partial = buf.data_ptr<float>() + N * H;
  const int64_t n_units = rw.items.size(0) * H;
  const float p = (float)dropout, scale2 = (float)(scale * kLog2e);
  const bool aligned = is_aligned16(q) && is_aligned16(k) && is_aligned16(v) &&
                       is_aligned16(grad_out);
  dispatch_rows(q.scalar_type(), C, aligned, "dfgnn::gt_bwd", [&](auto shape) {
    using S = decltype(shape);
    using T = typename S::T;
    if constexpr (!std::is_same_v<T, float>) {  // fp32 outputs are D's precision already
      const int64_t blocks = ceil_div(n_units * S::G, kNodeBlock);
      if (blocks == 0) return;
      auto kern = p > 0.f ? gt_bwd_dsum_kernel<S, true> : gt_bwd_dsum_kernel<S, false>;
      kern<<<blocks, kNodeBlock, 0, at::cuda::getCurrentCUDAStream()>>>(
          cptr<T>(grad_out), cptr<T>(q), cptr<T>(k), cptr<T>(v), lse2.data_ptr<float>(),
          L.rowptr.data_ptr<int>(), L.col.data_ptr<int>(), rw.items.data_ptr<int>(),
          (int)L.chunk, dsum.data_ptr<float>(), partial, n_units, H, C, scale2, p,
          (uint64_t)seed);
      check_launch();
    }
  });
  // The split rows' sums, each row's slots in a fixed order (deterministic).
  combine_partials(partial, rw.num_slots, rw.combine, dsum);
  return dsum;
}

}  // namespace dfgnn
