// What the host code of the kernel families takes of a call: the graph layout
// (one LayoutView, built and checked once per plan object from the layout's
// tensors in glue/call_plan.cpp) and the kernel plan's decisions.
#pragma once
#include "host/tensor.h"

namespace dfgnn {

// Node-parallel work items over a CSR / CSC pointer (pyg_dfgnn.work_items.split_work):
// items [I, 3] = (row, first edge, partial slot or -1), at most `chunk` edges each;
// combine [R, 3] = (row, first slot, n slots) for the R rows split over several items.
struct Work {
  at::Tensor items;
  at::Tensor combine;
  int64_t num_slots = 0;
};

// One call's graph layout: the CSR by destination with its work items, what the
// plan adds to it (PMF's per-edge destinations, the dense-tile plan), and the CSC
// by source with its work items where the call walks it (undefined otherwise),
// and the dense-tile backward's transposed tile plan and rank map with it.
struct LayoutView {
  at::Tensor rowptr;   // [N_dst + 1]
  at::Tensor col;      // [E] source of each CSR edge
  Work rw;             // the CSR's work items
  at::Tensor csr_row;  // [E] destination of each CSR edge (PMF), or undefined
  at::Tensor tiles;    // the dense-tile plan (pyg_dfgnn/ops/tiles.py), or undefined
  at::Tensor colptr;   // [N_src + 1]
  at::Tensor row;      // [E] destination of each CSC edge
  at::Tensor perm;     // [E] CSR position of each CSC edge
  Work cw;             // the CSC's work items
  at::Tensor tiles_t;  // the transposed graph's tile plan (64-source blocks), or undefined
  at::Tensor rank_pos; // [E] CSR position of the edge of rank p (row's edges by source), or
                       // undefined where the CSR rows are sorted by source (identity)
  int64_t chunk = 0;   // edges per work item, both walks
};

// The kernel plan's decisions for one call (pyg_dfgnn/ops/plan.py, Plan). Host
// code obeys each field or raises (TORCH_CHECK) where the call cannot run it.
struct KernelPlan {
  bool pmf = false;             // edge-parallel scores, then softmax + SpMM
  bool vector_rows = true;      // 16-byte vector row accesses (else one element per access)
  bool two_rows = false;        // two rows per warp in the SMMF forward
  bool mma = false;             // the fp16 / bf16 tensor-core forward of the dot score
  double dense_cells = 0.0;     // > 0: the tile plan's blocks run dense up to this bound
  bool merge_in_kernel = true;  // split rows merged by the forward kernel (else merge launches)
  bool bwd_one_launch = false;  // the backward's CSR and CSC walks in one launch
  bool mma_backward = false;    // the dot score's backward walks on tensor cores
  bool dense_backward = false;  // ... over the dense tiles of both tile plans (needs the above)
  bool save_weights = true;     // the two-launch backward's first launch saves each edge's
                                // (P', dS) for the second (off only in the dense backward)
  bool bwd_merge_in_kernel = true;  // split rows merged by the backward kernels
  bool normalize_first = false;     // rows normalised, then the dot score's kernels (cosine)
  bool row_walk = false;            // the additive score's SMMF forward on the shared row walk
};

}  // namespace dfgnn
