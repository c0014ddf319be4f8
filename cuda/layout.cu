// Sparse-format helpers used when a GraphLayout is built on the GPU, and the
// combine steps of split (work-item) rows shared by every kernel family.
#include "common.cuh"
#include "ops.h"

namespace dfgnn {
namespace {

// rowptr[r] = lower_bound(index, r): one thread per row, binary search over the
// sorted destination indices (no atomics, no histogram pass).
template <typename I>
__global__ void csr_rowptr_kernel(const I* __restrict__ index, int64_t n, int64_t num_rows,
                                  int* __restrict__ rowptr) {
  const int64_t r = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (r > num_rows) return;
  int64_t lo = 0, hi = n;
  while (lo < hi) {
    const int64_t mid = (lo + hi) >> 1;
    if ((int64_t)index[mid] < r) lo = mid + 1; else hi = mid;
  }
  rowptr[r] = (int)lo;
}

template <typename T>
__global__ void combine_kernel(const float* __restrict__ partial, const int* __restrict__ combine,
                               T* __restrict__ out, int64_t n_rows, int64_t HC) {
  const int64_t idx = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (idx >= n_rows * HC) return;
  const int64_t r = idx / HC, f = idx - r * HC;
  const int row = combine[r * 3], first = combine[r * 3 + 1], n = combine[r * 3 + 2];
  float s = 0.f;
  for (int t = 0; t < n; ++t) s += partial[(int64_t)(first + t) * HC + f];
  out[(int64_t)row * HC + f] = from_float<T>(s);
}

// Merges the partial (max, sum, unnormalised acc) of a split row's items:
// M = max m_s, L = sum l_s 2^(m_s - M), out = sum acc_s 2^(m_s - M) / L.
// One thread per output element; the slots are read in a fixed order.
template <typename T>
__global__ void merge_softmax_kernel(const float* __restrict__ partial,
                                    const float* __restrict__ partial_ml,
                                    const int* __restrict__ combine, T* __restrict__ out,
                                    float* __restrict__ lse2, int64_t n_rows, int H, int C) {
  const int64_t HC = (int64_t)H * C;
  const int64_t idx = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (idx >= n_rows * HC) return;
  const int64_t r = idx / HC, f = idx - r * HC;
  const int h = (int)(f / C);
  const int row = combine[r * 3], first = combine[r * 3 + 1], n = combine[r * 3 + 2];
  float M = kNegInf;
  for (int t = 0; t < n; ++t) M = fmaxf(M, partial_ml[((int64_t)(first + t) * H + h) * 2]);
  float L = 0.f, acc = 0.f;
  for (int t = 0; t < n; ++t) {
    const int64_t s = first + t;
    const float w = exp2f(partial_ml[(s * H + h) * 2] - M);  // empty item: m = -inf -> 0
    L += partial_ml[(s * H + h) * 2 + 1] * w;
    acc += partial[s * HC + f] * w;
  }
  out[(int64_t)row * HC + f] = from_float<T>(L > 0.f ? acc / L : 0.f);
  if (f == (int64_t)h * C) lse2[(int64_t)row * H + h] = L > 0.f ? M + log2f(L) : kNegInf;
}

// Attention weights of split rows: raw base-2 scores -> softmax, once lse2 is final.
__global__ void normalize_attn_kernel(const int* __restrict__ combine,
                                      const int* __restrict__ rowptr,
                                      const float* __restrict__ lse2, float* __restrict__ attn,
                                      int64_t n_rows, int H) {
  const int64_t unit = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) / 32;
  if (unit >= n_rows * H) return;
  const int lane = threadIdx.x & 31;
  const int64_t r = unit / H;
  const int h = (int)(unit - r * H);
  const int row = combine[r * 3];
  const float L = lse2[(int64_t)row * H + h];
  for (int e = rowptr[row] + lane; e < rowptr[row + 1]; e += 32) {
    const int64_t a = (int64_t)e * H + h;
    attn[a] = exp2f(attn[a] - L);
  }
}

}  // namespace

at::Tensor csr_rowptr_cuda(const at::Tensor& index, int64_t num_rows) {
  auto rowptr = at::empty({num_rows + 1}, index.options().dtype(at::kInt));
  const int64_t n = index.numel();
  auto stream = at::cuda::getCurrentCUDAStream();
  AT_DISPATCH_INDEX_TYPES(index.scalar_type(), "csr_rowptr", [&] {
    csr_rowptr_kernel<index_t><<<ceil_div(num_rows + 1, 256), 256, 0, stream>>>(
        index.data_ptr<index_t>(), n, num_rows, rowptr.data_ptr<int>());
  });
  check_launch();
  return rowptr;
}

void combine_partials(const at::Tensor& partial, const at::Tensor& combine, at::Tensor& out) {
  const int64_t n_rows = combine.size(0);
  if (n_rows == 0) return;
  const int64_t HC = out.numel() / out.size(0);
  auto stream = at::cuda::getCurrentCUDAStream();
  DFGNN_DISPATCH_FLOAT_TYPES(out.scalar_type(), "combine", [&] {
    using T = typename cuda_type<scalar_t>::type;
    combine_kernel<T><<<ceil_div(n_rows * HC, 256), 256, 0, stream>>>(
        partial.data_ptr<float>(), combine.data_ptr<int>(),
        reinterpret_cast<T*>(out.data_ptr<scalar_t>()), n_rows, HC);
  });
  check_launch();
}

void merge_softmax_partials(const at::Tensor& partial, const at::Tensor& partial_ml,
                            const at::Tensor& combine, at::Tensor& out, at::Tensor& lse2) {
  const int64_t n_rows = combine.size(0);
  if (n_rows == 0) return;
  const int64_t H = out.size(1), C = out.size(2);
  auto stream = at::cuda::getCurrentCUDAStream();
  DFGNN_DISPATCH_FLOAT_TYPES(out.scalar_type(), "merge_softmax", [&] {
    using T = typename cuda_type<scalar_t>::type;
    merge_softmax_kernel<T><<<ceil_div(n_rows * H * C, 256), 256, 0, stream>>>(
        partial.data_ptr<float>(), partial_ml.data_ptr<float>(), combine.data_ptr<int>(),
        reinterpret_cast<T*>(out.data_ptr<scalar_t>()), lse2.data_ptr<float>(), n_rows, H, C);
  });
  check_launch();
}

void normalize_split_attn(const at::Tensor& combine, const at::Tensor& rowptr,
                          const at::Tensor& lse2, at::Tensor& attn) {
  const int64_t n_rows = combine.size(0), H = lse2.size(1);
  if (n_rows == 0) return;
  normalize_attn_kernel<<<ceil_div(n_rows * H * 32, 256), 256, 0, at::cuda::getCurrentCUDAStream()>>>(
      combine.data_ptr<int>(), rowptr.data_ptr<int>(), lse2.data_ptr<float>(),
      attn.data_ptr<float>(), n_rows, H);
  check_launch();
}

}  // namespace dfgnn
