// What the C++ autograd kernels share (attention.cpp for the attention ops,
// projections.cpp for the GT projections): node allocation, typed op handles,
// the grad check, backward op calls and the joined-gradient protocol.
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

namespace dfgnn {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;
using at::Tensor;
using OptTensor = c10::optional<Tensor>;

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

}  // namespace dfgnn
