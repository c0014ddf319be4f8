// Autograd kernels of the fused ops (the Autograd dispatch key of dfgnn::gt_fwd,
// dfgnn::gat_fwd and dfgnn::l2norm_fwd), paper §4.3; dfgnn::agnn_fwd's is in
// agnn.cpp.
//
// Why C++ and not torch.library.register_autograd: the Python autograd kernel
// runs for every call of the op, also under no_grad, and the backward ran a
// Python function through the engine: most of a Cora-sized layer's wall time
// (docs/design.md, "Host path").
// Here a call with grad costs one C++ Node; the backward never takes the GIL.
// GT and GAT have a hand-written node (AttentionBackward), AGNN (agnn.cpp) and
// its normalisation a torch::autograd::Function.
//
// The forward and backward call the ops through the dispatcher below autograd,
// so FakeTensor tracing (torch.compile, opcheck) sees dfgnn::*_bwd with their
// register_fake implementations (pyg_dfgnn/ops/_custom.py).
#include <ATen/FuncTorchTLS.h>
#include <torch/csrc/autograd/custom_function.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/functions/utils.h>
#include <torch/library.h>

#include <array>
#include <functional>
#include <initializer_list>
#include <memory>
#include <tuple>
#include <type_traits>
#include <utility>

#include "glue/autograd_common.h"

namespace dfgnn {
namespace {

constexpr char kGatFwd[] = "dfgnn::gat_fwd";
constexpr char kGatBwd[] = "dfgnn::gat_bwd";
constexpr char kGtNode[] = "dfgnn::GtAttentionBackward";
constexpr char kGatNode[] = "dfgnn::GatAttentionBackward";

// The backward node of a GT or GAT call (dfgnn::gt_fwd / gat_fwd with grad): a
// hand-written Node, as PyTorch's generated ones are, not a
// torch::autograd::Function (which AGNN below still uses). A small graph's
// call is host time (docs/design.md, "Host path"), and Function's node paid for
// generality on every call: a VariableInfo per input and output, the view /
// dirty / non-differentiable bookkeeping of every output, a context map keyed
// by strings, and a demangled type name on every backward. Here: the three
// features and `out` as SavedVariables (version checks, saved-tensor hooks),
// the rest as plain members, history on `out` only (lse2 and the attention
// weights carry no gradient). Not supported, each with a clear error: compiled
// autograd (no compiled_args; PyTorch's error names the node) and forward-mode
// AD (checked in the forward).
template <const char* kBwd, const char* kName>
struct AttentionBackward final : Node {
  torch::autograd::SavedVariable a_, b_, c_, out_;
  Tensor lse2_;
  KeptLayout layout_;
  double param_ = 0.0, dropout_ = 0.0;
  int64_t seed_ = 0;
  bool one_launch_ = false;  // gt_bwd's launches, decided with the forward's plan
  bool mma_ = false;         // gt_bwd's tensor-core walks, idem
  // GT: for q, k and v (in order) that are whole outputs of a JoinedGradients
  // node (the projections), that node and the output's first column in its
  // joined gradient, where the backward writes the feature's gradient; column
  // -1 otherwise.
  NodePtr sink_[3];
  int64_t column_[3] = {-1, -1, -1};

  std::string name() const override { return kName; }

  void release_variables() override {
    std::lock_guard<std::mutex> lock(mutex_);
    a_.reset_data();
    b_.reset_data();
    c_.reset_data();
    out_.reset_data();
    lse2_.reset();
  }

