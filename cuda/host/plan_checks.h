// What the kernels support (pyg_dfgnn/ops/plan.py mirrors these tables and
// makes every kernel choice; params.h, KernelPlan, holds them) and the checks
// that a call can run what its plan says: host code raises
// (TORCH_CHECK, naming the op and the plan's field) instead of running another
// kernel.
#pragma once
#include "host/tensor.h"

#include <cstdint>
#include <initializer_list>
#include <utility>

#include "host/params.h"

namespace dfgnn {

inline bool is_aligned16(const at::Tensor& t) {
  return reinterpret_cast<uintptr_t>(t.data_ptr()) % 16 == 0;
}

// A tensor of rows [N, ...] whose every row starts on a 16-byte boundary (given
// outputs may be column slices of a joined gradient, rows ld elements apart).
inline bool rows_aligned16(const at::Tensor& t) {
  return is_aligned16(t) && (t.dim() == 0 || t.size(0) <= 1 ||
                             t.stride(0) * (int64_t)t.element_size() % 16 == 0);
}

// Support tables, for dtype st (float32 / float16 / bfloat16) and head size C.
// Whether the SMMF forward has a two-rows-per-warp shape: float32 vector rows
// with C in [20, 128], a multiple of 4 (dispatch.cuh, kHasTwoRowsShape).
bool smmf_two_rows_supported(at::ScalarType st, int64_t C, bool vector_rows);
// Whether the CUDA-core backward kernels of dtype st carry the in-kernel
// split-row merge (float32 only, kMergeInBackward).
bool backward_merge_in_kernel_supported(at::ScalarType st);

// Whether the current CUDA stream is being captured into a CUDA graph (the
// in-kernel merges cannot run there: split_row_counters, split_merge.h).
bool stream_is_capturing();

// With the plan's vector_rows, every named tensor's rows must be 16-byte aligned.
void check_vector_rows(const char* op, bool vector_rows,
                       std::initializer_list<std::pair<const char*, const at::Tensor*>> rows);

// The plan's fields a walk over L's CSR (and its two-rows variant) needs:
// two_rows only with a two-rows shape and without split rows.
void check_two_rows(const char* op, const KernelPlan& plan, const LayoutView& L,
                    at::ScalarType st, int64_t C);

}  // namespace dfgnn
