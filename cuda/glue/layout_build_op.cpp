// dfgnn::layout_build: the GPU GraphLayout build (layout_build.cu), with the input
// checks it runs before a kernel sees the data. Called eagerly only, from
// pyg_dfgnn/layout_build.py: the layout cache builds layouts outside compiled
// regions (torch.compiler.disable), and the outputs' sizes depend on the data, so
// the op has no fake implementation.
#include <torch/library.h>

#include <string>

#include "kernels/layout_build.h"

namespace dfgnn {
namespace {

std::vector<at::Tensor> layout_build(const at::Tensor& edge_index, int64_t num_src,
                                     int64_t num_dst, bool self_loops, bool with_csc,
                                     int64_t chunk, bool long_first) {
  TORCH_CHECK(edge_index.is_cuda(), "dfgnn::layout_build: edge_index must be a CUDA tensor, "
              "got device ", edge_index.device());
  TORCH_CHECK(edge_index.dim() == 2 && edge_index.size(0) == 2,
              "dfgnn::layout_build: edge_index must be [2, E], got ", std::to_string(edge_index.dim()),
              " dimensions of which the first has ",
              std::to_string(edge_index.dim() ? edge_index.size(0) : 0), " entries");
  TORCH_CHECK(edge_index.scalar_type() == at::kInt || edge_index.scalar_type() == at::kLong,
              "dfgnn::layout_build: edge_index must be int32 or int64, got ",
              edge_index.scalar_type());
  TORCH_CHECK(edge_index.size(1) <= 1 || edge_index.stride(1) == 1,
              "dfgnn::layout_build: the rows of edge_index must be contiguous (stride 1)");
  TORCH_CHECK(num_src >= 1 && num_dst >= 1 && num_src <= INT32_MAX && num_dst <= INT32_MAX,
              "dfgnn::layout_build: num_src and num_dst must be in [1, 2^31 - 1], got ",
              std::to_string(num_src), " and ", std::to_string(num_dst));
  const int64_t loops = self_loops ? std::min(num_src, num_dst) : 0;
  TORCH_CHECK(edge_index.size(1) + loops <= INT32_MAX,
              "dfgnn::layout_build: more than 2^31 - 1 edges need the int64 (torch) build");
  TORCH_CHECK(chunk >= 1 && chunk <= kLayoutBuildMaxChunk, "dfgnn::layout_build: chunk must be "
              "in [1, ", std::to_string(kLayoutBuildMaxChunk), "], got ", std::to_string(chunk));
  return layout_build_cuda(edge_index, num_src, num_dst, self_loops, with_csc, chunk,
                           long_first);
}

}  // namespace

// A fragment of the dfgnn library (defined in bindings.cpp). Outputs:
// see layout_build_cuda in layout_build.h.
TORCH_LIBRARY_FRAGMENT(dfgnn, m) {
  m.def("layout_build(Tensor edge_index, int num_src, int num_dst, bool self_loops, "
        "bool with_csc, int chunk, bool long_first) -> Tensor[]");
}

TORCH_LIBRARY_IMPL(dfgnn, CUDA, m) { m.impl("layout_build", &layout_build); }

}  // namespace dfgnn