  // Gradients of a, b, c (one kernel walk for all three).
  variable_list apply(variable_list&& grads) override {
    std::lock_guard<std::mutex> lock(mutex_);
    variable_list res(3);
    if (!grads[0].defined()) return res;  // out unused: nothing flows back
    const Tensor a = a_.unpack(), b = b_.unpack(), c = c_.unpack(), out = out_.unpack(getptr());
    if constexpr (kBwd == kGtBwd) {
      // Not under create_graph: gt_bwd_into has no autograd kernel.
      if (!at::GradMode::is_enabled()) {
        const auto col = joined_columns();
        if (col[0] >= 0 || col[1] >= 0 || col[2] >= 0)
          return backward_joined(col, grads[0].contiguous(), a, b, c, out);
      }
      static const auto op = find_op<GtBwdSig>(kBwd);
      std::tie(res[0], res[1], res[2]) = layout_.backward(
          kName, op, grads[0].contiguous(), a, b, c, out, lse2_, param_, dropout_, seed_,
          one_launch_, mma_);
    } else {
      static const auto op = find_op<GatBwdSig>(kBwd);
      std::tie(res[0], res[1], res[2]) = layout_.backward(
          kName, op, grads[0].contiguous(), a, b, c, out, lse2_, param_, dropout_, seed_);
    }
    return res;
  }

  // column_ as the kernels can write it: dk and dv share one row stride, so both
  // are slices of buffers of one width or neither is.
  std::array<int64_t, 3> joined_columns() const {
    auto width = [&](int i) {
      return static_cast<const JoinedGradients*>(sink_[i].get())->joined_width();
    };
    const bool kv = column_[1] >= 0 && column_[2] >= 0 && width(1) == width(2);
    return {column_[0], kv ? column_[1] : -1, kv ? column_[2] : -1};
  }

