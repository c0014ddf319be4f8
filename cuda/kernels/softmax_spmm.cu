// PMF step 2, shared by every score function (paper §4.1 "PMF"): the scores
// [E, H] are already in global memory (base 2: scale and log2(e) applied), so
// this kernel only normalises and aggregates:
//   out_i = sum_{j -> i} exp2(score_ij - lse2_i) * x_j.
// Node-parallel over work items of at most `chunk` edges, so a super node is
// spread over many lane groups; rows split over several items are summed by
// combine_partials (fixed order, no atomics, deterministic).
#include "device/dropout.cuh"
#include "device/edge_walk.cuh"
#include "device/fragments.cuh"
#include "device/lane_group.cuh"
#include "device/numerics.cuh"
#include "device/work_items.cuh"
#include "host/dispatch.cuh"
#include "host/ops.h"
#include "host/split_merge.h"

namespace dfgnn {
namespace {

// Softmax + SpMM over one work item (row, [start, start + chunk)).
// Row statistics are taken over the whole row (redundancy-free: lanes are
// spread over edges, not features); the item's partial sum goes to `out` when
// the row is a single item (slot < 0; and to out32 in fp32, if set), else to
// `partial[slot]`.
template <typename S, bool DROPOUT>
__global__ void __launch_bounds__(256)
softmax_spmm_kernel(const typename S::T* __restrict__ x, const float* __restrict__ score,
                    const int* __restrict__ rowptr, const int* __restrict__ col,
                    const int* __restrict__ items, int chunk, typename S::T* __restrict__ out,
                    float* __restrict__ out32, float* __restrict__ partial,
                    float* __restrict__ lse2, float* __restrict__ attn,
                    int64_t n_units, int H, int C, float p, uint64_t seed, int n_edges) {
  using T = typename S::T;
  constexpr int VEC = S::VEC, G = S::G, NV = S::NV;
  constexpr int U = edges_in_flight<VEC, NV>();
  GroupItem g;
  if (!group_item<G>(items, rowptr, chunk, n_units, H, g)) return;
  const int gl = g.gl, h = g.h, slot = g.slot, start = g.beg, end = g.end;
  const int rb = g.row_beg, re = g.row_end;
  const int64_t row = g.row;
  const unsigned mask = g.mask;
  const int nvec = C / VEC;
  const int64_t HC = (int64_t)H * C;

  // Row statistics in one pass: a running max and sum per lane, merged over the
  // group (the whole row, also for a split row's items).
  float mx = kNegInf, sum = 0.f;
  for (int e = rb + gl; e < re; e += G) {
    const float s = score[(int64_t)e * H + h];
    if (s > mx) {
      sum = sum * exp2f(mx - s) + 1.f;
      mx = s;
    } else {
      sum += exp2f(s - mx);
    }
  }
  const float M = group_max<G>(mx, mask);
  sum = group_sum<G>(mx == kNegInf ? 0.f : sum * exp2f(mx - M), mask);
  const float L = M + log2f(sum);
  if (start == rb && gl == 0) lse2[(int64_t)row * H + h] = L;

  // A tile of G edges at a time: each lane turns its own edge's score into the
  // weight (and writes the attention weight, coalesced); the steps take the
  // neighbours and weights by shuffle and wait only on the x rows.
  float acc[NV][VEC];
  zero_frag(acc);
  NbrTile<G> nt(col, start, end, gl, mask, n_edges);
  for (; nt.valid(); nt.advance()) {
    const int e = nt.edge();
    float wl = 0.f;
    if (nt.cur >= 0) {
      wl = exp2f(score[(int64_t)e * H + h] - L);
      if (attn != nullptr) attn[(int64_t)e * H + h] = wl;
      if constexpr (DROPOUT) wl *= dropout_scale(p, seed, (uint64_t)e * H + h);
    }
    tile_spmm<T, VEC, G, NV, U>(nt, wl, x, HC, (int64_t)h * C, gl, nvec, acc);
  }
  if (slot < 0) {
    const int64_t off = (int64_t)row * HC + (int64_t)h * C;
    store_row<T, VEC, G, NV>(out + off, gl, nvec, acc, 1.f);
    store_row_f32<VEC, G, NV>(out32 == nullptr ? nullptr : out32 + off, gl, nvec, acc, 1.f);
  } else {
    store_partial<VEC, G, NV>(partial + (int64_t)slot * HC + (int64_t)h * C, gl, nvec, acc);
  }
}

}  // namespace

void softmax_spmm(const at::Tensor& x, const float* score, float* partial, const LayoutView& L,
                  bool vector_rows, at::Tensor& out, float* out32, at::Tensor& lse2,
                  float* attn, double dropout, int64_t seed) {
  const at::Tensor &rowptr = L.rowptr, &col = L.col;
  const Work& rw = L.rw;
  const int64_t H = x.size(1), C = x.size(2);
  const int64_t n_units = rw.items.size(0) * H;
  const float p = (float)dropout;
  auto stream = c10::cuda::getCurrentCUDAStream();
  constexpr int kThreads = 256;
  dispatch_rows(x.scalar_type(), C, vector_rows, "dfgnn (softmax + SpMM)", [&](auto shape) {
    using S = decltype(shape);
    using T = typename S::T;
    constexpr int G = S::G;
    if (n_units == 0) return;
    // Every row owns at least one item (an empty row's item writes zeros and
    // lse = -inf); rows longer than `chunk` own several, summed by combine.
    auto kern = p > 0.f ? softmax_spmm_kernel<S, true>
                        : softmax_spmm_kernel<S, false>;
    kern<<<ceil_div(n_units * G, kThreads), kThreads, 0, stream>>>(
        cptr<T>(x), score, rowptr.data_ptr<int>(), col.data_ptr<int>(),
        rw.items.data_ptr<int>(), (int)L.chunk, mptr<T>(out), out32, partial,
        lse2.data_ptr<float>(), attn, n_units, H, C, p, (uint64_t)seed, (int)col.size(0));
    check_launch();
  });
  combine_partials(partial, rw.num_slots, rw.combine, out, out32);
}

}  // namespace dfgnn
