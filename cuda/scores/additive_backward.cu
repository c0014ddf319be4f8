// Backward pass of the additive score (scores/additive.cuh; GAT). With P the softmax, z the dropout
// multiplier, g_ij = LeakyReLU'(a_dst_i + a_src_j [+ a_edge_ij]), dP_ij = dO_i . x_j and
// D_i = dO_i . O_i:
//   dE_ij = g_ij P_ij (z_ij dP_ij - D_i)
//   d a_dst_i = sum_j dE_ij,  d a_src_j = sum_i dE_ij,  dx_j = sum_i P_ij z_ij dO_i,
//   d a_edge_ij = dE_ij (AdditiveEdgeScore).
// dP enters the score gradients only through those sums, so no per-edge dot
// product is needed. Split by the LeakyReLU branch (g = 1 on "+", the slope on
// "-"), with y+_i = sum_{j+} P_ij z_ij x_j, c+_i = sum_{j+} P_ij and likewise "-":
//   d a_dst_i = (dO_i . y+_i + slope dO_i . y-_i) - D_i (c+_i + slope c-_i)
// and with u+_j = sum_{i+} P_ij z_ij dO_i, e+_j = sum_{i+} P_ij D_i:
//   d a_src_j = (x_j . u+_j - e+_j) + slope (x_j . u-_j - e-_j),  dx_j = u+_j + u-_j.
// Both walks are SpMMs with two scalar weights per edge, the GAT forward's loop
// (NbrTile: each lane weighs one edge of a tile of G, the steps take the
// neighbours and weights by shuffle). The branch split keeps the terms that
// cancel apart: a row whose one item holds all its edges takes D_i = dO_i .
// (y+_i + y-_i), recomputed in fp32 (not from the output rounded to T), and a
// one-edge row then gives d a_dst = 0 exactly, as the softmax's backward does;
// split rows take D_i = dO_i . O_i from the saved output in fp32. In fp16 / bf16
// the output rounded to T loses the bits that the difference z dP - D keeps, so
// there each item of a split row stores its shares of D_i (dO_i . (y+ + y-)),
// of c+ + slope c- and of the dot products, and gat_split_dsum_kernel sums them
// in slot order into D_i and d a_dst_i = (sum of dots) - D_i (c+ + slope c-)
// before the CSC walk reads D (recomputing O_i in fp32 instead cost a whole
// fp32 forward: 0.27 ms of a 2.2 ms bf16 ogbn-arxiv layer step). Each output
// row is owned by one lane group (split rows: fixed-order combine): no atomics,
// deterministic. Only lse2 [N, H] is saved by the forward.
// The per-edge term's gradient is dE_ij itself, which needs dP_ij edge by edge:
// gat_bwd_edge_kernel computes it edge-parallel (one lane group per edge and
// head: an SDDMM of dO_i and x_j) once the CSR walk has written D; the walks
// read a_edge at the edge's CSR position (the CSC walk through perm), as the
// forward does.
#include "device/dropout.cuh"
#include "device/edge_walk.cuh"
#include "device/fragments.cuh"
#include "device/lane_group.cuh"
#include "device/numerics.cuh"
#include "device/split_merge.cuh"
#include "device/work_items.cuh"
#include "host/dispatch.cuh"
#include "host/scratch.h"
#include "host/split_merge.h"
#include "scores/additive.cuh"
#include "scores/additive_host.h"

