// Forward pass of dot-product attention (Graph Transformer / TransformerConv):
//   out_i = sum_{j -> i} softmax_j(scale * q_i . k_j) * v_j      (paper eq. 1-2)
//
// SMMF: one node-parallel kernel. A group of G lanes owns one (dst, head) row;
//   edges are consumed U at a time with all k_j and v_j loads of the step issued
//   before the first use, scores stay in registers and the softmax is computed
//   online (running max / sum, flash-attention style), so any in-degree works in
//   one pass with no score buffer at all.
// PMF: edge-parallel SDDMM writes scores [E, H] to global memory (balanced
//   whatever the degrees); then softmax_spmm (softmax_spmm.cu) walks work items
//   of at most `chunk` edges.
//
// Scores are kept in base 2 (scale already multiplied by log2(e)) so every
// exponential is a single exp2f; `lse2` is the per-row log2-sum-exp saved for
// the backward (O(N H) memory).
#include "device/edge_walk.cuh"
#include "device/fragments.cuh"
#include "device/lane_group.cuh"
#include "device/numerics.cuh"
#include "device/online_softmax.cuh"
#include "device/work_items.cuh"
#include "host/dispatch.cuh"
#include "host/forward_call.h"
#include "host/ops.h"

namespace dfgnn {
namespace {

// UF > 0 overrides the edges in flight (the two-rows-per-warp variant below
// uses 2, capped to 3 blocks per SM like the default shape).
// COS (AGNN's cosine score, cosine_forward_cuda): q = k = v = x, unnormalised,
// and rnorm [N, H] = +-1 / max(||x||, eps); the score of edge j -> i is
// beta log2(e) rnorm_i rnorm_j (x_i . x_j), so each edge gathers one row (used
// for the dot product and the SpMM) and one scalar instead of a normalised k row
// and a v row.
// MERGE: the variant that merges split rows in the kernel (with_merge_variant).
// EXTRAS: the variant with attention dropout and attention weights
// (OnlineSoftmax), for calls that ask for either.
template <typename S, bool EXTRAS, int UF = 0, bool COS = false,
          bool MERGE = true>
__global__ void __launch_bounds__(256, UF == 2 ? 3 : 0)
gt_fwd_smmf_kernel(const typename S::T* __restrict__ q, const typename S::T* __restrict__ k,
                   const typename S::T* __restrict__ v, const int* __restrict__ rowptr,
                   const int* __restrict__ col, const int* __restrict__ items, int chunk,
                   typename S::T* __restrict__ out, float* __restrict__ lse2,
                   float* __restrict__ attn, float* __restrict__ partial,
                   float* __restrict__ partial_ml, int64_t n_units, int H, int C, float scale2,
                   float p, uint64_t seed, const float* __restrict__ rnorm,
                   const float* __restrict__ beta, int* __restrict__ counters) {
  using T = typename S::T;
  constexpr int VEC = S::VEC, G = S::G, NV = S::NV;
  constexpr int U = UF ? UF : edges_in_flight<VEC, NV>();
  using P = typename Packed<T, VEC>::type;
  GroupItem g;
  if (!group_item<G>(items, rowptr, chunk, n_units, H, g)) return;
  const int gl = g.gl, h = g.h, beg = g.beg, end = g.end;
  const unsigned mask = g.mask;
  const int64_t i = g.row;
  const int nvec = C / VEC;
  const int64_t HC = (int64_t)H * C;

  float qf[NV][VEC];
  load_row<T, VEC, G, NV>(q + i * HC + (int64_t)h * C, gl, nvec, qf);
  if constexpr (COS) scale2 = __ldg(beta) * kLog2e * fabsf(__ldg(rnorm + i * H + h));
  scale_frag(scale2, qf);
  OnlineSoftmax<T, VEC, G, NV, U, EXTRAS> os;
  NbrPipe<U, kForwardIndexAhead<T, NV>> nb(col, beg, end);
  // One step of U edges; FULL: all U exist (for_each_step).
  auto edge_step = [&](int e0, auto full) {
    constexpr bool FULL = decltype(full)::value;
    int j[U];
    float s[U];
    [[maybe_unused]] float rj[U];
    P kf[U][NV];
    [[maybe_unused]] P vf[U][NV];  // COS: the x row is both k and v (vf, rj unused otherwise)
    if constexpr (COS) {
      load_edge_row<T, VEC, G, NV, U>(nb, e0, k, HC, (int64_t)h * C, gl, nvec, j, kf, rj,
                                      [&](int, int jj) {
        return fabsf(__ldg(rnorm + (int64_t)jj * H + h));
      });
    } else {
      load_edge_rows<T, VEC, G, NV, U, kForwardIndexAhead<T, NV>, FULL>(
          nb, e0, k, v, HC, (int64_t)h * C, gl, nvec, j, kf, vf);
    }
#pragma unroll
    for (int u = 0; u < U; ++u)
      s[u] = FULL || j[u] >= 0 ? dot_packed<T, VEC, NV>(qf, kf[u]) : 0.f;
    group_sum_many<G, U>(s, mask);
    if constexpr (COS) {
#pragma unroll
      for (int u = 0; u < U; ++u) s[u] *= j[u] >= 0 ? rj[u] : 0.f;
      os.template step<FULL>(j, s, kf, e0, H, h, p, seed, attn, gl);
    } else {
      os.template step<FULL>(j, s, vf, e0, H, h, p, seed, attn, gl);
    }
  };
  for_each_step<U>(beg, end, edge_step);
  os.template finish<MERGE && UF != 2>(g, H, C, chunk, rowptr, out, lse2, attn, partial,
                                       partial_ml, counters);
}

// PMF step 1: edge-parallel SDDMM, one group per (edge, head), CSR order.
template <typename S>
__global__ void __launch_bounds__(256)
gt_sddmm_kernel(const typename S::T* __restrict__ q, const typename S::T* __restrict__ k,
                const int* __restrict__ csr_row, const int* __restrict__ col,
                float* __restrict__ score, int64_t n_units, int H, int C, float scale2) {
  using T = typename S::T;
  constexpr int VEC = S::VEC, G = S::G, NV = S::NV;
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

// The SMMF launch of gt_forward_cuda and cosine_forward_cuda: the row shape of
// with_smmf_shape (host/dispatch.cuh), the EXTRAS variant when p > 0 (never for COS) or
// the call returns attention weights.
template <typename S, bool COS>
void launch_smmf(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                 const LayoutView& L, ForwardCall& fc, int H, int C, float scale2, float p,
                 int64_t seed, const float* rnorm, const float* beta, bool two_rows) {
  using T = typename S::T;
  const Work& rw = L.rw;
  const int64_t n_units = rw.items.size(0) * H;
  if (n_units == 0) return;
  auto launch = [&](auto kern, int lanes) {
    kern<<<ceil_div(n_units * lanes, kNodeBlock), kNodeBlock, 0,
           at::cuda::getCurrentCUDAStream()>>>(
        cptr<T>(q), cptr<T>(k), cptr<T>(v), L.rowptr.data_ptr<int>(), L.col.data_ptr<int>(),
        rw.items.data_ptr<int>(), (int)L.chunk, mptr<T>(fc.out), fc.lse2.data_ptr<float>(),
        fc.attn_ptr(), fc.partial(), fc.partial_ml(), n_units, H,
        C, scale2, p, (uint64_t)seed, rnorm, beta, fc.counters);
    check_launch();
  };
  with_smmf_shape<S>(two_rows, [&](auto shape2, auto uf) {
    using S2 = decltype(shape2);
    constexpr int UF = decltype(uf)::value;
    with_merge_variant<T>(fc.counters != nullptr, [&](auto merge) {
      constexpr bool M = decltype(merge)::value;
      const bool extras = p > 0.f || fc.need_attn;
      launch(extras ? gt_fwd_smmf_kernel<S2, true, UF, COS, M>
                    : gt_fwd_smmf_kernel<S2, false, UF, COS, M>, S2::G);
    });
  });
}

}  // namespace

std::tuple<at::Tensor, at::Tensor, at::Tensor> gt_forward_cuda(
    const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const LayoutView& L,
    double scale, double dropout, int64_t seed, bool need_attn, const KernelPlan& plan) {
  const int64_t H = q.size(1), C = q.size(2), E = L.col.size(0);
  ForwardCall fc(q, q.size(0), L, plan.pmf, need_attn);
  const float scale2 = (float)(scale * kLog2e);
  const float p = (float)dropout;
  const bool aligned = is_aligned16(q) && is_aligned16(k) && is_aligned16(v) && is_aligned16(fc.out);
  auto stream = at::cuda::getCurrentCUDAStream();
  constexpr int kThreads = 256;  // edge-parallel PMF kernels
  // The plan's tensor-core forward (bindings.cpp checks the call allows it); rows
  // that are not 16-byte aligned run the CUDA-core kernel, which has scalar loads.
  // The plan's dense tiles run where it passed a tile plan and a bound (none
  // launch for a graph without edges), else the sparse tensor-core units.
  if (plan.mma && gt_forward_mma_supports(q.scalar_type(), C, aligned)) {
    if (!gt_forward_dense(q, k, v, L, plan.dense_cells, fc.out, fc.lse2, scale))
      gt_forward_mma(q, k, v, L, fc.out, fc.lse2, scale);
    return {fc.out, fc.lse2, fc.attn};
  }
  dispatch_rows(q.scalar_type(), C, aligned, "dfgnn::gt_fwd", [&](auto shape) {
    using S = decltype(shape);
    using T = typename S::T;
    constexpr int G = S::G;
    if (plan.pmf) {
      const int64_t n_edge_units = E * H;
      if (n_edge_units == 0) return;
      gt_sddmm_kernel<S><<<ceil_div(n_edge_units * G, kThreads), kThreads, 0, stream>>>(
          cptr<T>(q), cptr<T>(k), L.csr_row.data_ptr<int>(), L.col.data_ptr<int>(),
          fc.score(), n_edge_units, H, C, scale2);
      check_launch();
      return;
    }
    launch_smmf<S, false>(q, k, v, L, fc, (int)H, (int)C, scale2, p, seed, nullptr, nullptr,
                          plan.two_rows);
  });
  fc.finish(v, L, dropout, seed);
  return {fc.out, fc.lse2, fc.attn};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> cosine_forward_cuda(
    const at::Tensor& x, const at::Tensor& beta, double eps, const LayoutView& L,
    bool need_attn, bool two_rows) {
  const int64_t N = x.size(0), H = x.size(1), C = x.size(2);
  auto rnorm = l2norm_rnorm_cuda(x, eps);
  ForwardCall fc(x, N, L, false, need_attn);
  const bool aligned = is_aligned16(x) && is_aligned16(fc.out);
  dispatch_rows(x.scalar_type(), C, aligned, "dfgnn::cos_fwd", [&](auto shape) {
    using S = decltype(shape);
    using T = typename S::T;
    if constexpr (std::is_same_v<T, float>)  // bindings.cpp admits fp32 only
      launch_smmf<S, true>(x, x, x, L, fc, (int)H, (int)C, 0.f, 0.f, 0, rnorm.data_ptr<float>(),
                           beta.data_ptr<float>(), two_rows);
  });
  fc.finish(x, L, 0.0, 0);
  return {fc.out, fc.lse2, fc.attn, rnorm};
}

}  // namespace dfgnn
