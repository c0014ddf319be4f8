// Autograd kernels of the fused ops (the Autograd dispatch key of dfgnn::gt_fwd,
// dfgnn::gat_fwd, dfgnn::l2norm_fwd and dfgnn::agnn_fwd), paper §4.3, and AGNN's
// one-call composition of the normalisation and the attention.
//
// Why C++ and not torch.library.register_autograd: the Python autograd kernel
// runs for every call of the op, also under no_grad, and the backward ran a
// Python function through the engine: most of a Cora-sized layer's wall time
// (docs/design.md, "Host path").
// Here a call with grad costs one C++ Node; the backward never takes the GIL.
// GT and GAT have a hand-written node (AttentionBackward), AGNN and its
// normalisation a torch::autograd::Function.
//
// The forward and backward call the ops through the dispatcher below autograd,
// so FakeTensor tracing (torch.compile, opcheck) sees dfgnn::*_bwd with their
// register_fake implementations (pyg_dfgnn/ops/_custom.py).
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
namespace {

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
c10::TypedOperatorHandle<Sig> find_op(const char* name) {
  return c10::Dispatcher::singleton().findSchemaOrThrow(name, "").typed<Sig>();
}

Tensor value_or_undefined(const OptTensor& t) { return t.has_value() ? *t : Tensor(); }

// Whether a call records an autograd node: grad mode is on and one of its
// differentiable inputs requires a gradient. Otherwise every autograd kernel
// below calls its op directly, below autograd: Function::apply would still build
// a node and fill its context, host time that a small graph's call is made of.
bool records_grad(std::initializer_list<std::reference_wrapper<const Tensor>> inputs) {
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
constexpr int kSavedLayout = 9;  // rowptr, col, row_items, row_combine, 5 CSC tensors
void save_layout(AutogradContext* ctx, const LayoutArgs& L,
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

constexpr char kGtFwd[] = "dfgnn::gt_fwd";
constexpr char kGtBwd[] = "dfgnn::gt_bwd";
constexpr char kGatFwd[] = "dfgnn::gat_fwd";
constexpr char kGatBwd[] = "dfgnn::gat_bwd";
constexpr char kGtNode[] = "dfgnn::GtAttentionBackward";
constexpr char kGatNode[] = "dfgnn::GatAttentionBackward";

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
  StoredLayout layout_;
  double param_ = 0.0, dropout_ = 0.0;
  int64_t seed_ = 0;
  bool one_launch_ = false;  // gt_bwd's launches, decided with the forward's plan

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
      static const auto op = find_op<GtBwdSig>(kBwd);
      std::tie(res[0], res[1], res[2]) = layout_.backward(
          kName, op, grads[0].contiguous(), a, b, c, out, lse2_, param_, dropout_, seed_,
          one_launch_);
    } else {
      static const auto op = find_op<BwdSig>(kBwd);
      std::tie(res[0], res[1], res[2]) = layout_.backward(
          kName, op, grads[0].contiguous(), a, b, c, out, lse2_, param_, dropout_, seed_);
    }
    return res;
  }
};

// The kernel plan's arguments of a forward call after need_attn (gt_fwd: all of
// them; gat_fwd: two_rows). Refers to the caller's tile plan, for the call.
struct PlanArgs {
  const OptTensor& tiles;
  double dense_cells;
  bool mma, two_rows, bwd_one_launch;
};

// The parameters gt_fwd and gat_fwd share (three feature tensors first; `param`
// is gt's scale or gat's negative slope), for the entry points below.
#define DFGNN_ATTN_PARAMS                                                                 \
  const Tensor &a, const Tensor &b, const Tensor &c, const Tensor &rowptr, const Tensor &col, \
      const Tensor &row_items, const Tensor &row_combine, int64_t row_slots,                \
      const OptTensor &csr_row, const OptTensor &colptr, const OptTensor &row,              \
      const OptTensor &perm, const OptTensor &col_items, const OptTensor &col_combine,      \
      int64_t col_slots, int64_t chunk, double param, double dropout, int64_t seed, bool pmf, \
      bool need_attn
#define DFGNN_ATTN_ARGS                                                                    \
  a, b, c, rowptr, col, row_items, row_combine, row_slots, csr_row, colptr, row, perm,      \
      col_items, col_combine, col_slots, chunk, param, dropout, seed, pmf, need_attn

// The op's CUDA kernel, below autograd; `kFwd` picks gt_fwd or gat_fwd.
template <const char* kFwd>
Tensor3 attention_below(DFGNN_ATTN_PARAMS, const PlanArgs& plan) {
  at::AutoDispatchBelowADInplaceOrView below;
  if constexpr (kFwd == kGtFwd) {
    static const auto op = find_op<GtFwdSig>(kFwd);
    return op.call(DFGNN_ATTN_ARGS, plan.tiles, plan.dense_cells, plan.mma, plan.two_rows,
                   plan.bwd_one_launch);
  } else {
    static const auto op = find_op<FwdSig>(kFwd);
    return op.call(DFGNN_ATTN_ARGS, plan.two_rows);
  }
}

