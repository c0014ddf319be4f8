// Forward pass of additive attention (GAT / GATConv, paper §5.1 "add-SDDMM"):
//   e_ij = LeakyReLU(a_dst_i + a_src_j),  out_i = sum_{j -> i} softmax_j(e_ij) x_j
// with a_dst = a_dst^T W x_i and a_src = a_src^T W x_j computed densely ([N, H]).
//
// SMMF (paper Fig. 12: the per-edge score is one add, so there is nothing to
// balance): one lane group per (dst, head) work item, the score is a scalar
// gather, the softmax is online and the row of x_j is the only vector load per
// edge. Split rows are merged like the GT kernel's.
// PMF: an edge-parallel kernel writes the scores [E, H], then softmax_spmm.
// Measured on the H100 it is as fast or faster than SMMF when a head row takes
// a whole warp, so "auto" picks it there (pyg_dfgnn/ops/schedule.py).
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
  // The GT kernel's edges in flight, although GAT loads one row per edge, not
  // two: twice as many measured 10-20 % slower (registers; benchmarks/NOTES.md).
  constexpr int U = edges_in_flight<VEC, NV>();
  using P = typename Packed<T, VEC>::type;
  GroupItem g;
  if (!group_item<G>(items, rowptr, chunk, n_units, H, g)) return;
  const int gl = g.gl, h = g.h, beg = g.beg, end = g.end;
  const int nvec = C / VEC;
  const int64_t HC = (int64_t)H * C;
  const float ad = to_float(a_dst[g.row * H + h]);

  OnlineSoftmax<T, VEC, G, NV, U, DROPOUT> os;
  NbrPipe<U, false> nb(col, beg, end);  // look-ahead measured 5-7 % slower here (NOTES v5)
  for (int e0 = beg; e0 < end; e0 += U) {
    int j[U];
    P xf[U][NV];
    float s[U];
    load_edge_row<T, VEC, G, NV, U>(nb, e0, x, HC, (int64_t)h * C, gl, nvec, j, xf, s,
                                    [&](int, int jj) {
      return leaky_relu(ad + to_float(__ldg(a_src + (int64_t)jj * H + h)), slope) * kLog2e;
    });
    os.step(j, s, xf, e0, H, h, p, seed, attn, gl);
  }
  os.finish(g, H, C, out, lse2, attn, partial, partial_ml);
}

// PMF step 1: one thread per (edge, head), CSR order, base-2 scores.
template <typename T>
__global__ void __launch_bounds__(256)
gat_score_kernel(const T* __restrict__ a_dst, const T* __restrict__ a_src,
                 const int* __restrict__ csr_row, const int* __restrict__ col,
                 float* __restrict__ score, int64_t n_units, int H, float slope) {
  const int64_t unit = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (unit >= n_units) return;
  const int64_t e = unit / H;
  const int h = (int)(unit - e * H);
  const float a = to_float(__ldg(a_dst + (int64_t)__ldg(csr_row + e) * H + h)) +
                  to_float(__ldg(a_src + (int64_t)__ldg(col + e) * H + h));
  score[unit] = leaky_relu(a, slope) * kLog2e;
}

}  // namespace

std::tuple<at::Tensor, at::Tensor, at::Tensor> gat_forward_cuda(
    const at::Tensor& a_dst, const at::Tensor& a_src, const at::Tensor& x, const at::Tensor& rowptr,
    const at::Tensor& col, const Work& rw, const c10::optional<at::Tensor>& csr_row,
    int64_t chunk, double negative_slope, double dropout, int64_t seed, bool pmf,
    bool need_attn) {
  const int64_t H = x.size(1), C = x.size(2), E = col.size(0);
  ForwardCall fc(x, a_dst.size(0), E, rw, pmf, need_attn);
  const float p = (float)dropout, slope = (float)negative_slope;
  const bool aligned = is_aligned16(x) && is_aligned16(fc.out);
  const int64_t n_units = rw.items.size(0) * H;
  constexpr int kThreads = 256;
  auto stream = at::cuda::getCurrentCUDAStream();
  bool ok = false;
  DFGNN_DISPATCH_FLOAT_TYPES(x.scalar_type(), "gat_forward", [&] {
    using T = typename cuda_type<scalar_t>::type;
    auto P = [](const at::Tensor& t) { return reinterpret_cast<const T*>(t.data_ptr<scalar_t>()); };
    if (pmf) {
      ok = true;  // the shape check is softmax_spmm's
      if (E * H == 0) return;
      gat_score_kernel<T><<<ceil_div(E * H, kThreads), kThreads, 0, stream>>>(
          P(a_dst), P(a_src), csr_row->data_ptr<int>(), col.data_ptr<int>(),
          fc.score.data_ptr<float>(), E * H, H, slope);
      check_launch();
      return;
    }
    ok = dispatch_row_shape<T>(C, aligned, [&](auto VEC_, auto G_, auto NV_) {
      constexpr int VEC = decltype(VEC_)::value, G = decltype(G_)::value, NV = decltype(NV_)::value;
      if (n_units == 0) return;
      auto kern = p > 0.f ? gat_fwd_kernel<T, VEC, G, NV, true> : gat_fwd_kernel<T, VEC, G, NV, false>;
      kern<<<ceil_div(n_units * G, kThreads), kThreads, 0, stream>>>(
          P(a_dst), P(a_src), P(x), rowptr.data_ptr<int>(), col.data_ptr<int>(),
          rw.items.data_ptr<int>(), (int)chunk, reinterpret_cast<T*>(fc.out.data_ptr<scalar_t>()),
          fc.lse2.data_ptr<float>(), fc.attn_ptr(), fc.partial.data_ptr<float>(),
          fc.partial_ml.data_ptr<float>(), n_units, H, C, slope, p, (uint64_t)seed);
      check_launch();
    });
  });
  TORCH_CHECK(ok, "dfgnn::gat_fwd: head size C=", std::to_string(C),
              " is not supported by the fused kernels");
  fc.finish(x, rowptr, col, rw, chunk, dropout, seed);
  return {fc.out, fc.lse2, fc.attn};
}

}  // namespace dfgnn
