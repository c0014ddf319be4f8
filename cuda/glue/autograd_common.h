// What the C++ autograd kernels of the fused ops share (autograd.cpp for GT, GAT
// and the normalisation, agnn.cpp for AGNN): the typed op handles, the grad
// check, and the layout a backward keeps.
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
#include <vector>

#include "glue/layout_args.h"

namespace dfgnn {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;
using at::Tensor;
using OptTensor = c10::optional<Tensor>;
using Tensor3 = std::tuple<Tensor, Tensor, Tensor>;

// The schemas of the attention ops (glue/bindings.cpp): the features, the
// layout (csr, csc, sizes), the call's scalars, then the plan.
using GatFwdSig = Tensor3(const Tensor&, const Tensor&, const Tensor&, const CsrList&,
                          const OptTensorList&, at::IntArrayRef, double, double, int64_t, bool,
                          at::IntArrayRef);
using GtFwdSig = Tensor3(const Tensor&, const Tensor&, const Tensor&, const CsrList&,
                         const OptTensorList&, at::IntArrayRef, double, double, int64_t, bool,
                         at::IntArrayRef, double);
using GatBwdSig = Tensor3(const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                          const Tensor&, const Tensor&, const CsrList&, at::TensorList,
                          at::IntArrayRef, double, double, int64_t);
using GtBwdSig = Tensor3(const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                         const Tensor&, const Tensor&, const CsrList&, at::TensorList,
                         at::IntArrayRef, double, double, int64_t, bool, bool);
// gt_bwd_into: dq, dk, dv to write, then gt_bwd's arguments.
using GtBwdIntoSig = void(const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                          const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                          const Tensor&, const CsrList&, at::TensorList, at::IntArrayRef, double,
                          double, int64_t, bool, bool);

// The pointer autograd holds its nodes by: std::shared_ptr<Node> in torch 2.11,
// c10::intrusive_ptr<Node> in torch 2.14. Node::getptr() returns it in both.
using torch::autograd::Node;
using NodePtr = decltype(std::declval<Node&>().getptr());

template <class N>
auto make_node() {
  if constexpr (std::is_same_v<NodePtr, std::shared_ptr<Node>>) {
    // deleteNode (found by ADL: N is a torch::autograd::Node) frees a long
    // chain of nodes without recursion, as PyTorch's own nodes are freed.
    return std::shared_ptr<N>(new N(), [](N* n) { deleteNode(n); });
  } else {
    return c10::make_intrusive<N>();
  }
}

template <typename Sig>
c10::TypedOperatorHandle<Sig> find_op(const char* name) {
  return c10::Dispatcher::singleton().findSchemaOrThrow(name, "").typed<Sig>();
}

// Whether a call records an autograd node: grad mode is on and one of its
// differentiable inputs requires a gradient. Otherwise every autograd kernel
// calls its op directly, below autograd: Function::apply would still build a
// node and fill its context, host time that a small graph's call is made of.
inline bool records_grad(std::initializer_list<std::reference_wrapper<const Tensor>> inputs) {
  if (!at::GradMode::is_enabled()) return false;
  for (const Tensor& t : inputs)
    if (t.defined() && t.requires_grad()) return true;
  return false;
}

// records_grad over a list of inputs (undefined entries: absent optional inputs).
inline bool records_grad(at::ArrayRef<Tensor> inputs) {
  if (!at::GradMode::is_enabled()) return false;
  for (const Tensor& t : inputs)
    if (t.defined() && t.requires_grad()) return true;
  return false;
}

// A backward op call. Without create_graph (grad mode off in the backward) it
// goes below autograd: the backward ops have no autograd kernel, and the boxed
// autograd fallback would box and unbox their arguments for nothing.
template <typename Sig, typename... Args>
auto call_backward_op(const c10::TypedOperatorHandle<Sig>& op, Args&&... args) {
  if (at::GradMode::is_enabled()) return op.call(std::forward<Args>(args)...);
  at::AutoDispatchBelowADInplaceOrView below;
  return op.call(std::forward<Args>(args)...);
}

// A forward call's layout arguments (csr, csc, sizes) as a backward keeps them:
// by value, the CSC empty where the call passed none. The csr list is shared
// with the call, not copied: the ops never change their arguments. A node keeps
// them as plain members, not saved variables: none is an input that requires a
// gradient or a differentiable output, so the version checks and graph edges of
// saved variables have nothing to guard.
struct KeptLayout {
  CsrList csr;
  std::vector<Tensor> csc;
  std::vector<int64_t> sizes;

  KeptLayout() = default;
  KeptLayout(const CsrList& csr_, const OptTensorList& csc_, at::IntArrayRef sizes_)
      : csr(csr_), csc(csc_.has_value() ? csc_->vec() : std::vector<Tensor>()),
        sizes(sizes_.vec()) {}

  // The error of a backward (`who`, its node) whose forward had no CSC layout.
  void check_csc(const char* who) const {
    TORCH_CHECK(!csc.empty(), who, ": the forward was called without the CSC layout (csc: "
                "colptr, row, perm, col_items, col_combine), so it cannot be differentiated");
  }

  // A backward op (gt_bwd, gat_bwd) on this layout, `plan` its arguments after
  // the seed; `who` names the node in the error of a forward that had no CSC.
  template <typename Sig, typename... Plan>
  Tensor3 backward(const char* who, const c10::TypedOperatorHandle<Sig>& op,
                   const Tensor& grad, const Tensor& a, const Tensor& b, const Tensor& c,
                   const Tensor& out, const Tensor& lse2, double param, double dropout,
                   int64_t seed, Plan... plan) const {
    check_csc(who);
    return call_backward_op(op, grad, a, b, c, out, lse2, csr, at::TensorList(csc),
                            at::IntArrayRef(sizes), param, dropout, seed, plan...);
  }
};

// A node that joins its outputs' gradients by columns into one [rows, width]
// buffer before its GEMMs (the GT projections, projections.cpp). A node
// downstream in the forward that computes some of those gradients (the GT
// attention's dq, dk, dv) writes them into the buffer's column slices and offers
// it; the joining node then fills only the other slices instead of
// concatenating every gradient (docs/design.md, "GT projections").
struct JoinedGradients : Node {
  // Output `nr`'s first column in the joined gradient, or -1 where it is not joined.
  virtual int64_t joined_column(int64_t nr) const = 0;
  virtual int64_t joined_width() const = 0;
  // The buffer whose slices a downstream node wrote; the next apply takes it and
  // uses the slices its gradients are views of.
  virtual void offer_joined(Tensor joined) = 0;
};

inline constexpr char kGtFwd[] = "dfgnn::gt_fwd";
inline constexpr char kGtBwd[] = "dfgnn::gt_bwd";
inline constexpr char kGtBwdInto[] = "dfgnn::gt_bwd_into";

}  // namespace dfgnn