// The Autograd kernel of gt_fwd / gat_fwd (through gt_autograd / gat_autograd):
// outputs (out, lse2, attn); out is differentiable in the three feature tensors
// (argument positions 0, 1, 2), the row statistics and the attention weights are
// not.
template <const char* kFwd, const char* kBwd, const char* kName>
Tensor3 attention_autograd(DFGNN_ATTN_PARAMS, const PlanArgs& plan) {
  auto forward = [&] { return attention_below<kFwd>(DFGNN_ATTN_ARGS, plan); };
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
  node->layout_ = StoredLayout(LayoutArgs{rowptr, col, row_items, row_combine, row_slots, colptr,
                                          row, perm, col_items, col_combine, col_slots, chunk});
  node->param_ = param;
  node->dropout_ = dropout;
  node->seed_ = seed;
  node->one_launch_ = plan.bwd_one_launch;
  return {out, lse2, attn};
}

Tensor3 gt_autograd(DFGNN_ATTN_PARAMS, const OptTensor& tiles, double dense_cells, bool mma,
                    bool two_rows, bool bwd_one_launch) {
  return attention_autograd<kGtFwd, kGtBwd, kGtNode>(
      DFGNN_ATTN_ARGS, PlanArgs{tiles, dense_cells, mma, two_rows, bwd_one_launch});
}

Tensor3 gat_autograd(DFGNN_ATTN_PARAMS, bool two_rows) {
  static const OptTensor no_tiles;
  return attention_autograd<kGatFwd, kGatBwd, kGatNode>(
      DFGNN_ATTN_ARGS, PlanArgs{no_tiles, 0.0, false, two_rows, false});
}

#undef DFGNN_ATTN_PARAMS
#undef DFGNN_ATTN_ARGS

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

// AGNN in one op call (dfgnn::agnn_fwd): the normalisation and the SMMF attention
// over q = beta k, k = x / max(||x||, eps), v = x (scale 1). Composing the two ops
// in Python cost a second op call, Python glue and two more autograd nodes: on
// Cora that host time was three times the GPU time.
// fp32 runs dfgnn::cos_fwd instead: the kernel gathers x_j once per edge for
// both the score and the sum, and k, q are only built in the backward (for
// gt_bwd). fp16 / bf16 keep l2norm_fwd + gt_fwd, whose lse matches the rounded
// k and q that gt_bwd recomputes the scores from.
using Tensor2 = std::tuple<Tensor, Tensor>;
using Tensor4 = std::tuple<Tensor, Tensor, Tensor, Tensor>;
using L2FwdSig = Tensor3(const Tensor&, const Tensor&, double);
using L2BwdSig = Tensor2(const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                         const Tensor&);
using CosFwdSig = Tensor4(const Tensor&, const Tensor&, double, const Tensor&, const Tensor&,
                          const Tensor&, const Tensor&, int64_t, int64_t, bool, bool);

// The schema's parameters, shared by the op's three C++ entry points below.
#define DFGNN_AGNN_PARAMS                                                                  \
  const Tensor &x, const Tensor &beta, double eps, const Tensor &rowptr, const Tensor &col, \
      const Tensor &row_items, const Tensor &row_combine, int64_t row_slots,                \
      const OptTensor &colptr, const OptTensor &row, const OptTensor &perm,                 \
      const OptTensor &col_items, const OptTensor &col_combine, int64_t col_slots,          \
      int64_t chunk, bool need_attn, bool mma, bool two_rows, bool bwd_one_launch
#define DFGNN_AGNN_ARGS                                                                     \
  x, beta, eps, rowptr, col, row_items, row_combine, row_slots, colptr, row, perm, col_items, \
      col_combine, col_slots, chunk, need_attn, mma, two_rows, bwd_one_launch

// k, q (undefined on the fp32 cos_fwd path), rnorm, then (out, lse2, attn) of the
// attention; no dropout, SMMF.
std::tuple<Tensor, Tensor, Tensor, Tensor, Tensor, Tensor> agnn_forward(DFGNN_AGNN_PARAMS) {
  static const auto l2 = find_op<L2FwdSig>("dfgnn::l2norm_fwd");
  static const auto gt = find_op<GtFwdSig>(kGtFwd);
  static const auto cos = find_op<CosFwdSig>("dfgnn::cos_fwd");
  if (x.scalar_type() == at::kFloat) {
    auto [out, lse2, attn, rnorm] = cos.call(x, beta, eps, rowptr, col, row_items, row_combine,
                                             row_slots, chunk, need_attn, two_rows);
    return {Tensor(), Tensor(), rnorm, out, lse2, attn};
  }
  auto [k, q, rnorm] = l2.call(x, beta, eps);
  auto [out, lse2, attn] = gt.call(q, k, x, rowptr, col, row_items, row_combine, row_slots,
                                   c10::nullopt, colptr, row, perm, col_items, col_combine,
                                   col_slots, chunk, 1.0, 0.0, 0, false, need_attn,
                                   c10::nullopt, 0.0, mma, two_rows, bwd_one_launch);
  return {k, q, rnorm, out, lse2, attn};
}

