// The kernel traits of the node-parallel kernels: the compile-time shape of one
// (node, head) row, which dispatch_rows (host/dispatch.cuh) picks for the head
// size C. A kernel takes it as its first template argument, so one name carries
// the storage type and the row's split over lanes from the dispatch to the
// device building blocks.
#pragma once

namespace dfgnn {

template <typename T_, int VEC_, int G_, int NV_>
struct RowShape {
  using T = T_;                     // storage type: float, __half or __nv_bfloat16
  static constexpr int VEC = VEC_;  // elements per access: 16 bytes, or 1 (any C)
  static constexpr int G = G_;      // lanes per row (a power of two <= 32)
  static constexpr int NV = NV_;    // accesses per lane
};

}  // namespace dfgnn
