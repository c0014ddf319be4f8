// Forward pass of dot-product attention (Graph Transformer / TransformerConv):
//   out_i = sum_{j -> i} softmax_j(scale * q_i . k_j) * v_j      (paper eq. 1-2)
//
// SMMF: one node-parallel kernel. A group of G lanes owns one (dst, head) row;
//   edges are consumed U at a time with all k_j and v_j loads of the step issued
//   before the first use, scores stay in registers and the softmax is computed
//   online (running max / sum, flash-attention style), so any in-degree works in
//   one pass with no score buffer at all.
// PMF: edge-parallel SDDMM writes scores [E, H] to global memory (balanced
//   whatever the degrees); then a node-parallel softmax + SpMM kernel walks
//   work items of at most `chunk` edges, so a super node is spread over many
//   warps; rows split over several items are summed by a combine kernel (fixed
//   order, no atomics, deterministic).
//
// Scores are kept in base 2 (scale already multiplied by log2(e)) so every
// exponential is a single exp2f; `lse2` is the per-row log2-sum-exp saved for
// the backward (O(N H) memory).
#include "common.cuh"
#include "ops.h"

namespace dfgnn {
namespace {

template <typename T, int VEC, int G, int NV, bool DROPOUT>
__global__ void __launch_bounds__(256)
gt_fwd_smmf_kernel(const T* __restrict__ q, const T* __restrict__ k, const T* __restrict__ v,
                   const int* __restrict__ rowptr, const int* __restrict__ col,
                   const int* __restrict__ items, int chunk, T* __restrict__ out,
                   float* __restrict__ lse2, float* __restrict__ attn, float* __restrict__ partial,
                   float* __restrict__ partial_ml, int64_t n_units, int H, int C, float scale2,
                   float p, uint64_t seed) {
  constexpr int U = edges_in_flight<VEC, NV>();
  using P = typename Packed<T, VEC>::type;
  GroupItem g;
  if (!group_item<G>(items, rowptr, chunk, n_units, H, g)) return;
  const int gl = g.gl, h = g.h, slot = g.slot, beg = g.beg, end = g.end;
  const unsigned mask = g.mask;
  const int64_t i = g.row;
  const int nvec = C / VEC;
  const int64_t HC = (int64_t)H * C;

  float qf[NV][VEC];
  load_row<T, VEC, G, NV>(q + i * HC + (int64_t)h * C, gl, nvec, qf);
  scale_frag(scale2, qf);
  float acc[NV][VEC];
  zero_frag(acc);
  float m = kNegInf, l = 0.f;

  for (int e0 = beg; e0 < end; e0 += U) {
    int j[U];
    P kf[U][NV], vf[U][NV];
    float s[U];
    load_edge_rows<T, VEC, G, NV, U>(col, e0, end, k, v, HC, (int64_t)h * C, gl, nvec, j, kf, vf);
#pragma unroll
    for (int u = 0; u < U; ++u) s[u] = j[u] >= 0 ? dot_packed<T, VEC, NV>(qf, kf[u]) : 0.f;
#pragma unroll
    for (int u = 0; u < U; ++u) s[u] = group_sum<G>(s[u], mask);
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
        axpy_packed<T, VEC, NV>(w, vf[u], acc);
        if (attn != nullptr && gl == 0) attn[(int64_t)(e0 + u) * H + h] = s[u];
      }
    }
    m = mc;
  }
  if (slot >= 0) {  // part of a split row: unnormalised partial, merged by smmf_combine
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
    __syncwarp(mask);  // raw scores written by lane 0 become visible to the group
    for (int e = beg + gl; e < end; e += G) {
      const int64_t a = (int64_t)e * H + h;
      attn[a] = exp2f(attn[a] - L);
    }
  }
}

// PMF step 1: edge-parallel SDDMM, one group per (edge, head), CSR order.
template <typename T, int VEC, int G, int NV>
__global__ void __launch_bounds__(256)
gt_sddmm_kernel(const T* __restrict__ q, const T* __restrict__ k, const int* __restrict__ csr_row,
                const int* __restrict__ col, float* __restrict__ score, int64_t n_units, int H, int C,
                float scale2) {
  const int64_t unit = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) / G;
  if (unit >= n_units) return;
  const int gl = threadIdx.x & (G - 1);
  const unsigned mask = group_mask<G>();
  const int64_t e = unit / H;
  const int h = (int)(unit - e * H);
  const int nvec = C / VEC;
  const int64_t HC = (int64_t)H * C;
  float qf[NV][VEC], kf[NV][VEC];
  load_row<T, VEC, G, NV>(q + (int64_t)__ldg(csr_row + e) * HC + (int64_t)h * C, gl, nvec, qf);
  load_row<T, VEC, G, NV>(k + (int64_t)__ldg(col + e) * HC + (int64_t)h * C, gl, nvec, kf);
  const float s = group_sum<G>(dot_frag(qf, kf), mask) * scale2;
  if (gl == 0) score[unit] = s;
}

