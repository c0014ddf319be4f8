// Row L2 normalisation of AGNN's cosine score (paper §5.1), forward and backward
// in one pass each:
//   k = x / max(||x||, eps),  q = beta * k            (per node and head)
// The dense equivalent (F.normalize, then q = k * beta) is about five elementwise
// passes over x plus their autograd nodes, which cost AGNN as much as the fused
// attention itself on the large batches (COCO-SP forward 1.17 -> 0.88 ms fused).
//
// rnorm [N, H] keeps 1 / max(||x||, eps) with the sign as a flag: negative when the
// norm was clamped to eps, where the backward is the plain 1 / eps scaling.
#include "device/fragments.cuh"
#include "device/lane_group.cuh"
#include "host/dispatch.cuh"
#include "scores/cosine.cuh"

namespace dfgnn {
namespace {

// KQ: also write k and q (false: the norms alone, l2norm_rnorm_cuda; a variant of
// its own, so that the profiler and the plan tell the two launches apart).
template <typename S, bool KQ>
__global__ void __launch_bounds__(256)
l2norm_fwd_kernel(const typename S::T* __restrict__ x, const float* __restrict__ beta,
                  typename S::T* __restrict__ k, typename S::T* __restrict__ q,
                  float* __restrict__ rnorm, int64_t n_units, int C, float eps) {
  using T = typename S::T;
  constexpr int VEC = S::VEC, G = S::G, NV = S::NV;
  const int64_t unit = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) / G;  // (node, head)
  if (unit >= n_units) return;
  const int gl = threadIdx.x & (G - 1);
  const int nvec = C / VEC;
  const int64_t off = unit * C;
  float xf[NV][VEC];
  load_row<T, VEC, G, NV>(x + off, gl, nvec, xf);
  const float n = sqrtf(group_sum<G>(dot_frag(xf, xf), group_mask<G>()));
  const bool clamped = !(n > eps);
  const float r = 1.f / (clamped ? eps : n);
  if constexpr (KQ) {
    store_row<T, VEC, G, NV>(k + off, gl, nvec, xf, r);
    store_row<T, VEC, G, NV>(q + off, gl, nvec, xf, r * __ldg(beta));
  }
  if (gl == 0) rnorm[unit] = clamped ? -r : r;
}

// dk_hat = dk + beta dq;  dx = r (dk_hat - k (k . dk_hat)), or r dk_hat if clamped;
// dbeta_part[unit] = dq . k (summed over units by the caller, fixed order).
template <typename S>
__global__ void __launch_bounds__(256)
l2norm_bwd_kernel(const typename S::T* __restrict__ dk, const typename S::T* __restrict__ dq,
                  const typename S::T* __restrict__ k, const float* __restrict__ rnorm,
                  const float* __restrict__ beta, typename S::T* __restrict__ dx,
                  float* __restrict__ dbeta_part, int64_t n_units, int C) {
  using T = typename S::T;
  constexpr int VEC = S::VEC, G = S::G, NV = S::NV;
  const int64_t unit = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) / G;
  if (unit >= n_units) return;
  const int gl = threadIdx.x & (G - 1);
  const unsigned mask = group_mask<G>();
  const int nvec = C / VEC;
  const int64_t off = unit * C;
  const float b = __ldg(beta);
  float kf[NV][VEC], g[NV][VEC], gq[NV][VEC];
  load_row<T, VEC, G, NV>(k + off, gl, nvec, kf);
  load_row<T, VEC, G, NV>(dk + off, gl, nvec, g);
  load_row<T, VEC, G, NV>(dq + off, gl, nvec, gq);
  float sums[2] = {dot_frag(gq, kf), 0.f};  // dq . k, then k . dk_hat
  axpy_frag(b, gq, g);                       // g = dk_hat
  sums[1] = dot_frag(kf, g);
  group_sum_many<G, 2>(sums, mask);
  const float rs = rnorm[unit];
  const float r = fabsf(rs);
  const float proj = rs > 0.f ? sums[1] : 0.f;
  axpy_frag(-proj, kf, g);
  store_row<T, VEC, G, NV>(dx + off, gl, nvec, g, r);
  if (gl == 0) dbeta_part[unit] = sums[0];
}

}  // namespace

