// The layout and plan arguments of the fused ops' schemas (glue/bindings.cpp)
// as C++ types: `Tensor?[] csr`, `Tensor[]? csc`, `int[] sizes`, `int[] plan`.
#pragma once
#include <ATen/ATen.h>
#include <ATen/core/List.h>

#include <optional>

namespace dfgnn {

// [rowptr, col, row_items, row_combine, csr_row or None, tiles or None]
using CsrList = c10::List<std::optional<at::Tensor>>;
// [colptr, row, perm, col_items, col_combine], or None
using OptTensorList = std::optional<at::TensorList>;

constexpr size_t kCsrEntries = 6;
constexpr size_t kCscEntries = 5;
constexpr size_t kLayoutSizes = 3;  // row_slots, col_slots, chunk

// The entries of `plan` (pyg_dfgnn/ops/plan.py, Plan).
enum PlanEntry : size_t {
  kPlanPmf,
  kPlanTwoRows,
  kPlanMma,
  kPlanBwdOneLaunch,
  kPlanMmaBwd,
  kPlanEntries
};

// A flag of `plan`, false where the list is too short (a call that never passed
// the op's checks, such as one traced on meta tensors).
inline bool plan_flag(at::IntArrayRef plan, PlanEntry e) { return plan.size() > e && plan[e] != 0; }

}  // namespace dfgnn
