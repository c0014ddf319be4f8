// The dfgnn operator library (TORCH_LIBRARY(dfgnn)) and its small ops. The
// attention ops and the plan class are in attention.cpp, the layout build in
// layout_build_op.cpp and the GT projections in projections.cpp (fragments of
// this library); the fakes are registered from Python (pyg_dfgnn/ops/_fakes.py).
#include <c10/cuda/CUDAGuard.h>
#include <torch/library.h>

#include "host/ops.h"

namespace dfgnn {
namespace {

at::Tensor csr_rowptr(const at::Tensor& index, int64_t num_rows) {
  TORCH_CHECK(index.is_cuda(), "dfgnn::csr_rowptr: index must be a CUDA tensor");
  TORCH_CHECK(index.dim() == 1 && index.is_contiguous(),
              "dfgnn::csr_rowptr: index must be a contiguous 1-D tensor");
  TORCH_CHECK(index.scalar_type() == at::kInt || index.scalar_type() == at::kLong,
              "dfgnn::csr_rowptr: index must be int32 or int64, got ", index.scalar_type());
  TORCH_CHECK(num_rows >= 0 && num_rows < INT32_MAX && index.numel() < INT32_MAX,
              "dfgnn::csr_rowptr: sizes must fit int32");
  const c10::cuda::CUDAGuard guard(index.device());  // the inputs' device and its stream
  return csr_rowptr_cuda(index, num_rows);
}

}  // namespace

TORCH_LIBRARY(dfgnn, m) { m.def("csr_rowptr(Tensor index, int num_rows) -> Tensor"); }

TORCH_LIBRARY_IMPL(dfgnn, CUDA, m) { m.impl("csr_rowptr", &csr_rowptr); }

}  // namespace dfgnn

// The Python module pyg_dfgnn._C itself: python_entry.cpp.
