// Split rows on the host side: the arrival counters of the in-kernel merge and
// the separate merge launches for the calls whose kernels do not merge.
#pragma once
#include "host/tensor.h"
#include "host/params.h"

namespace dfgnn {

// Arrival counters for split rows merged by their last item (arrive_last,
// device/split_merge.cuh): int32 zeros, at least n of them (n > 0), for the
// current device and stream, zero again after every kernel that uses them.
// Raises (naming `op` and `field`, the plan's merge field) while the stream is
// captured into a CUDA graph: a graph can be replayed on any stream, also while
// kernels of the stream it was captured on use that stream's buffer, and a
// buffer allocated in the capture would only be zeroed at replay.
int* split_row_counters(int64_t n, const char* op, const char* field);

// The counters of an SMMF forward over L's CSR work items (H heads): nullptr
// where nothing merges in the kernel (no split rows, or the plan's
// merge_in_kernel is false: ForwardCall::finish launches the merge); raises
// where the plan asks for the in-kernel merge and the call cannot have it (PMF,
// CUDA-graph capture).
int* forward_split_counters(const char* op, const KernelPlan& plan, const LayoutView& L,
                            int64_t heads);

// Sums the fp32 partial rows of split rows into `out` (dtype of out):
// combine[r] = (row, first_slot, n_slots); out[row] = sum of partial[first_slot ...]
// (partial: [num_slots, out.size(1) * ...] floats); out32, if set: the sums in
// fp32 too, rows packed (PMF's O32, forward_call.h).
void combine_partials(const float* partial, int64_t num_slots, const at::Tensor& combine,
                      at::Tensor& out, float* out32 = nullptr);

// Split rows of an online-softmax kernel: merges each item's (max, sum,
// unnormalised acc) partial ([num_slots, H, C] and [num_slots, H, 2] floats) into
// out [N, H, C] (and out32 [N, H, C] float32, if set) and lse2 [N, H].
void merge_softmax_partials(const float* partial, const float* partial_ml, int64_t num_slots,
                            const at::Tensor& combine, at::Tensor& out, float* out32,
                            at::Tensor& lse2);

// Attention weights of split rows: raw base-2 scores -> softmax once lse2 is final.
void normalize_split_attn(const at::Tensor& combine, const at::Tensor& rowptr,
                          const at::Tensor& lse2, at::Tensor& attn);

// The counters of a backward call's CSR (`csr`) and CSC (`csc`) walks
// (split_merge.cu), per the plan's bwd_merge_in_kernel: nullptr where the walks
// do not merge in the kernel (the caller launches combine_partials). Walks in two
// launches merge their split rows one after the other and share one buffer;
// walks in one launch (`concurrent`) merge at the same time and get disjoint
// regions of it. Only the fp32 backward kernels carry the merge
// (kMergeInBackward, host/dispatch.cuh): bwd_merge_in_kernel with split rows
// raises for other dtypes, and under CUDA-graph capture.
struct BackwardCounters {
  int* csr;
  int* csc;
};
BackwardCounters backward_split_counters(const char* op, const KernelPlan& plan,
                                         at::ScalarType st, const Work& rw, const Work& cw,
                                         int64_t heads, bool concurrent = false);

}  // namespace dfgnn
