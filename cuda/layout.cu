// Sparse-format helpers used when a GraphLayout is built on the GPU, and the
// combine step of split (work-item) rows shared by the PMF kernels.
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

}  // namespace dfgnn