namespace dfgnn {
namespace {

// CSR walk over destinations: D_i (for the CSC walk) and d a_dst_i.
template <typename Score, typename S, bool DROPOUT>
__global__ void __launch_bounds__(256)
gat_bwd_dst_kernel(const typename S::T* __restrict__ dout, const typename S::T* __restrict__ a_dst,
                   const typename S::T* __restrict__ a_src,
                   const typename S::T* __restrict__ a_edge,
                   const typename S::T* __restrict__ x,
                   const typename S::T* __restrict__ out, const float* __restrict__ lse2,
                   float* __restrict__ partial_dc, const int* __restrict__ rowptr,
                   const int* __restrict__ col, const int* __restrict__ items, int chunk,
                   float* __restrict__ da_dst, float* __restrict__ partial,
                   float* __restrict__ dsum, int64_t n_units, int H, int C, float slope, float p,
                   uint64_t seed, int n_edges, int* __restrict__ counters) {
  using T = typename S::T;
  constexpr int VEC = S::VEC, G = S::G, NV = S::NV;
  constexpr int U = edges_in_flight<VEC, NV>();
  GroupItem g;
  if (!group_item<G>(items, rowptr, chunk, n_units, H, g)) return;
  const int gl = g.gl, h = g.h;
  const int64_t i = g.row;
  const int nvec = C / VEC;
  const int64_t HC = (int64_t)H * C;
  const int64_t off_i = i * HC + (int64_t)h * C;
  const float L = lse2[i * H + h];
  const Score sc = Score::make(a_dst, a_src, a_edge, slope);
  const float ad = sc.own_dst_term(i, h, H);
  auto a_of = [&](int jj, int pos) { return jj >= 0 ? sc.src_edge_term(jj, pos, h, H) : 0.f; };

  NbrTile<G, 2> nt(col, g.beg, g.end, gl, g.mask, n_edges);
  float a_cur = a_of(nt.raw, g.beg + gl);  // speculative, as in gat_fwd_kernel
  float gf[NV][VEC];
  load_row<T, VEC, G, NV>(dout + off_i, gl, nvec, gf);
  float y[2][NV][VEC];  // y+ and y- over the item
  zero_frag(y[0]);
  zero_frag(y[1]);
  float c[2] = {0.f, 0.f};  // this lane's c+ and c-
  for (; nt.valid(); nt.advance()) {
    const float a_next = a_of(nt.ahead[0], nt.t0 + G + gl);
    float wl[2] = {0.f, 0.f};
    if (nt.cur >= 0) {
      const float pre = ad + a_cur;
      const float pe = exp2f(sc.score2(pre) - L);
      float w = pe;
      if constexpr (DROPOUT) w *= dropout_scale(p, seed, (uint64_t)nt.edge() * H + h);
      const bool pos = sc.positive(pre);  // selects, not an index: c and wl stay in registers
      c[0] += pos ? pe : 0.f;
      c[1] += pos ? 0.f : pe;
      wl[0] = pos ? w : 0.f;
      wl[1] = pos ? 0.f : w;
    }
    tile_spmm_k<T, VEC, G, NV, U>(nt, wl, x, HC, (int64_t)h * C, gl, nvec, y);
    a_cur = a_next;
  }
  float s[4] = {dot_frag(gf, y[0]), dot_frag(gf, y[1]), c[0], c[1]};
  group_sum_many<G, 4>(s, g.mask);
  float D = s[0] + s[1];
  if (g.slot >= 0 && partial_dc != nullptr) {  // half inputs: shares for gat_split_dsum_kernel
    if (gl == 0) {
      const int64_t k = (int64_t)g.slot * H + h;
      partial[k] = s[0] + slope * s[1];
      partial_dc[2 * k] = D;
      partial_dc[2 * k + 1] = s[2] + slope * s[3];
    }
    return;
  }
  if (g.slot >= 0) {  // part of a row: D_i from the output (y is free again)
    load_row<T, VEC, G, NV>(out + off_i, gl, nvec, y[0]);
    D = group_sum<G>(dot_frag(gf, y[0]), g.mask);
  }
  // a split row's items: partial sums of d a_dst
  const float da = (s[0] + slope * s[1]) - D * (s[2] + slope * s[3]);
  if (gl == 0) {
    if (g.beg == g.row_beg) dsum[i * H + h] = D;
    if (g.slot < 0) da_dst[i * H + h] = da;
    else partial[(int64_t)g.slot * H + h] = da;
  }
  if constexpr (kMergeInBackward<T>) {
    if (g.slot >= 0 && counters != nullptr)
      merge_split_sums<T, VEC, G, NV>(g, H, C, chunk, rowptr, counters, nullptr, (T*)nullptr,
                                      nullptr, (T*)nullptr, partial, da_dst);
  }
}

// Half inputs: D_i and d a_dst_i of the split rows (combine: row, first slot,
// slots) from their items' shares, summed in slot order (deterministic). One
// thread per (row, head): split rows are few.
__global__ void __launch_bounds__(256)
gat_split_dsum_kernel(const float* __restrict__ partial, const float* __restrict__ partial_dc,
                      const int* __restrict__ combine, int64_t n_units, int H,
                      float* __restrict__ dsum, float* __restrict__ da_dst) {
  const int64_t u = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (u >= n_units) return;
  const int64_t r = u / H;
  const int h = (int)(u - r * H);
  const int64_t row = combine[r * 3], first = combine[r * 3 + 1];
  const int n = combine[r * 3 + 2];
  float dots = 0.f, D = 0.f, c = 0.f;
  for (int q = 0; q < n; ++q) {
    const int64_t k = (first + q) * H + h;
    dots += partial[k];
    D += partial_dc[2 * k];
    c += partial_dc[2 * k + 1];
  }
  dsum[row * H + h] = D;
  da_dst[row * H + h] = dots - D * c;
}

// This lane's edge's destination terms for the CSC walk, gathered a tile ahead:
// a_dst_i, lse2_i, D_i, (edge term) a_edge_ij and (dropout or edge term) the
// edge's CSR position.
template <bool EDGE> struct DstTerms {
  float ad = 0.f, L = 0.f, D = 0.f;
  int pos = 0;
};
template <> struct DstTerms<true> : DstTerms<false> {
  float ae = 0.f;
};

// CSC walk over sources: dx_j and d a_src_j.
template <typename Score, typename S, bool DROPOUT>
__global__ void __launch_bounds__(256)
gat_bwd_src_kernel(const typename S::T* __restrict__ dout, const typename S::T* __restrict__ a_dst,
                   const typename S::T* __restrict__ a_src,
                   const typename S::T* __restrict__ a_edge,
                   const typename S::T* __restrict__ x,
                   const float* __restrict__ lse2, const float* __restrict__ dsum,
                   const int* __restrict__ colptr, const int* __restrict__ row,
                   const int* __restrict__ perm, const int* __restrict__ items, int chunk,
                   float* __restrict__ da_src, typename S::T* __restrict__ dx,
                   float* __restrict__ partial_a, float* __restrict__ partial_x, int64_t n_units,
                   int H, int C, float slope, float p, uint64_t seed, int n_edges,
                   int* __restrict__ counters) {
  using T = typename S::T;
  constexpr int VEC = S::VEC, G = S::G, NV = S::NV;
  constexpr int U = edges_in_flight<VEC, NV>();
  GroupItem g;
  if (!group_item<G>(items, colptr, chunk, n_units, H, g)) return;
  const int gl = g.gl, h = g.h;
  const int64_t j = g.row;
  const int nvec = C / VEC;
  const int64_t HC = (int64_t)H * C;
  const int64_t off_j = j * HC + (int64_t)h * C;
  const Score sc = Score::make(a_dst, a_src, a_edge, slope);
  const float as = sc.own_src_term(j, h, H);
  auto terms_of = [&](int ii, int e) {
    DstTerms<Score::kEdge> d;
    if (ii >= 0) {
      d.ad = sc.dst_term(ii, h, H);
      d.L = __ldg(lse2 + (int64_t)ii * H + h);
      d.D = __ldg(dsum + (int64_t)ii * H + h);
      if constexpr (DROPOUT || Score::kEdge) d.pos = __ldg(perm + e);
      if constexpr (Score::kEdge) d.ae = sc.edge_term(d.pos, h, H);
    }
    return d;
  };

  NbrTile<G, 2> nt(row, g.beg, g.end, gl, g.mask, n_edges);
  auto cur = terms_of(nt.raw, g.beg + gl);  // speculative, as in gat_fwd_kernel
  float xf[NV][VEC];
  load_row<T, VEC, G, NV>(x + off_j, gl, nvec, xf);
  float acc[2][NV][VEC];  // u+ and u- over the item
  zero_frag(acc[0]);
  zero_frag(acc[1]);
  float e[2] = {0.f, 0.f};  // this lane's e+ and e-
  for (; nt.valid(); nt.advance()) {
    const auto next = terms_of(nt.ahead[0], nt.t0 + G + gl);
    float wl[2] = {0.f, 0.f};
    if (nt.cur >= 0) {
      // a_src_j + a_edge_ij first: the order of the forward's sum.
      float pre;
      if constexpr (Score::kEdge) pre = cur.ad + (as + cur.ae);
      else pre = cur.ad + as;
      const float pe = exp2f(sc.score2(pre) - cur.L);
      float w = pe;
      if constexpr (DROPOUT) w *= dropout_scale(p, seed, (uint64_t)cur.pos * H + h);
      const bool pos = sc.positive(pre);
      const float pd = pe * cur.D;
      e[0] += pos ? pd : 0.f;
      e[1] += pos ? 0.f : pd;
      wl[0] = pos ? w : 0.f;
      wl[1] = pos ? 0.f : w;
    }
    tile_spmm_k<T, VEC, G, NV, U>(nt, wl, dout, HC, (int64_t)h * C, gl, nvec, acc);
    cur = next;
  }
  float s[4] = {dot_frag(xf, acc[0]), dot_frag(xf, acc[1]), e[0], e[1]};
  group_sum_many<G, 4>(s, g.mask);
  const float da = (s[0] - s[2]) + slope * (s[1] - s[3]);
  axpy_frag(1.f, acc[1], acc[0]);  // dx_j = u+ + u-
  if (g.slot < 0) {
    store_row<T, VEC, G, NV>(dx + off_j, gl, nvec, acc[0], 1.f);
    if (gl == 0) da_src[j * H + h] = da;
  } else {
    store_partial<VEC, G, NV>(partial_x + (int64_t)g.slot * HC + (int64_t)h * C, gl, nvec, acc[0]);
    if (gl == 0) partial_a[(int64_t)g.slot * H + h] = da;
    if constexpr (kMergeInBackward<T>) {
      if (counters != nullptr)
        merge_split_sums<T, VEC, G, NV>(g, H, C, chunk, colptr, counters, partial_x, dx, nullptr,
                                        (T*)nullptr, partial_a, da_src);
    }
  }
}


// d a_edge_ij = dE_ij = g_ij P_ij (z_ij dP_ij - D_i), edge-parallel: one lane
// group per (CSR edge, head), dP_ij = dO_i . x_j reduced over the group (the
// PMF backward's SDDMM shape, balanced whatever the degrees). Reads D from the
// CSR walk.
template <typename Score, typename S, bool DROPOUT>
__global__ void __launch_bounds__(256)
gat_bwd_edge_kernel(const typename S::T* __restrict__ dout, const typename S::T* __restrict__ a_dst,
                    const typename S::T* __restrict__ a_src,
                    const typename S::T* __restrict__ a_edge, const typename S::T* __restrict__ x,
                    const float* __restrict__ lse2, const float* __restrict__ dsum,
                    const int* __restrict__ csr_row, const int* __restrict__ col,
                    float* __restrict__ da_edge, int64_t n_units, int H, int C, float slope,
                    float p, uint64_t seed) {
  using T = typename S::T;
  constexpr int VEC = S::VEC, G = S::G, NV = S::NV;
  const int64_t unit = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) / G;
  if (unit >= n_units) return;
  const int gl = threadIdx.x & (G - 1);
  const int64_t e = unit / H;
  const int h = (int)(unit - e * H);
  const int nvec = C / VEC;
  const int64_t HC = (int64_t)H * C, head_off = (int64_t)h * C;
  const int64_t i = __ldg(csr_row + e), j = __ldg(col + e);
  const Score sc = Score::make(a_dst, a_src, a_edge, slope);
  float gf[NV][VEC], xf[NV][VEC];
  load_row<T, VEC, G, NV>(dout + i * HC + head_off, gl, nvec, gf);
  load_row<T, VEC, G, NV>(x + j * HC + head_off, gl, nvec, xf);
  const float dP = group_sum<G>(dot_frag(gf, xf), group_mask<G>());
  if (gl != 0) return;
  const float pre = sc.dst_term(i, h, H) + sc.src_edge_term(j, e, h, H);
  const float pe = exp2f(sc.score2(pre) - __ldg(lse2 + i * H + h));
  float z = 1.f;
  if constexpr (DROPOUT) z = dropout_scale(p, seed, (uint64_t)unit);
  const float d = pe * (z * dP - __ldg(dsum + i * H + h));
  da_edge[unit] = sc.positive(pre) ? d : slope * d;
}

}  // namespace

