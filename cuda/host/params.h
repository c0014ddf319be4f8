// What the host code of the kernel families takes of a graph layout.
#pragma once
#include <ATen/ATen.h>

namespace dfgnn {

// Node-parallel work items over a CSR / CSC pointer (pyg_dfgnn.work_items.split_work):
// items [I, 3] = (row, first edge, partial slot or -1), at most `chunk` edges each;
// combine [R, 3] = (row, first slot, n slots) for the R rows split over several items.
struct Work {
  at::Tensor items;
  at::Tensor combine;
  int64_t num_slots;
};

}  // namespace dfgnn
