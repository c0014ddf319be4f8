// What the C++ autograd kernels of the fused ops share (autograd.cpp for GT, GAT
// and the normalisation, agnn.cpp for AGNN): the typed op handles, the grad
// check, and the layout a backward node keeps.
#pragma once
#include <ATen/FuncTorchTLS.h>
#include <torch/csrc/autograd/custom_function.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/functions/utils.h>
#include <torch/library.h>

#include <functional>
#include <initializer_list>
#include <memory>
#include <tuple>
#include <type_traits>

namespace dfgnn {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;
using at::Tensor;
using OptTensor = c10::optional<Tensor>;
using Tensor3 = std::tuple<Tensor, Tensor, Tensor>;

// The schemas of gat_fwd (three feature tensors first, then the layout and the
// scalars, and the kernel plan's two_rows) and gt_fwd (the kernel plan's tile
// plan, dense_cells, mma, two_rows and bwd_one_launch), gat_bwd and gt_bwd (the
// plan's one_launch).
#define DFGNN_FWD_COMMON                                                                  \
  const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&, \
      const Tensor&, int64_t, const OptTensor&, const OptTensor&, const OptTensor&,          \
      const OptTensor&, const OptTensor&, const OptTensor&, int64_t, int64_t, double, double, \
      int64_t, bool, bool
#define DFGNN_BWD_COMMON                                                                  \
  const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&, \
      const Tensor&, const Tensor&, const Tensor&, const Tensor&, int64_t, const Tensor&,    \
      const Tensor&, const Tensor&, const Tensor&, const Tensor&, int64_t, int64_t, double,  \
      double, int64_t
using FwdSig = Tensor3(DFGNN_FWD_COMMON, bool);
using GtFwdSig = Tensor3(DFGNN_FWD_COMMON, const OptTensor&, double, bool, bool, bool);
using BwdSig = Tensor3(DFGNN_BWD_COMMON);
using GtBwdSig = Tensor3(DFGNN_BWD_COMMON, bool);
#undef DFGNN_FWD_COMMON
#undef DFGNN_BWD_COMMON

template <typename Sig>
inline c10::TypedOperatorHandle<Sig> find_op(const char* name) {
  return c10::Dispatcher::singleton().findSchemaOrThrow(name, "").typed<Sig>();
}

inline Tensor value_or_undefined(const OptTensor& t) { return t.has_value() ? *t : Tensor(); }

// Whether a call records an autograd node: grad mode is on and one of its
// differentiable inputs requires a gradient. Otherwise every autograd kernel
// below calls its op directly, below autograd: Function::apply would still build
// a node and fill its context, host time that a small graph's call is made of.
inline bool records_grad(std::initializer_list<std::reference_wrapper<const Tensor>> inputs) {
  if (!at::GradMode::is_enabled()) return false;
  for (const Tensor& t : inputs)
    if (t.defined() && t.requires_grad()) return true;
  return false;
}

// The graph-layout arguments of a call (CSR and its work items, CSC and its
// work items, work sizes). AGNN passes them to Function::apply as one non-tensor
// argument next to the differentiable tensors. apply's host cost grows with its number
// of tensor arguments (an input VariableInfo, an edge and a saved variable
// each): with the nine layout tensors as arguments, building the node took
// about half of a Cora-sized forward's host time.
// The members refer to the caller's arguments and live for the call.
struct LayoutArgs {
  const Tensor& rowptr;
  const Tensor& col;
  const Tensor& row_items;
  const Tensor& row_combine;
  int64_t row_slots;
  const OptTensor& colptr;
  const OptTensor& row;
  const OptTensor& perm;
  const OptTensor& col_items;
  const OptTensor& col_combine;
  int64_t col_slots;
  int64_t chunk;
};

// What a node keeps of its layout, and the op's tensors that carry no gradient
// (`extra`: row statistics, intermediates; may be undefined), as one tensor
// list in the context's saved_data, not as saved variables: none of them is an
// input that requires a gradient or a differentiable output, so the version
// checks and graph edges of saved variables have nothing to guard. The CSC
// entries are undefined when the call did not pass them; the backward checks.
inline constexpr int kSavedLayout = 9;  // rowptr, col, row_items, row_combine, 5 CSC tensors
inline void save_layout(AutogradContext* ctx, const LayoutArgs& L,
                 std::initializer_list<Tensor> extra) {
  c10::List<Tensor> t;
  t.reserve(kSavedLayout + extra.size());
  for (const Tensor& x : {L.rowptr, L.col, L.row_items, L.row_combine})
    t.push_back(x);
  for (const OptTensor* x : {&L.colptr, &L.row, &L.perm, &L.col_items, &L.col_combine})
    t.push_back(value_or_undefined(*x));
  for (const Tensor& x : extra) t.push_back(x);
  ctx->saved_data["layout"] = std::move(t);
  ctx->saved_data["sizes"] = std::vector<int64_t>{L.row_slots, L.col_slots, L.chunk};
  ctx->set_materialize_grads(false);
}

// A backward op call. Without create_graph (grad mode off in the backward) it
// goes below autograd: the backward ops have no autograd kernel, and the boxed
// autograd fallback would box and unbox their 21 arguments for nothing.
template <typename Sig, typename... Args>
auto call_backward_op(const c10::TypedOperatorHandle<Sig>& op, Args&&... args) {
  if (at::GradMode::is_enabled()) return op.call(std::forward<Args>(args)...);
  at::AutoDispatchBelowADInplaceOrView below;
  return op.call(std::forward<Args>(args)...);
}

// What a backward node keeps of its call's layout (LayoutArgs by value); the
// CSC entries are undefined when the call did not pass them.
struct StoredLayout {
  Tensor rowptr, col, row_items, row_combine, colptr, row, perm, col_items, col_combine;
  int64_t row_slots = 0, col_slots = 0, chunk = 0;

