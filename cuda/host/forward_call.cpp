// ForwardCall (forward_call.h): a forward call's outputs, its scratch in one
// allocation where it is small, and the PMF / split-row steps after its kernel.
#include "host/forward_call.h"

#include "host/ops.h"
#include "host/split_merge.h"

namespace dfgnn {
namespace {

// A [0] tensor of `dtype` on `like`'s device (its allocator and dispatch keys),
// made directly: attn, when the call returns no weights, costs no operator call.
at::Tensor no_elements(const at::Tensor& like, at::ScalarType dtype) {
  c10::Allocator* alloc = like.storage().allocator();
  c10::DataPtr data = alloc != nullptr ? alloc->allocate(0) : c10::DataPtr(nullptr, like.device());
  c10::Storage storage(c10::Storage::use_byte_size_t(), 0, std::move(data), alloc,
                       /*resizable=*/alloc != nullptr);
  auto impl = c10::make_intrusive<c10::TensorImpl>(std::move(storage), like.key_set(),
                                                   c10::scalarTypeToTypeMeta(dtype));
  impl->set_sizes_contiguous({0});
  return at::Tensor(std::move(impl));
}

}  // namespace

ForwardCall::ForwardCall(const at::Tensor& x, int64_t n_dst, const LayoutView& L, bool pmf_,
                         bool need_attn_, bool keep_out32)
    : pmf(pmf_),
      need_attn(need_attn_),
      out(at::empty({n_dst, x.size(1), x.size(2)}, x.options())),
      scratch({L.rw.num_slots * x.size(1) * x.size(2),
               pmf_ ? 0 : L.rw.num_slots * x.size(1) * 2, pmf_ ? L.col.numel() * x.size(1) : 0}) {
  const int64_t H = x.size(1), n_edges = L.col.numel();
  lse2 = scratch.empty_with({n_dst, H}, x.options().dtype(at::kFloat));
  attn = need_attn ? at::empty({n_edges, H}, x.options().dtype(at::kFloat))
                   : no_elements(out, at::kFloat);
  if (keep_out32 && x.scalar_type() != at::kFloat)
    out32 = at::empty({n_dst, H, x.size(2)}, x.options().dtype(at::kFloat));
}

void ForwardCall::merge_in_kernel(const char* op, const KernelPlan& plan, const LayoutView& L) {
  counters = forward_split_counters(op, plan, L, out.size(1));
}

void ForwardCall::finish(const at::Tensor& x, const LayoutView& L, const KernelPlan& plan,
                         double dropout, int64_t seed) {
  const Work& rw = L.rw;
  if (pmf) {
    softmax_spmm(x, score(), partial(), L, plan.vector_rows, out, out32_ptr(), lse2, attn_ptr(),
                 dropout, seed);
  } else if (rw.combine.size(0) > 0 && counters == nullptr) {
    merge_softmax_partials(partial(), partial_ml(), rw.num_slots, rw.combine, out, out32_ptr(),
                           lse2);
    if (need_attn) normalize_split_attn(rw.combine, L.rowptr, lse2, attn);
  }
}

}  // namespace dfgnn
