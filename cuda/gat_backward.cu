// Backward pass of additive attention (GAT). With P the softmax, z the dropout
// multiplier, dP_ij = dO_i . x_j and D_i = dO_i . O_i:
//   dS_ij = P_ij (z_ij dP_ij - D_i),  dE_ij = dS_ij * LeakyReLU'(a_dst_i + a_src_j)
//   d a_dst_i = sum_j dE_ij            (CSR walk over destinations)
//   d a_src_j = sum_i dE_ij,  dx_j = sum_i P_ij z_ij dO_i   (CSC walk over sources)
// Each output row is owned by one lane group (split rows: fixed-order combine):
// no atomics, deterministic. Only lse2 [N, H] is saved by the forward.
#include "common.cuh"
#include "ops.h"

namespace dfgnn {
namespace {

// Whether the per-edge dP sums end in the lane that owns the edge (a
// reduce-scatter, group_reduce_scatter: 6 shuffles for four edges over a warp)
// or in every lane (four butterflies: 20). Measured (same run, fwd+bwd): a warp
// per head row 3-7 % faster with owners (PATTERN 1.62 -> 1.51 ms, Reddit-like
// 4.65 -> 4.39); 8 lanes per row 1-8 % slower (COCO-SP 4 x 32 1.88 -> 2.02;
// benchmarks/NOTES.md, v6).
template <int G> constexpr bool kOwnerSums = G == 32;

template <typename T, int VEC, int G, int NV, bool DROPOUT>
__global__ void __launch_bounds__(256)
gat_bwd_dst_kernel(const T* __restrict__ dout, const T* __restrict__ a_dst,
                   const T* __restrict__ a_src, const T* __restrict__ x, const T* __restrict__ out,
                   const float* __restrict__ lse2, const int* __restrict__ rowptr,
                   const int* __restrict__ col, const int* __restrict__ items, int chunk,
                   float* __restrict__ da_dst, float* __restrict__ partial,
                   float* __restrict__ dsum, int64_t n_units, int H, int C, float slope, float p,
                   uint64_t seed) {
  constexpr int U = edges_in_flight<VEC, NV>();
  using P = typename Packed<T, VEC>::type;
  GroupItem g;
  if (!group_item<G>(items, rowptr, chunk, n_units, H, g)) return;
  const int gl = g.gl, h = g.h, slot = g.slot, beg = g.beg, end = g.end;
  const unsigned mask = g.mask;
  const int64_t i = g.row;
  const int nvec = C / VEC;
  const int64_t HC = (int64_t)H * C;
  const int64_t off_i = i * HC + (int64_t)h * C;

  float gf[NV][VEC], of[NV][VEC];
  load_row<T, VEC, G, NV>(dout + off_i, gl, nvec, gf);
  load_row<T, VEC, G, NV>(out + off_i, gl, nvec, of);
  const float D = group_sum<G>(dot_frag(gf, of), mask);
  if (gl == 0 && beg == g.row_beg) dsum[i * H + h] = D;
  const float L = lse2[i * H + h];
  const float ad = to_float(a_dst[i * H + h]);
  float acc = 0.f;  // sum of dE over the edges this lane owns (all edges: !kOwnerSums)
  const int uo = gl / (G / U);  // the edge of each step this lane owns
  NbrPipe<U, kIndexAhead<T>> nb(col, beg, end);
  for (int e0 = beg; e0 < end; e0 += U) {
    int j[U];
    P xf[U][NV];
    float e[U], dp[U];
    load_edge_row<T, VEC, G, NV, U>(nb, e0, x, HC, (int64_t)h * C, gl, nvec, j, xf, e,
                                    [&](int, int jj) {
      return ad + to_float(__ldg(a_src + (int64_t)jj * H + h));
    });
#pragma unroll
    for (int u = 0; u < U; ++u) dp[u] = j[u] >= 0 ? dot_packed<T, VEC, NV>(gf, xf[u]) : 0.f;
    if constexpr (kOwnerSums<G>) {
      // Each dP is needed in one lane only: this lane owns edge e0 + uo and adds
      // its dE (one edge's exp / dropout per lane instead of U).
      const float dpo = group_reduce_scatter<G, U>(dp, mask);
      int jo = -1;
      float eo = 0.f;
#pragma unroll
      for (int u = 0; u < U; ++u) {
        if (u == uo) {
          jo = j[u];
          eo = e[u];
        }
      }
      if (jo >= 0) {
        const float pe = exp2f(leaky_relu(eo, slope) * kLog2e - L);
        float z = 1.f;
        if constexpr (DROPOUT) z = dropout_scale(p, seed, (uint64_t)(e0 + uo) * H + h);
        acc += pe * (z * dpo - D) * leaky_grad(eo, slope);
      }
    } else {  // every lane sums every edge's dE
#pragma unroll
      for (int u = 0; u < U; ++u) dp[u] = group_sum<G>(dp[u], mask);
#pragma unroll
      for (int u = 0; u < U; ++u) {
        if (j[u] >= 0) {
          const float pe = exp2f(leaky_relu(e[u], slope) * kLog2e - L);
          float z = 1.f;
          if constexpr (DROPOUT) z = dropout_scale(p, seed, (uint64_t)(e0 + u) * H + h);
          acc += pe * (z * dp[u] - D) * leaky_grad(e[u], slope);
        }
      }
    }
  }
  // Owners: lanes uo * (G / U) .. hold copies of the same sums, count one of each.
  if constexpr (kOwnerSums<G>) acc = group_sum<G>(gl % (G / U) == 0 ? acc : 0.f, mask);
  if (gl == 0) {
    if (slot < 0) da_dst[i * H + h] = acc;
    else partial[(int64_t)slot * H + h] = acc;
  }
}

template <typename T, int VEC, int G, int NV, bool DROPOUT>
__global__ void __launch_bounds__(256)
gat_bwd_src_kernel(const T* __restrict__ dout, const T* __restrict__ a_dst,
                   const T* __restrict__ a_src, const T* __restrict__ x,
                   const float* __restrict__ lse2, const float* __restrict__ dsum,
                   const int* __restrict__ colptr, const int* __restrict__ row,
                   const int* __restrict__ perm, const int* __restrict__ items, int chunk,
                   float* __restrict__ da_src, T* __restrict__ dx, float* __restrict__ partial_a,
                   float* __restrict__ partial_x, int64_t n_units, int H, int C, float slope,
                   float p, uint64_t seed) {
  constexpr int U = edges_in_flight<VEC, NV>();
  using P = typename Packed<T, VEC>::type;
  GroupItem g;
  if (!group_item<G>(items, colptr, chunk, n_units, H, g)) return;
  const int gl = g.gl, h = g.h, slot = g.slot, beg = g.beg, end = g.end;
  const unsigned mask = g.mask;
  const int64_t j = g.row;
  const int nvec = C / VEC;
  const int64_t HC = (int64_t)H * C;
  const int64_t off_j = j * HC + (int64_t)h * C;

  float xf[NV][VEC], dx_acc[NV][VEC];
  load_row<T, VEC, G, NV>(x + off_j, gl, nvec, xf);
  zero_frag(dx_acc);
  const float as = to_float(a_src[j * H + h]);
  float da = 0.f;  // sum of d a_src over the edges this lane owns (all edges: !kOwnerSums)
  const int uo = gl / (G / U);  // the edge of each step this lane owns
  NbrPipe<U, kIndexAhead<T>> nb(row, beg, end);
  for (int e0 = beg; e0 < end; e0 += U) {
    int i[U];
    P gf[U][NV];
    float e[U], dp[U], lse_i[U], d_i[U];
    load_edge_row<T, VEC, G, NV, U>(nb, e0, dout, HC, (int64_t)h * C, gl, nvec, i, gf, e,
                                    [&](int, int ii) {
      return to_float(__ldg(a_dst + (int64_t)ii * H + h)) + as;
    });
    // Issued with the row loads, not after the reductions (as in gt_bwd_dkv_kernel).
#pragma unroll
    for (int u = 0; u < U; ++u) {
      if (i[u] >= 0) {
        lse_i[u] = __ldg(lse2 + (int64_t)i[u] * H + h);
        d_i[u] = __ldg(dsum + (int64_t)i[u] * H + h);
      }
    }
#pragma unroll
    for (int u = 0; u < U; ++u) dp[u] = i[u] >= 0 ? dot_packed<T, VEC, NV>(xf, gf[u]) : 0.f;
    if constexpr (kOwnerSums<G>) {
      // Each dP is needed in one lane only (as in gat_bwd_dst_kernel).
      const float dpo = group_reduce_scatter<G, U>(dp, mask);
      float da_o = 0.f;
#pragma unroll
      for (int u = 0; u < U; ++u) {
        if (i[u] >= 0) {
          const float pe = exp2f(leaky_relu(e[u], slope) * kLog2e - lse_i[u]);
          float z = 1.f;
          if constexpr (DROPOUT) z = dropout_scale(p, seed, (uint64_t)__ldg(perm + e0 + u) * H + h);
          axpy_packed<T, VEC, NV>(pe * z, gf[u], dx_acc);
          if (u == uo) da_o = pe * (z * dpo - d_i[u]) * leaky_grad(e[u], slope);
        }
      }
      da += da_o;
    } else {  // every lane sums every edge's d a_src (two loops, not one with the
              // choice inside: that measured 4-5 % slower at G = 8; NOTES.md, v6.1)
#pragma unroll
      for (int u = 0; u < U; ++u) dp[u] = group_sum<G>(dp[u], mask);
#pragma unroll
      for (int u = 0; u < U; ++u) {
        if (i[u] >= 0) {
          const float pe = exp2f(leaky_relu(e[u], slope) * kLog2e - lse_i[u]);
          float z = 1.f;
          if constexpr (DROPOUT) z = dropout_scale(p, seed, (uint64_t)__ldg(perm + e0 + u) * H + h);
          axpy_packed<T, VEC, NV>(pe * z, gf[u], dx_acc);
          da += pe * (z * dp[u] - d_i[u]) * leaky_grad(e[u], slope);
        }
      }
    }
  }
  if constexpr (kOwnerSums<G>) da = group_sum<G>(gl % (G / U) == 0 ? da : 0.f, mask);
  if (slot < 0) {
    store_row<T, VEC, G, NV>(dx + off_j, gl, nvec, dx_acc, 1.f);
    if (gl == 0) da_src[j * H + h] = da;
  } else {
    store_partial<VEC, G, NV>(partial_x + (int64_t)slot * HC + (int64_t)h * C, gl, nvec, dx_acc);
    if (gl == 0) partial_a[(int64_t)slot * H + h] = da;
  }
}

}  // namespace

std::tuple<at::Tensor, at::Tensor, at::Tensor> gat_backward_cuda(
    const at::Tensor& grad_out, const at::Tensor& a_dst, const at::Tensor& a_src,
    const at::Tensor& x, const at::Tensor& out, const at::Tensor& lse2, const at::Tensor& rowptr,
    const at::Tensor& col, const Work& rw, const at::Tensor& colptr, const at::Tensor& row,
    const at::Tensor& perm, const Work& cw, int64_t chunk, double negative_slope, double dropout,
    int64_t seed) {
  const int64_t N_dst = a_dst.size(0), N_src = x.size(0), H = x.size(1), C = x.size(2);
  auto f32 = x.options().dtype(at::kFloat);
  auto da_dst = at::empty({N_dst, H}, f32);
  auto da_src = at::empty({N_src, H}, f32);
  auto dx = at::empty_like(x);
  auto dsum = at::empty({N_dst, H}, f32);
  auto part_d = at::empty({rw.num_slots, H}, f32);
  auto part_a = at::empty({cw.num_slots, H}, f32);
  auto part_x = at::empty({cw.num_slots, H, C}, f32);
  const float p = (float)dropout, slope = (float)negative_slope;
  const bool aligned = is_aligned16(x) && is_aligned16(out) && is_aligned16(grad_out);
  const int64_t n_dst_units = rw.items.size(0) * H, n_src_units = cw.items.size(0) * H;
  constexpr int kThreads = 256;
  auto stream = at::cuda::getCurrentCUDAStream();
  dispatch_rows(x.scalar_type(), C, aligned, "dfgnn::gat_bwd", [&](auto T_, auto VEC_, auto G_,
                                                                  auto NV_) {
    using T = typename decltype(T_)::type;
    constexpr int VEC = decltype(VEC_)::value, G = decltype(G_)::value, NV = decltype(NV_)::value;
    if (n_dst_units > 0) {  // before the source walk: it writes D
      auto kern = p > 0.f ? gat_bwd_dst_kernel<T, VEC, G, NV, true>
                          : gat_bwd_dst_kernel<T, VEC, G, NV, false>;
      kern<<<ceil_div(n_dst_units * G, kThreads), kThreads, 0, stream>>>(
          cptr<T>(grad_out), cptr<T>(a_dst), cptr<T>(a_src), cptr<T>(x), cptr<T>(out),
          lse2.data_ptr<float>(),
          rowptr.data_ptr<int>(), col.data_ptr<int>(), rw.items.data_ptr<int>(), (int)chunk,
          da_dst.data_ptr<float>(), part_d.data_ptr<float>(), dsum.data_ptr<float>(),
          n_dst_units, H, C, slope, p, (uint64_t)seed);
      check_launch();
    }
    if (n_src_units > 0) {
      auto kern = p > 0.f ? gat_bwd_src_kernel<T, VEC, G, NV, true>
                          : gat_bwd_src_kernel<T, VEC, G, NV, false>;
      kern<<<ceil_div(n_src_units * G, kThreads), kThreads, 0, stream>>>(
          cptr<T>(grad_out), cptr<T>(a_dst), cptr<T>(a_src), cptr<T>(x), lse2.data_ptr<float>(),
          dsum.data_ptr<float>(),
          colptr.data_ptr<int>(), row.data_ptr<int>(), perm.data_ptr<int>(),
          cw.items.data_ptr<int>(), (int)chunk, da_src.data_ptr<float>(),
          mptr<T>(dx), part_a.data_ptr<float>(),
          part_x.data_ptr<float>(), n_src_units, H, C, slope, p, (uint64_t)seed);
      check_launch();
    }
  });
  combine_partials(part_d, rw.combine, da_dst);
  combine_partials(part_a, cw.combine, da_src);
  combine_partials(part_x, cw.combine, dx);
  return {da_dst.to(a_dst.scalar_type()), da_src.to(a_src.scalar_type()), dx};
}

}  // namespace dfgnn