  // GT without create_graph where some of q, k, v come from a JoinedGradients
  // node: their gradients are written into column slices of that node's joined
  // gradient (one buffer per node, [its rows, its width]), which is offered to
  // it, so that it does not concatenate them again. The slices are the returned
  // gradients: views with rows `width` elements apart.
  variable_list backward_joined(const std::array<int64_t, 3>& column, const Tensor& grad,
                                const Tensor& q, const Tensor& k, const Tensor& v,
                                const Tensor& out) {
    layout_.check_csc(kName);
    const Tensor* feats[3] = {&q, &k, &v};
    // owner[i]: the first joined feature with feature i's sink; it allocates
    // that sink's buffer and offers it, once
    int owner[3];
    for (int i = 0; i < 3; ++i) {
      owner[i] = i;
      for (int j = 0; j < i; ++j)
        if (column[i] >= 0 && column[j] >= 0 && sink_[j] == sink_[i]) {
          owner[i] = j;
          break;
        }
    }
    Tensor buffers[3];
    variable_list res(3);
    for (int i = 0; i < 3; ++i) {
      const Tensor& t = *feats[i];
      if (column[i] < 0) {
        res[i] = at::empty_like(t);
        continue;
      }
      if (owner[i] != i) {
        buffers[i] = buffers[owner[i]];
      } else {
        const auto* sink = static_cast<const JoinedGradients*>(sink_[i].get());
        buffers[i] = at::empty({t.size(0), sink->joined_width()}, t.options());
      }
      // the column slice as [rows, H, C], in one view op (a small graph's
      // backward is host time)
      res[i] = buffers[i].as_strided(t.sizes(), {buffers[i].size(1), t.size(2), 1},
                                     column[i]);
    }
    static const auto op = find_op<GtBwdIntoSig>(kGtBwdInto);
    {
      at::AutoDispatchBelowADInplaceOrView below;
      op.call(res[0], res[1], res[2], grad, q, k, v, out, lse2_, layout_.csr,
              at::TensorList(layout_.csc), at::IntArrayRef(layout_.sizes), param_, dropout_,
              seed_, one_launch_, mma_);
    }
    for (int i = 0; i < 3; ++i)
      if (column[i] >= 0 && owner[i] == i)
        static_cast<JoinedGradients*>(sink_[i].get())->offer_joined(buffers[i]);
    return res;
  }
};

// Where a GT feature `t` [N, H, C] is a view of a whole 2-D output of a
// JoinedGradients node: that node and the output's first column in its joined
// gradient; column -1 otherwise. Storage offsets, not data pointers: traced
// (fake) tensors have none.
std::pair<NodePtr, int64_t> joined_target(const Tensor& t) {
  if (!t.is_view()) return {NodePtr(), -1};
  const Tensor base(t._base());
  NodePtr fn = base.grad_fn();
  auto* sink = dynamic_cast<JoinedGradients*>(fn.get());
  // The node first: only its (eager) outputs reach the shape checks.
  if (sink == nullptr || base.dim() != 2 || !base.is_contiguous() || !t.is_contiguous() ||
      base.size(0) != t.size(0) || base.numel() != t.numel() ||
      base.storage_offset() != t.storage_offset())
    return {NodePtr(), -1};
  const int64_t column = sink->joined_column(base.output_nr());
  if (column < 0) return {NodePtr(), -1};
  return {fn, column};
}

// One gt_fwd / gat_fwd call's arguments after the three features (`param`: gt's
// scale or gat's negative slope; `dense_cells`: gt's only). Refers to the
// caller's arguments, for the call.
struct AttentionCall {
  const CsrList& csr;
  const OptTensorList& csc;
  at::IntArrayRef sizes;
  double param, dropout;
  int64_t seed;
  bool need_attn;
  at::IntArrayRef plan;
  double dense_cells;
};

// The op's CUDA kernel, below autograd; `kFwd` picks gt_fwd or gat_fwd.
template <const char* kFwd>
Tensor3 attention_below(const Tensor& a, const Tensor& b, const Tensor& c,
                        const AttentionCall& x) {
  at::AutoDispatchBelowADInplaceOrView below;
  if constexpr (kFwd == kGtFwd) {
    static const auto op = find_op<GtFwdSig>(kFwd);
    return op.call(a, b, c, x.csr, x.csc, x.sizes, x.param, x.dropout, x.seed, x.need_attn,
                   x.plan, x.dense_cells);
  } else {
    static const auto op = find_op<GatFwdSig>(kFwd);
    return op.call(a, b, c, x.csr, x.csc, x.sizes, x.param, x.dropout, x.seed, x.need_attn,
                   x.plan);
  }
}

// The Autograd kernel of gt_fwd / gat_fwd (through gt_autograd / gat_autograd):
// outputs (out, lse2, attn); out is differentiable in the three feature tensors
// (argument positions 0, 1, 2), the row statistics and the attention weights are
// not.
template <const char* kFwd, const char* kBwd, const char* kName>
Tensor3 attention_autograd(const Tensor& a, const Tensor& b, const Tensor& c,
                           const AttentionCall& x) {
  auto forward = [&] { return attention_below<kFwd>(a, b, c, x); };
  // Before the no-node shortcut: a dual tensor need not require a gradient, and
  // its tangent would be dropped silently.
  for (const Tensor* t : {&a, &b, &c})
    TORCH_CHECK(!t->_fw_grad(/*level=*/0).defined(), kFwd,
                ": forward-mode AD (dual tensors) is not supported");
  if (!records_grad({a, b, c})) return forward();
  if (const auto& functorch = at::functorch::functorchTLSAccessor())
    functorch->checkSupportsCppAutogradFunction();  // functorch transforms: not supported
  // The kernel is launched before the node is built: a small graph's step is
  // host-bound, and the node's bookkeeping then runs while the kernel does.
  auto [out, lse2, attn] = forward();
  auto node = make_node<AttentionBackward<kBwd, kName>>();
  node->set_next_edges(torch::autograd::collect_next_edges(a, b, c));
  torch::autograd::set_history(out, NodePtr(node));
  node->a_ = torch::autograd::SavedVariable(a, /*is_output=*/false);
  node->b_ = torch::autograd::SavedVariable(b, /*is_output=*/false);
  node->c_ = torch::autograd::SavedVariable(c, /*is_output=*/false);
  node->out_ = torch::autograd::SavedVariable(out, /*is_output=*/true);
  node->lse2_ = lse2;
  node->layout_ = KeptLayout(x.csr, x.csc, x.sizes);
  node->param_ = x.param;
  node->dropout_ = x.dropout;
  node->seed_ = x.seed;
  node->one_launch_ = plan_flag(x.plan, kPlanBwdOneLaunch);
  node->mma_ = plan_flag(x.plan, kPlanMmaBwd);
  if constexpr (kFwd == kGtFwd) {
    if (a.is_cuda()) {
      const Tensor* feats[3] = {&a, &b, &c};
      for (int i = 0; i < 3; ++i) {
        std::tie(node->sink_[i], node->column_[i]) = joined_target(*feats[i]);
        // one writer per slice: a feature passed twice (q is k) gets its own
        // gradient, which the engine adds to the slice's
        for (int j = 0; j < i; ++j)
          if (node->column_[j] >= 0 && node->sink_[j] == node->sink_[i] &&
              node->column_[j] == node->column_[i])
            node->column_[i] = -1;
      }
    }
  }
  return {out, lse2, attn};
}

Tensor3 gt_autograd(const Tensor& q, const Tensor& k, const Tensor& v, const CsrList& csr,
                    const OptTensorList& csc, at::IntArrayRef sizes, double scale,
                    double dropout, int64_t seed, bool need_attn, at::IntArrayRef plan,
                    double dense_cells) {
  return attention_autograd<kGtFwd, kGtBwd, kGtNode>(
      q, k, v, AttentionCall{csr, csc, sizes, scale, dropout, seed, need_attn, plan, dense_cells});
}

Tensor3 gat_autograd(const Tensor& a_dst, const Tensor& a_src, const Tensor& x,
                     const CsrList& csr, const OptTensorList& csc, at::IntArrayRef sizes,
                     double negative_slope, double dropout, int64_t seed, bool need_attn,
                     at::IntArrayRef plan) {
  return attention_autograd<kGatFwd, kGatBwd, kGatNode>(
      a_dst, a_src, x,
      AttentionCall{csr, csc, sizes, negative_slope, dropout, seed, need_attn, plan, 0.0});
}

// AGNN's normalisation: k = x / max(||x||, eps), q = beta k (both differentiable),
// rnorm (not). An unused k or q gets a zero gradient (materialised by autograd).
struct L2Norm : torch::autograd::Function<L2Norm> {
  static Tensor3 call_below(const Tensor& x, const Tensor& beta, double eps) {
    static const auto op =
        find_op<Tensor3(const Tensor&, const Tensor&, double)>("dfgnn::l2norm_fwd");
    at::AutoDispatchBelowADInplaceOrView below;
    return op.call(x, beta, eps);
  }