// Below autograd (and for FakeTensor tracing): the two ops, outputs (out, attn).
Tensor2 agnn_composite(DFGNN_AGNN_PARAMS) {
  auto r = agnn_forward(DFGNN_AGNN_ARGS);
  return {std::get<3>(r), std::get<5>(r)};
}

struct AGNNAttention : torch::autograd::Function<AGNNAttention> {
  static variable_list forward(AutogradContext* ctx, const Tensor& x, const Tensor& beta,
                               double eps, const LayoutArgs& L, bool need_attn, bool mma,
                               bool two_rows, bool bwd_one_launch) {
    Tensor k, q, rnorm, out, lse2, attn;
    {
      at::AutoDispatchBelowADInplaceOrView below;
      std::tie(k, q, rnorm, out, lse2, attn) =
          agnn_forward(x, beta, eps, L.rowptr, L.col, L.row_items, L.row_combine, L.row_slots,
                       L.colptr, L.row, L.perm, L.col_items, L.col_combine, L.col_slots,
                       L.chunk, need_attn, mma, two_rows, bwd_one_launch);
    }
    ctx->save_for_backward({x, beta, out});
    save_layout(ctx, L, {k, q, rnorm, lse2});
    ctx->saved_data["eps"] = eps;
    ctx->saved_data["bwd_one_launch"] = bwd_one_launch;
    ctx->mark_non_differentiable({attn});
    return {out, attn};
  }

  // dx = (normalisation backward of dk, dq) + dv, since x is both v and the
  // normalised k / q; dbeta from the normalisation's per-row terms.
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    variable_list res(8);  // x, beta, eps, the layout, need_attn and the plan's three
    if (!grads[0].defined()) return res;
    static const auto gt_bwd = find_op<GtBwdSig>(kGtBwd);
    static const auto l2 = find_op<L2FwdSig>("dfgnn::l2norm_fwd");
    static const auto l2_bwd = find_op<L2BwdSig>("dfgnn::l2norm_bwd");
    const auto s = ctx->get_saved_variables();  // x, beta, out
    const SavedLayout L(ctx);
    Tensor k = L.extra[0], q = L.extra[1];
    if (!k.defined())  // the fp32 forward (cos_fwd) did not build k and q
      std::tie(k, q, std::ignore) = call_backward_op(l2, s[0], s[1],
                                                     ctx->saved_data.at("eps").toDouble());
    auto [dq, dk, dv] = L.layout.backward("dfgnn::agnn_fwd", gt_bwd, grads[0].contiguous(), q,
                                          k, s[0], s[2], L.extra[3], 1.0, 0.0, 0,
                                          ctx->saved_data.at("bwd_one_launch").toBool());
    auto [dxn, dbeta_part] = call_backward_op(l2_bwd, dk, dq, k, L.extra[2], s[1]);
    res[0] = dxn.add(dv);
    res[1] = dbeta_part.sum().reshape(s[1].sizes());
    return res;
  }
};

Tensor2 agnn_autograd(DFGNN_AGNN_PARAMS) {
  if (!records_grad({x, beta})) {
    at::AutoDispatchBelowADInplaceOrView below;
    return agnn_composite(DFGNN_AGNN_ARGS);
  }
  const LayoutArgs L{rowptr, col,       row_items,   row_combine, row_slots, colptr,
                     row,    perm,      col_items,   col_combine, col_slots, chunk};
  auto o = AGNNAttention::apply(x, beta, eps, L, need_attn, mma, two_rows, bwd_one_launch);
  return {o[0], o[1]};
}

#undef DFGNN_AGNN_PARAMS
#undef DFGNN_AGNN_ARGS

}  // namespace

TORCH_LIBRARY_IMPL(dfgnn, Autograd, m) {
  m.impl("gt_fwd", &gt_autograd);
  m.impl("gat_fwd", &gat_autograd);
  m.impl("l2norm_fwd", &l2norm_autograd);
  m.impl("agnn_fwd", &agnn_autograd);
}

TORCH_LIBRARY_IMPL(dfgnn, CompositeExplicitAutograd, m) {
  m.impl("agnn_fwd", &agnn_composite);
}

}  // namespace dfgnn
