// The GraphLayout build on the GPU (layout_build.cu); registered as
// dfgnn::layout_build in glue/layout_build_op.cpp.
#pragma once
#include "host/tensor.h"

#include <vector>

namespace dfgnn {

// Largest work-item chunk the build handles (the shared per-warp bucket counters
// of the longest-first ordering hold one int per possible item length).
constexpr int64_t kLayoutBuildMaxChunk = 512;

// Indices of the int64 CPU `info` tensor layout_build_cuda returns last.
enum LayoutBuildInfo : int {
  kInfoStatus = 0,     // 0: built; 1: an index is out of range (nothing else is valid)
  kInfoLoSrc,          // smallest source index (E0 > 0 only)
  kInfoLoDst,          // smallest destination index
  kInfoHiSrc,          // largest source index
  kInfoHiDst,          // largest destination index
  kInfoKept,           // input edges kept (self-loops removed when self_loops)
  kInfoUnsorted,       // 1 when the input is not grouped (sorted) by destination
  kInfoMaxInDegree,    // largest in-degree (self-loops included)
  kInfoRowSlots,       // partial slots of the CSR work items
  kInfoColSlots,       // partial slots of the CSC work items (with_csc)
  kInfoNumEdges,       // E: kept + one loop per node below min(N_src, N_dst)
  kInfoMaxOutDegree,   // largest out-degree, self-loops included (with_csc; else 0)
  kInfoSize
};

// Builds CSR, CSC and the work items of both from edge_index ([2, E0], int32 or
// int64 on the GPU, rows with unit stride). Preconditions (checked by the op
// wrapper): num_src, num_dst >= 1; E0 + loops and the node counts fit int32;
// 1 <= chunk <= kLayoutBuildMaxChunk. One host synchronisation. Returns
// {rowptr, col, csr_row, edge_perm, colptr, row, perm, row_items, row_combine,
// col_items, col_combine, info}; undefined tensors where not built (edge_perm:
// the identity; the CSC ones without with_csc; all but info when out of range).
std::vector<at::Tensor> layout_build_cuda(const at::Tensor& edge_index, int64_t num_src,
                                          int64_t num_dst, bool self_loops, bool with_csc,
                                          int64_t chunk, bool long_first);

}  // namespace dfgnn
