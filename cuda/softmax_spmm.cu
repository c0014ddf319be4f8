// PMF step 2, shared by every score function (paper §4.1 "PMF"): the scores
// [E, H] are already in global memory (base 2: scale and log2(e) applied), so
// this kernel only normalises and aggregates:
//   out_i = sum_{j -> i} exp2(score_ij - lse2_i) * x_j.
// Node-parallel over work items of at most `chunk` edges, so a super node is
// spread over many lane groups; rows split over several items are summed by
// combine_partials (fixed order, no atomics, deterministic).
#include "common.cuh"
#include "ops.h"

namespace dfgnn {
namespace {

// Softmax + SpMM over one work item (row, [start, start + chunk)).
// Row statistics are taken over the whole row (redundancy-free: lanes are
// spread over edges, not features); the item's partial sum goes to `out` when
// the row is a single item (slot < 0), else to `partial[slot]`.
template <typename T, int VEC, int G, int NV, bool DROPOUT>
__global__ void __launch_bounds__(256)
softmax_spmm_kernel(const T* __restrict__ x, const float* __restrict__ score,
                       const int* __restrict__ rowptr, const int* __restrict__ col,
                       const int* __restrict__ items, int chunk, T* __restrict__ out,
                       float* __restrict__ partial, float* __restrict__ lse2,
                       float* __restrict__ attn, int64_t n_units, int H, int C, float p,
                       uint64_t seed) {
  constexpr int U = edges_in_flight<VEC, NV>();
  GroupItem g;
  if (!group_item<G>(items, rowptr, chunk, n_units, H, g)) return;
  const int gl = g.gl, h = g.h, slot = g.slot, start = g.beg, end = g.end;
  const int rb = g.row_beg, re = g.row_end;
  const int64_t row = g.row;
  const unsigned mask = g.mask;
  const int nvec = C / VEC;
  const int64_t HC = (int64_t)H * C;

  float mx = kNegInf;
  for (int e = rb + gl; e < re; e += G) mx = fmaxf(mx, score[(int64_t)e * H + h]);
  mx = group_max<G>(mx, mask);
  float sum = 0.f;
  for (int e = rb + gl; e < re; e += G) sum += exp2f(score[(int64_t)e * H + h] - mx);
  sum = group_sum<G>(sum, mask);
  const float L = mx + log2f(sum);
  if (start == rb && gl == 0) lse2[(int64_t)row * H + h] = L;

  float acc[NV][VEC];
  zero_frag(acc);
  NbrPipe<U, false> nb(col, start, end);  // no look-ahead: kIndexAhead in common.cuh
  for (int e0 = start; e0 < end; e0 += U) {
    using P = typename Packed<T, VEC>::type;
    int j[U];
    P vf[U][NV];
    float w[U];
    load_edge_row<T, VEC, G, NV, U>(nb, e0, x, HC, (int64_t)h * C, gl, nvec, j, vf, w,
                                    [&](int u, int) {
      return exp2f(score[(int64_t)(e0 + u) * H + h] - L);
    });
#pragma unroll
    for (int u = 0; u < U; ++u) {
      if (j[u] >= 0) {
        if (attn != nullptr && gl == 0) attn[(int64_t)(e0 + u) * H + h] = w[u];
        float ww = w[u];
        if constexpr (DROPOUT) ww *= dropout_scale(p, seed, (uint64_t)(e0 + u) * H + h);
        axpy_packed<T, VEC, NV>(ww, vf[u], acc);
      }
    }
  }
  if (slot < 0) {
    store_row<T, VEC, G, NV>(out + (int64_t)row * HC + (int64_t)h * C, gl, nvec, acc, 1.f);
  } else {
    store_partial<VEC, G, NV>(partial + (int64_t)slot * HC + (int64_t)h * C, gl, nvec, acc);
  }
}

}  // namespace

void softmax_spmm(const at::Tensor& x, const at::Tensor& score, const at::Tensor& rowptr,
                  const at::Tensor& col, const Work& rw, int64_t chunk, at::Tensor& out,
                  at::Tensor& lse2, float* attn, double dropout, int64_t seed) {
  const int64_t H = x.size(1), C = x.size(2);
  const int64_t n_units = rw.items.size(0) * H;
  auto partial = at::empty({rw.num_slots, H, C}, x.options().dtype(at::kFloat));
  const float p = (float)dropout;
  const bool aligned = is_aligned16(x) && is_aligned16(out);
  auto stream = at::cuda::getCurrentCUDAStream();
  constexpr int kThreads = 256;
  bool ok = false;
  DFGNN_DISPATCH_FLOAT_TYPES(x.scalar_type(), "softmax_spmm", [&] {
    using T = typename cuda_type<scalar_t>::type;
    ok = dispatch_row_shape<T>(C, aligned, [&](auto VEC_, auto G_, auto NV_) {
      constexpr int VEC = decltype(VEC_)::value, G = decltype(G_)::value, NV = decltype(NV_)::value;
      if (n_units == 0) return;
      // Every row owns at least one item (an empty row's item writes zeros and
      // lse = -inf); rows longer than `chunk` own several, summed by combine.
      auto kern = p > 0.f ? softmax_spmm_kernel<T, VEC, G, NV, true>
                          : softmax_spmm_kernel<T, VEC, G, NV, false>;
      kern<<<ceil_div(n_units * G, kThreads), kThreads, 0, stream>>>(
          reinterpret_cast<const T*>(x.data_ptr<scalar_t>()), score.data_ptr<float>(),
          rowptr.data_ptr<int>(), col.data_ptr<int>(), rw.items.data_ptr<int>(), (int)chunk,
          reinterpret_cast<T*>(out.data_ptr<scalar_t>()), partial.data_ptr<float>(),
          lse2.data_ptr<float>(), attn, n_units, H, C, p, (uint64_t)seed);
      check_launch();
    });
  });
  TORCH_CHECK(ok, "dfgnn: head size C=", std::to_string(C), " is not supported by the fused kernels");
  combine_partials(partial, rw.combine, out);
}

ForwardCall::ForwardCall(const at::Tensor& x, int64_t n_dst, int64_t n_edges, const Work& rw,
                         bool pmf_, bool need_attn_)
    : pmf(pmf_), need_attn(need_attn_) {
  const int64_t H = x.size(1), C = x.size(2);
  auto f32 = x.options().dtype(at::kFloat);
  out = at::empty({n_dst, H, C}, x.options());
  lse2 = at::empty({n_dst, H}, f32);
  attn = need_attn ? at::empty({n_edges, H}, f32) : at::empty({0}, f32);
  if (pmf) {
    score = at::empty({n_edges, H}, f32);
  } else {
    partial = at::empty({rw.num_slots, H, C}, f32);
    partial_ml = at::empty({rw.num_slots, H, 2}, f32);
  }
}

void ForwardCall::finish(const at::Tensor& x, const at::Tensor& rowptr, const at::Tensor& col,
                         const Work& rw, int64_t chunk, double dropout, int64_t seed) {
  if (pmf) {
    softmax_spmm(x, score, rowptr, col, rw, chunk, out, lse2, attn_ptr(), dropout, seed);
  } else if (rw.combine.size(0) > 0) {
    merge_softmax_partials(partial, partial_ml, rw.combine, out, lse2);
    if (need_attn) normalize_split_attn(rw.combine, rowptr, lse2, attn);
  }
}

}  // namespace dfgnn