// PMF step 2: softmax + SpMM over one work item (row, [start, start + chunk)).
// Row statistics are taken over the whole row (redundancy-free: lanes are
// spread over edges, not features); the item's partial sum goes to `out` when
// the row is a single item (slot < 0), else to `partial[slot]`.
template <typename T, int VEC, int G, int NV, bool DROPOUT>
__global__ void __launch_bounds__(256)
gt_softmax_spmm_kernel(const T* __restrict__ v, const float* __restrict__ score,
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
  for (int e0 = start; e0 < end; e0 += U) {
    using P = typename Packed<T, VEC>::type;
    int j[U];
    P vf[U][NV];
    float w[U];
#pragma unroll
    for (int u = 0; u < U; ++u) j[u] = (e0 + u < end) ? __ldg(col + e0 + u) : -1;
#pragma unroll
    for (int u = 0; u < U; ++u) {
      if (j[u] >= 0) {
        load_packed<T, VEC, G, NV>(v + (int64_t)j[u] * HC + (int64_t)h * C, gl, nvec, vf[u]);
        w[u] = exp2f(score[(int64_t)(e0 + u) * H + h] - L);
      }
    }
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

std::tuple<at::Tensor, at::Tensor, at::Tensor> gt_forward_cuda(
    const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& rowptr,
    const at::Tensor& col, const Work& rw, const c10::optional<at::Tensor>& csr_row,
    int64_t chunk, double scale, double dropout, int64_t seed, bool pmf, bool need_attn) {
  const int64_t N_dst = q.size(0), H = q.size(1), C = q.size(2), E = col.size(0);
  auto out = at::empty_like(q);
  auto lse2 = at::empty({N_dst, H}, q.options().dtype(at::kFloat));
  auto f32 = q.options().dtype(at::kFloat);
  auto attn = need_attn ? at::empty({E, H}, f32) : at::empty({0}, f32);
  float* attn_p = need_attn ? attn.data_ptr<float>() : nullptr;
  auto partial = at::empty({rw.num_slots, H, C}, f32);
  const float scale2 = (float)(scale * kLog2e);
  const float p = (float)dropout;
  const bool drop = p > 0.f;
  const bool aligned = is_aligned16(q) && is_aligned16(k) && is_aligned16(v) && is_aligned16(out);
  auto stream = at::cuda::getCurrentCUDAStream();
  constexpr int kThreads = 256;
  const int64_t n_items = rw.items.size(0), n_split = rw.combine.size(0);
  const int64_t n_units = n_items * H;
  const int* items = rw.items.data_ptr<int>();
  bool ok = false;

  DFGNN_DISPATCH_FLOAT_TYPES(q.scalar_type(), "gt_forward", [&] {
    using T = typename cuda_type<scalar_t>::type;
    const T* qp = reinterpret_cast<const T*>(q.data_ptr<scalar_t>());
    const T* kp = reinterpret_cast<const T*>(k.data_ptr<scalar_t>());
    const T* vp = reinterpret_cast<const T*>(v.data_ptr<scalar_t>());
    T* op = reinterpret_cast<T*>(out.data_ptr<scalar_t>());
    ok = dispatch_row_shape<T>(C, aligned, [&](auto VEC_, auto G_, auto NV_) {
      constexpr int VEC = decltype(VEC_)::value, G = decltype(G_)::value, NV = decltype(NV_)::value;
      if (n_units == 0) return;
      const int blocks = ceil_div(n_units * G, kThreads);
      if (!pmf) {
        auto partial_ml = at::empty({rw.num_slots, H, 2}, f32);
        auto kern = drop ? gt_fwd_smmf_kernel<T, VEC, G, NV, true>
                         : gt_fwd_smmf_kernel<T, VEC, G, NV, false>;
        kern<<<blocks, kThreads, 0, stream>>>(
            qp, kp, vp, rowptr.data_ptr<int>(), col.data_ptr<int>(), items, (int)chunk, op,
            lse2.data_ptr<float>(), attn_p, partial.data_ptr<float>(), partial_ml.data_ptr<float>(),
            n_units, H, C, scale2, p, (uint64_t)seed);
        check_launch();
        if (n_split > 0) {
          merge_softmax_partials(partial, partial_ml, rw.combine, out, lse2);
          if (need_attn) normalize_split_attn(rw.combine, rowptr, lse2, attn);
        }
        return;
      }
      auto score = at::empty({E, H}, f32);
      const int64_t n_edge_units = E * H;
      if (n_edge_units > 0) {
        gt_sddmm_kernel<T, VEC, G, NV><<<ceil_div(n_edge_units * G, kThreads), kThreads, 0, stream>>>(
            qp, kp, csr_row->data_ptr<int>(), col.data_ptr<int>(), score.data_ptr<float>(),
            n_edge_units, H, C, scale2);
        check_launch();
      }
      // Every row owns at least one item (an empty row's item writes zeros and
      // lse = -inf); rows longer than `chunk` own several, summed by combine.
      auto kern = drop ? gt_softmax_spmm_kernel<T, VEC, G, NV, true>
                       : gt_softmax_spmm_kernel<T, VEC, G, NV, false>;
      kern<<<blocks, kThreads, 0, stream>>>(
          vp, score.data_ptr<float>(), rowptr.data_ptr<int>(), col.data_ptr<int>(), items,
          (int)chunk, op, partial.data_ptr<float>(), lse2.data_ptr<float>(), attn_p, n_units, H, C,
          p, (uint64_t)seed);
      check_launch();
      combine_partials(partial, rw.combine, out);
    });
  });
  TORCH_CHECK(ok, "dfgnn::gt_fwd: head size C=", std::to_string(C), " is not supported by the fused kernels "
              "(pyg_dfgnn.ops.schedule.kernel_supports says which sizes are)");
  return {out, lse2, attn};
}

}  // namespace dfgnn