  StoredLayout() = default;
  explicit StoredLayout(const LayoutArgs& L)
      : rowptr(L.rowptr), col(L.col), row_items(L.row_items), row_combine(L.row_combine),
        colptr(value_or_undefined(L.colptr)), row(value_or_undefined(L.row)),
        perm(value_or_undefined(L.perm)), col_items(value_or_undefined(L.col_items)),
        col_combine(value_or_undefined(L.col_combine)), row_slots(L.row_slots),
        col_slots(L.col_slots), chunk(L.chunk) {}

  // A backward op (gt_bwd, gat_bwd) on this layout, `plan` its arguments after
  // the seed; `who` names the node in the error of a forward that had no CSC.
  template <typename Sig, typename... Plan>
  Tensor3 backward(const char* who, const c10::TypedOperatorHandle<Sig>& op,
                   const Tensor& grad, const Tensor& a, const Tensor& b, const Tensor& c,
                   const Tensor& out, const Tensor& lse2, double param, double dropout,
                   int64_t seed, Plan... plan) const {
    TORCH_CHECK(colptr.defined() && row.defined() && perm.defined() && col_items.defined() &&
                    col_combine.defined(),
                who, ": the forward was called without the CSC layout (colptr, row, perm, "
                "col_items, col_combine), so it cannot be differentiated");
    return call_backward_op(op, grad, a, b, c, out, lse2, rowptr, col, row_items, row_combine,
                            row_slots, colptr, row, perm, col_items, col_combine, col_slots,
                            chunk, param, dropout, seed, plan...);
  }
};

// The layout and `extra` tensors an AGNN context saved (save_layout).
struct SavedLayout {
  StoredLayout layout;
  std::vector<Tensor> extra;
  explicit SavedLayout(const AutogradContext* ctx) {
    const auto& d = ctx->saved_data;
    const auto t = d.at("layout").toTensorVector();
    const auto sizes = d.at("sizes").toIntVector();
    layout.rowptr = t[0];
    layout.col = t[1];
    layout.row_items = t[2];
    layout.row_combine = t[3];
    layout.colptr = t[4];
    layout.row = t[5];
    layout.perm = t[6];
    layout.col_items = t[7];
    layout.col_combine = t[8];
    layout.row_slots = sizes[0];
    layout.col_slots = sizes[1];
    layout.chunk = sizes[2];
    extra.assign(t.begin() + kSavedLayout, t.end());
  }
};

inline constexpr char kGtFwd[] = "dfgnn::gt_fwd";
inline constexpr char kGtBwd[] = "dfgnn::gt_bwd";

}  // namespace dfgnn
