// The plan of one kind of fused call as one named value: the layout view its
// kernels read, the kernel plan's decisions and the score function. Built and
// checked once per (layout, plan key) by pyg_dfgnn/ops/plan.py as
// torch.classes.dfgnn.Plan and passed to the attention ops as one argument, so a
// call converts, checks and keeps one object instead of the layout's tensors.
#pragma once
#include <ATen/core/Dict.h>
#include <torch/custom_class.h>

#include <string>

#include "host/params.h"
#include "host/score_ops.h"

namespace dfgnn {

struct CallPlan : torch::CustomClassHolder {
  const ScoreOps* score = nullptr;
  std::string score_name;
  LayoutView L;
  KernelPlan p;
  int64_t n_dst = 0, n_src = 0, num_edges = 0;
  bool has_csc = false;

  // `tensors`: rowptr, col, row_items, row_combine, and where the plan needs
  // them csr_row (PMF), tiles (dense tiles), the CSC (colptr, row, perm,
  // col_items, col_combine; all or none), and with the CSC where dense_backward
  // is set tiles_t (the transposed graph's tile plan) and, where the weights
  // are saved and the CSR rows are not sorted by source, rank_pos. `ints`:
  // n_src, chunk, row_slots, col_slots and the plan's flags (pmf, vector_rows,
  // two_rows, mma, merge_in_kernel, bwd_one_launch, mma_backward,
  // bwd_merge_in_kernel, normalize_first: 0 or 1; dense_backward: 0 or 1, 0
  // where absent; save_weights: 0 or 1, 1 where absent; row_walk: 0 or 1, 0
  // where absent).
  // `floats`: dense_cells. Entries are matched by name; an unknown, missing or
  // malformed one raises, as does a plan the layout cannot run.
  CallPlan(const std::string& score, const c10::Dict<std::string, at::Tensor>& tensors,
           const c10::Dict<std::string, int64_t>& ints,
           const c10::Dict<std::string, double>& floats);
};

using PlanPtr = c10::intrusive_ptr<CallPlan>;

}  // namespace dfgnn