std::vector<at::Tensor> gat_backward_cuda(
    const at::Tensor& grad_out, const at::Tensor& a_dst, const at::Tensor& a_src,
    const at::Tensor& x, const at::Tensor& out, const at::Tensor& lse2, const LayoutView& L,
    double negative_slope, double dropout, int64_t seed, const KernelPlan& plan,
    const at::Tensor& a_edge) {
  const bool edge = a_edge.defined();
  const char* op = edge ? "dfgnn::attention_bwd (additive_edge)"
                        : "dfgnn::attention_bwd (additive)";
  TORCH_CHECK(!edge || L.csr_row.defined(), op, ": the edge-parallel d a_edge kernel reads "
              "csr_row, which the plan object lacks (ScoreSpec.csr_row_backward)");
  check_vector_rows(op, plan.vector_rows, {{"x", &x}, {"out", &out}, {"grad_out", &grad_out}});
  const at::Tensor &rowptr = L.rowptr, &col = L.col, &colptr = L.colptr, &row = L.row,
                   &perm = L.perm;
  const Work &rw = L.rw, &cw = L.cw;
  const int64_t chunk = L.chunk;
  const int64_t N_dst = a_dst.size(0), N_src = x.size(0), H = x.size(1), C = x.size(2);
  // D [N_dst, H] and the split rows' partial da_dst, da_src, dx rows, small ones
  // in da_dst's allocation (host/scratch.h). dx and da_src, which only the source
  // walk writes, are allocated after the destination walk's launch: a small
  // graph's backward is host-bound, and their allocations then run while that
  // kernel does.
  // Half inputs: the split rows' partials of d a_dst, then their shares of D and
  // of c+ + slope c- (gat_split_dsum_kernel).
  const bool split_d = x.scalar_type() != at::kFloat && rw.num_slots > 0;
  Scratch scratch({N_dst * H, rw.num_slots * H * (split_d ? 3 : 1), cw.num_slots * H,
                   cw.num_slots * H * C});
  auto f32 = x.options().dtype(at::kFloat);
  auto da_dst = scratch.empty_with({N_dst, H}, f32);
  at::Tensor dx, da_src, da_edge;
  float *dsum = scratch[0], *part_d = scratch[1], *part_a = scratch[2], *part_x = scratch[3];
  const float p = (float)dropout, slope = (float)negative_slope;
  float* part_dc = split_d ? part_d + rw.num_slots * H : nullptr;
  const int64_t n_dst_units = rw.items.size(0) * H, n_src_units = cw.items.size(0) * H;
  constexpr int kThreads = kNodeBlock;
  auto stream = c10::cuda::getCurrentCUDAStream();
  int* counters = backward_split_counters(op, plan, x.scalar_type(), rw, cw, H).csr;  // both walks
  dispatch_rows(x.scalar_type(), C, plan.vector_rows, op, [&](auto shape) {
    using S = decltype(shape);
    using T = typename S::T;
    constexpr int G = S::G;
    with_additive_score<T>(edge, [&](auto score) {
      using Score = decltype(score);
      const T* ae = edge ? cptr<T>(a_edge) : nullptr;
      if (n_dst_units > 0) {  // before the source walk: it writes D
        auto kern = p > 0.f ? gat_bwd_dst_kernel<Score, S, true>
                            : gat_bwd_dst_kernel<Score, S, false>;
        kern<<<ceil_div(n_dst_units * G, kThreads), kThreads, 0, stream>>>(
            cptr<T>(grad_out), cptr<T>(a_dst), cptr<T>(a_src), ae, cptr<T>(x), cptr<T>(out),
            lse2.data_ptr<float>(), part_dc, rowptr.data_ptr<int>(), col.data_ptr<int>(),
            rw.items.data_ptr<int>(), (int)chunk, da_dst.data_ptr<float>(), part_d, dsum,
            n_dst_units, H, C, slope, p, (uint64_t)seed, (int)col.size(0), counters);
        check_launch();
        if (split_d) {
          const int64_t units = rw.combine.size(0) * H;
          gat_split_dsum_kernel<<<ceil_div(units, kThreads), kThreads, 0, stream>>>(
              part_d, part_dc, rw.combine.data_ptr<int>(), units, (int)H, dsum,
              da_dst.data_ptr<float>());
          check_launch();
        }
      }
      if constexpr (Score::kEdge) {  // after the CSR walk: it reads D
        const int64_t E = col.size(0), units = E * H;
        da_edge = at::empty({E, H}, f32);
        if (units > 0) {
          auto kern = p > 0.f ? gat_bwd_edge_kernel<Score, S, true>
                              : gat_bwd_edge_kernel<Score, S, false>;
          kern<<<ceil_div(units * G, kThreads), kThreads, 0, stream>>>(
              cptr<T>(grad_out), cptr<T>(a_dst), cptr<T>(a_src), ae, cptr<T>(x),
              lse2.data_ptr<float>(), dsum, L.csr_row.data_ptr<int>(), col.data_ptr<int>(),
              da_edge.data_ptr<float>(), units, (int)H, (int)C, slope, p, (uint64_t)seed);
          check_launch();
        }
      }
      dx = at::empty_like(x);
      da_src = at::empty({N_src, H}, f32);
      if (n_src_units > 0) {
        auto kern = p > 0.f ? gat_bwd_src_kernel<Score, S, true>
                            : gat_bwd_src_kernel<Score, S, false>;
        kern<<<ceil_div(n_src_units * G, kThreads), kThreads, 0, stream>>>(
            cptr<T>(grad_out), cptr<T>(a_dst), cptr<T>(a_src), ae, cptr<T>(x),
            lse2.data_ptr<float>(),
            dsum, colptr.data_ptr<int>(), row.data_ptr<int>(),
            perm.data_ptr<int>(), cw.items.data_ptr<int>(), (int)chunk, da_src.data_ptr<float>(),
            mptr<T>(dx), part_a, part_x, n_src_units, H, C,
            slope, p, (uint64_t)seed, (int)row.size(0), counters);
        check_launch();
      }
    });
  });
  if (counters == nullptr) {
    if (!split_d) combine_partials(part_d, rw.num_slots, rw.combine, da_dst);
    combine_partials(part_a, cw.num_slots, cw.combine, da_src);
    combine_partials(part_x, cw.num_slots, cw.combine, dx);
  }
  std::vector<at::Tensor> grads{da_dst.to(a_dst.scalar_type()), da_src.to(a_src.scalar_type()),
                                dx};
  if (edge) grads.push_back(da_edge.to(a_edge.scalar_type()));
  return grads;
}

}  // namespace dfgnn
