// The node-parallel work item a lane group owns: one (row, head) pair and at most
// `chunk` of the row's edges (pyg_dfgnn/work_items.py).
#pragma once

#include <cstdint>
#include "device/lane_group.cuh"

namespace dfgnn {

// Units are item * H + head, so the groups of one warp take the heads of the
// same row.
struct GroupItem {
  int64_t unit;            // item * H + head
  int gl;                  // lane within the group
  unsigned mask;           // the group's shuffle mask
  int64_t row;             // destination (CSR walk) or source (CSC walk) node
  int h;                   // head
  int slot;                // partial slot of a split row, or -1
  int beg, end;            // the item's edges
  int row_beg, row_end;    // the whole row's edges
};

// `block`: the block's index in its kernel's share of the grid (blockIdx.x unless
// two kernels share one launch, as the small-graph GT backward does).
template <int G>
__device__ __forceinline__ bool group_item(const int* __restrict__ items,
                                           const int* __restrict__ ptr, int chunk,
                                           int64_t n_units, int H, GroupItem& g,
                                           unsigned block) {
  const int64_t unit = ((int64_t)block * blockDim.x + threadIdx.x) / G;
  if (unit >= n_units) return false;
  g.unit = unit;
  g.gl = threadIdx.x & (G - 1);
  g.mask = group_mask<G>();
  const int64_t item = unit / H;
  g.h = (int)(unit - item * H);
  g.row = items[item * 3];
  g.beg = items[item * 3 + 1];
  g.slot = items[item * 3 + 2];
  g.row_beg = ptr[g.row];
  g.row_end = ptr[g.row + 1];
  g.end = min(g.beg + chunk, g.row_end);
  return true;
}

template <int G>
__device__ __forceinline__ bool group_item(const int* __restrict__ items,
                                           const int* __restrict__ ptr, int chunk,
                                           int64_t n_units, int H, GroupItem& g) {
  return group_item<G>(items, ptr, chunk, n_units, H, g, blockIdx.x);
}

}  // namespace dfgnn