namespace {

// rnorm [N, H], and k and q when `with_kq` (l2norm_rnorm_cuda needs the norms
// alone: then the kernel writes nothing else and k, q are undefined).
std::tuple<at::Tensor, at::Tensor, at::Tensor> l2norm_launch(
    const at::Tensor& x, const float* beta, double eps, bool with_kq, bool vector_rows,
    const char* op) {
  const int64_t N = x.size(0), H = x.size(1), C = x.size(2), n_units = N * H;
  at::Tensor k, q;
  if (with_kq) {
    k = at::empty_like(x);
    q = at::empty_like(x);
  }
  auto rnorm = at::empty({N, H}, x.options().dtype(at::kFloat));
  check_vector_rows(op, vector_rows, {{"x", &x}});
  auto stream = c10::cuda::getCurrentCUDAStream();
  constexpr int kThreads = 256;
  dispatch_rows(x.scalar_type(), C, vector_rows, op, [&](auto shape) {
    using S = decltype(shape);
    using T = typename S::T;
    constexpr int G = S::G;
    if (n_units == 0) return;
    auto kern = with_kq ? l2norm_fwd_kernel<S, true> : l2norm_fwd_kernel<S, false>;
    kern<<<ceil_div(n_units * G, kThreads), kThreads, 0, stream>>>(
        cptr<T>(x), beta, with_kq ? mptr<T>(k) : nullptr, with_kq ? mptr<T>(q) : nullptr,
        rnorm.data_ptr<float>(), n_units, C, (float)eps);
    check_launch();
  });
  return {k, q, rnorm};
}

}  // namespace

std::tuple<at::Tensor, at::Tensor, at::Tensor> l2norm_forward_cuda(const char* op,
                                                                   const at::Tensor& x,
                                                                   const at::Tensor& beta,
                                                                   double eps, bool vector_rows) {
  return l2norm_launch(x, beta.data_ptr<float>(), eps, true, vector_rows, op);
}

at::Tensor l2norm_rnorm_cuda(const at::Tensor& x, double eps, bool vector_rows) {
  return std::get<2>(
      l2norm_launch(x, nullptr, eps, false, vector_rows, "dfgnn::attention_fwd (cosine)"));
}

std::tuple<at::Tensor, at::Tensor> l2norm_backward_cuda(const at::Tensor& dk, const at::Tensor& dq,
                                                        const at::Tensor& k,
                                                        const at::Tensor& rnorm,
                                                        const at::Tensor& beta,
                                                        bool vector_rows) {
  constexpr const char* kBwd = "dfgnn::attention_bwd (cosine)";  // its only caller
  const int64_t N = k.size(0), H = k.size(1), C = k.size(2), n_units = N * H;
  auto dx = at::empty_like(k);
  auto dbeta_part = at::empty({N, H}, k.options().dtype(at::kFloat));
  check_vector_rows(kBwd, vector_rows,
                    {{"k", &k}, {"dk", &dk}, {"dq", &dq}});
  auto stream = c10::cuda::getCurrentCUDAStream();
  constexpr int kThreads = 256;
  dispatch_rows(k.scalar_type(), C, vector_rows, kBwd, [&](auto shape) {
    using S = decltype(shape);
    using T = typename S::T;
    constexpr int G = S::G;
    if (n_units == 0) return;
    l2norm_bwd_kernel<S><<<ceil_div(n_units * G, kThreads), kThreads, 0, stream>>>(
        cptr<T>(dk), cptr<T>(dq), cptr<T>(k), rnorm.data_ptr<float>(), beta.data_ptr<float>(),
        mptr<T>(dx), dbeta_part.data_ptr<float>(), n_units, C);
    check_launch();
  });
  return {dx, dbeta_part};
}

}  // namespace dfgnn
