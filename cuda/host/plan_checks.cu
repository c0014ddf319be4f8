// The kernels' support tables and the plan checks (plan_checks.h), from the same
// row-shape dispatch the launches use, so the tables cannot drift from them.
#include "host/plan_checks.h"

#include <string>

#include "host/dispatch.cuh"

namespace dfgnn {
namespace {

// f(S) for the row shape the launches would take, false where there is none.
template <typename F>
bool with_row_shape(at::ScalarType st, int64_t C, bool vector_rows, F&& f) {
  bool ok = false;
  if (st != at::kFloat && st != at::kHalf && st != at::kBFloat16) return false;
  DFGNN_DISPATCH_FLOAT_TYPES(st, "dfgnn", [&] {
    using T = typename cuda_type<scalar_t>::type;
    ok = dispatch_row_shape<T>(C, vector_rows, [&](auto VEC, auto G, auto NV) {
      f(RowShape<T, decltype(VEC)::value, decltype(G)::value, decltype(NV)::value>{});
    });
  });
  return ok;
}

}  // namespace

bool smmf_two_rows_supported(at::ScalarType st, int64_t C, bool vector_rows) {
  bool two = false;
  with_row_shape(st, C, vector_rows, [&](auto s) { two = kHasTwoRowsShape<decltype(s)>; });
  return two;
}

bool backward_merge_in_kernel_supported(at::ScalarType st) { return st == at::kFloat; }

bool stream_is_capturing() {
  cudaStreamCaptureStatus status;
  C10_CUDA_CHECK(cudaStreamIsCapturing(c10::cuda::getCurrentCUDAStream().stream(), &status));
  return status != cudaStreamCaptureStatusNone;
}

void check_vector_rows(const char* op, bool vector_rows,
                       std::initializer_list<std::pair<const char*, const at::Tensor*>> rows) {
  if (!vector_rows) return;
  for (const auto& [name, t] : rows)
    TORCH_CHECK(!t->defined() || t->numel() == 0 || rows_aligned16(*t), op,
                ": the plan's vector_rows=True (16-byte row accesses) needs 16-byte aligned "
                "rows, and ", name, "'s are not (its data or row stride); such a call needs "
                "vector_rows=False");
}

void check_two_rows(const char* op, const KernelPlan& plan, const LayoutView& L,
                    at::ScalarType st, int64_t C) {
  if (!plan.two_rows) return;
  TORCH_CHECK(!plan.pmf && L.rw.num_slots == 0, op, ": two_rows=True needs SMMF (pmf=False) "
              "and no split rows (row_slots == 0), got pmf=", plan.pmf ? "True" : "False",
              ", row_slots=", std::to_string(L.rw.num_slots));
  TORCH_CHECK(smmf_two_rows_supported(st, C, plan.vector_rows), op, ": two_rows=True: the "
              "SMMF forward has two rows per warp only for float32 with vector_rows=True and C "
              "in [20, 128], a multiple of 4; got ", st, ", C=", std::to_string(C),
              ", vector_rows=", plan.vector_rows ? "True" : "False");
}

}  // namespace dfgnn
