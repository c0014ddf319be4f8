// The CSR row pointer of destination indices sorted by row (dfgnn::csr_rowptr),
// for a GraphLayout built on the GPU.
#include "host/dispatch.cuh"
#include "host/ops.h"

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

}  // namespace

at::Tensor csr_rowptr_cuda(const at::Tensor& index, int64_t num_rows) {
  auto rowptr = at::empty({num_rows + 1}, index.options().dtype(at::kInt));
  const int64_t n = index.numel();
  auto stream = c10::cuda::getCurrentCUDAStream();
  AT_DISPATCH_INDEX_TYPES(index.scalar_type(), "csr_rowptr", [&] {
    csr_rowptr_kernel<index_t><<<ceil_div(num_rows + 1, 256), 256, 0, stream>>>(
        index.data_ptr<index_t>(), n, num_rows, rowptr.data_ptr<int>());
  });
  check_launch();
  return rowptr;
}

}  // namespace dfgnn
