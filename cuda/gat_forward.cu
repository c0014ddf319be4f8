// Forward pass of additive attention (GAT / GATConv, paper §5.1 "add-SDDMM"):
//   e_ij = LeakyReLU(a_dst_i + a_src_j),  out_i = sum_{j -> i} softmax_j(e_ij) x_j
// with a_dst = a_dst^T W x_i and a_src = a_src^T W x_j computed densely ([N, H]).
//
// SMMF only (paper Fig. 12: the per-edge score is one add, so edge-parallel
// SDDMM has nothing to balance): one lane group per (dst, head) work item, the
// score is a scalar gather, the softmax is online and the row of x_j is the only
// vector load per edge. Split rows are merged like the GT kernel's.
#include "common.cuh"
#include "ops.h"

namespace dfgnn {
namespace {

template <typename T, int VEC, int G, int NV, bool DROPOUT>
__global__ void __launch_bounds__(256)
gat_fwd_kernel(const T* __restrict__ a_dst, const T* __restrict__ a_src, const T* __restrict__ x,
               const int* __restrict__ rowptr, const int* __restrict__ col,
               const int* __restrict__ items, int chunk, T* __restrict__ out,
               float* __restrict__ lse2, float* __restrict__ attn, float* __restrict__ partial,
               float* __restrict__ partial_ml, int64_t n_units, int H, int C, float slope,
               float p, uint64_t seed) {
  constexpr int U = edges_in_flight<VEC, NV>();
  using P = typename Packed<T, VEC>::type;
  GroupItem g;
  if (!group_item<G>(items, rowptr, chunk, n_units, H, g)) return;
  const int gl = g.gl, h = g.h, slot = g.slot, beg = g.beg, end = g.end;
  const int64_t i = g.row;
  const int nvec = C / VEC;
  const int64_t HC = (int64_t)H * C;
  const float ad = to_float(a_dst[i * H + h]);

  float acc[NV][VEC];
  zero_frag(acc);
  float m = kNegInf, l = 0.f;
  for (int e0 = beg; e0 < end; e0 += U) {
    int j[U];
    P xf[U][NV];
    float s[U];
#pragma unroll
    for (int u = 0; u < U; ++u) j[u] = (e0 + u < end) ? __ldg(col + e0 + u) : -1;
#pragma unroll
    for (int u = 0; u < U; ++u) {
      if (j[u] >= 0) {
        load_packed<T, VEC, G, NV>(x + (int64_t)j[u] * HC + (int64_t)h * C, gl, nvec, xf[u]);
        s[u] = leaky_relu(ad + to_float(__ldg(a_src + (int64_t)j[u] * H + h)), slope) * kLog2e;
      }
    }
    float mc = m;
#pragma unroll
    for (int u = 0; u < U; ++u)
      if (j[u] >= 0) mc = fmaxf(mc, s[u]);
    const float corr = exp2f(m - mc);  // 0 on the first step (m = -inf)
    l *= corr;
    scale_frag(corr, acc);
#pragma unroll
    for (int u = 0; u < U; ++u) {
      if (j[u] >= 0) {
        const float pe = exp2f(s[u] - mc);
        l += pe;
        float w = pe;
        if constexpr (DROPOUT) w *= dropout_scale(p, seed, (uint64_t)(e0 + u) * H + h);
        axpy_packed<T, VEC, NV>(w, xf[u], acc);
        if (attn != nullptr && gl == 0) attn[(int64_t)(e0 + u) * H + h] = s[u];
      }
    }
    m = mc;
  }
  if (slot >= 0) {  // part of a split row: merged by merge_softmax_partials
    store_partial<VEC, G, NV>(partial + (int64_t)slot * HC + (int64_t)h * C, gl, nvec, acc);
    if (gl == 0) {
      partial_ml[((int64_t)slot * H + h) * 2] = m;
      partial_ml[((int64_t)slot * H + h) * 2 + 1] = l;
    }
    return;
  }
  const float inv = l > 0.f ? 1.f / l : 0.f;
  store_row<T, VEC, G, NV>(out + i * HC + (int64_t)h * C, gl, nvec, acc, inv);
  const float L = l > 0.f ? m + log2f(l) : kNegInf;
  if (gl == 0) lse2[i * H + h] = L;
  if (attn != nullptr) {
    __syncwarp(g.mask);  // raw scores written by lane 0 become visible to the group
    for (int e = beg + gl; e < end; e += G) {
      const int64_t a = (int64_t)e * H + h;
      attn[a] = exp2f(attn[a] - L);
    }
  }
}

}  // namespace

std::tuple<at::Tensor, at::Tensor, at::Tensor> gat_forward_cuda(
    const at::Tensor& a_dst, const at::Tensor& a_src, const at::Tensor& x, const at::Tensor& rowptr,
    const at::Tensor& col, const Work& rw, int64_t chunk, double negative_slope, double dropout,
    int64_t seed, bool need_attn) {
  const int64_t N_dst = a_dst.size(0), H = x.size(1), C = x.size(2), E = col.size(0);
  auto f32 = x.options().dtype(at::kFloat);
  auto out = at::empty({N_dst, H, C}, x.options());
  auto lse2 = at::empty({N_dst, H}, f32);
  auto attn = need_attn ? at::empty({E, H}, f32) : at::empty({0}, f32);
  auto partial = at::empty({rw.num_slots, H, C}, f32);
  auto partial_ml = at::empty({rw.num_slots, H, 2}, f32);
  const float p = (float)dropout, slope = (float)negative_slope;
  const bool aligned = is_aligned16(x) && is_aligned16(out);
  const int64_t n_units = rw.items.size(0) * H;
  constexpr int kThreads = 256;
  auto stream = at::cuda::getCurrentCUDAStream();
  bool ok = false;
  DFGNN_DISPATCH_FLOAT_TYPES(x.scalar_type(), "gat_forward", [&] {
    using T = typename cuda_type<scalar_t>::type;
    auto P = [](const at::Tensor& t) { return reinterpret_cast<const T*>(t.data_ptr<scalar_t>()); };
    ok = dispatch_row_shape<T>(C, aligned, [&](auto VEC_, auto G_, auto NV_) {
      constexpr int VEC = decltype(VEC_)::value, G = decltype(G_)::value, NV = decltype(NV_)::value;
      if (n_units == 0) return;
      auto kern = p > 0.f ? gat_fwd_kernel<T, VEC, G, NV, true> : gat_fwd_kernel<T, VEC, G, NV, false>;
      kern<<<ceil_div(n_units * G, kThreads), kThreads, 0, stream>>>(
          P(a_dst), P(a_src), P(x), rowptr.data_ptr<int>(), col.data_ptr<int>(),
          rw.items.data_ptr<int>(), (int)chunk, reinterpret_cast<T*>(out.data_ptr<scalar_t>()),
          lse2.data_ptr<float>(), need_attn ? attn.data_ptr<float>() : nullptr,
          partial.data_ptr<float>(), partial_ml.data_ptr<float>(), n_units, H, C, slope, p,
          (uint64_t)seed);
      check_launch();
    });
  });
  TORCH_CHECK(ok, "dfgnn::gat_fwd: head size C=", std::to_string(C),
              " is not supported by the fused kernels");
  if (rw.combine.size(0) > 0) {
    merge_softmax_partials(partial, partial_ml, rw.combine, out, lse2);
    if (need_attn) normalize_split_attn(rw.combine, rowptr, lse2, attn);
  }
  return {out, lse2, attn};
}

}  // namespace dfgnn