  static variable_list forward(AutogradContext* ctx, const Tensor& x, const Tensor& beta,
                               double eps) {
    auto [k, q, rnorm] = call_below(x, beta, eps);
    ctx->save_for_backward({k, rnorm, beta});
    ctx->mark_non_differentiable({rnorm});
    return {k, q, rnorm};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    static const auto op =
        find_op<std::tuple<Tensor, Tensor>(const Tensor&, const Tensor&, const Tensor&,
                                           const Tensor&, const Tensor&)>("dfgnn::l2norm_bwd");
    const auto s = ctx->get_saved_variables();
    auto [dx, dbeta_part] =
        call_backward_op(op, grads[0].contiguous(), grads[1].contiguous(), s[0], s[1], s[2]);
    return {dx, dbeta_part.sum().reshape(s[2].sizes()), Tensor()};
  }
};

Tensor3 l2norm_autograd(const Tensor& x, const Tensor& beta, double eps) {
  if (!records_grad({x, beta})) return L2Norm::call_below(x, beta, eps);
  auto o = L2Norm::apply(x, beta, eps);
  return {o[0], o[1], o[2]};
}

}  // namespace

TORCH_LIBRARY_IMPL(dfgnn, Autograd, m) {
  m.impl("gt_fwd", &gt_autograd);
  m.impl("gat_fwd", &gat_autograd);
  m.impl("l2norm_fwd", &l2norm_autograd);
}

}  // namespace dfgnn
