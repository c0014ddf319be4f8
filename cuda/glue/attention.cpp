// The fused attention ops, one schema per direction for every score function
// (host/score_ops.h): the plan object (torch.classes.dfgnn.Plan, call_plan.h),
// their CUDA kernels and their autograd kernel. paper §3-4 (forward), §4.3
// (backward).
//
//   attention_fwd(inputs, handle, plan, key, params, dropout, seed, need_attn)
//       -> (out [N_dst, H, C], lse2 [N_dst, H] f32, attn [E, H] f32 or [0], token,
//           saved)
//       saved ends with out in float32 [N_dst, H, C] where the plan has the CSC,
//       the score keeps_out32 and the inputs are fp16 / bf16 (keeps_out32 below)
//   attention_bwd(grad_out, inputs, out, lse2, token, saved, params, dropout)
//       -> a gradient per input
//   attention_bwd_into(grads, ...attention_bwd's arguments): the gradients
//       written into `grads` (scores with writes_into only)
//
// `inputs` and `params` are the score's, in the order of its Python spec
// (pyg_dfgnn/ops/scores); the score itself comes with the plan. Eager calls
// pass the plan; code that torch.compile traces passes None, the layout's
// handle and a plan key, and the forward resolves them when it runs
// (call_token.h: resolve_plan), drawing the dropout seed there too. The token
// carries the plan and seed to the backward in both cases, so that eager and
// compiled calls share these ops and this autograd kernel: AOTAutograd traces
// the node's backward into the compiled backward graph. The fakes are
// registered from the specs (pyg_dfgnn/ops/_fakes.py).
//
// Autograd lives here and not in torch.library.register_autograd: a Python
// autograd kernel runs for every call, also under no_grad, and its backward is a
// Python function on the engine's thread; a small graph's step is host time
// (docs/steps.md, "Host path"). Here a call with grad costs one C++ node whose backward
// never takes the GIL. It is a hand-written Node, as PyTorch's generated ones
// are: torch::autograd::Function's node pays on every call for generality (a
// VariableInfo per input and output, view / dirty bookkeeping of every output,
// a context map keyed by strings). The inputs and out are SavedVariables
// (version checks, saved-tensor hooks), the rest plain members, history on out
// only (lse2, attn and saved carry no gradient). Not supported, each with a clear
// error: compiled autograd (no compiled_args; PyTorch's error names the node)
// and forward-mode AD (checked in the forward).
#include <ATen/FuncTorchTLS.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/functions/utils.h>
#include <torch/library.h>

#include <cstdint>
#include <optional>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "glue/attention_sig.h"
#include "glue/autograd_common.h"
#include "glue/call_plan.h"
#include "glue/call_token.h"
#include "host/input_checks.h"

namespace dfgnn {
namespace {

using Tensors = std::vector<Tensor>;

constexpr char kFwd[] = "dfgnn::attention_fwd";
constexpr char kBwd[] = "dfgnn::attention_bwd";
constexpr char kBwdInto[] = "dfgnn::attention_bwd_into";

using BwdSig = Tensors(const Tensor&, at::TensorList, const Tensor&, const Tensor&, const Tensor&,
                       at::TensorList, at::ArrayRef<double>, double);
using BwdIntoSig = void(at::TensorList, const Tensor&, at::TensorList, const Tensor&,
                        const Tensor&, const Tensor&, at::TensorList, at::ArrayRef<double>,
                        double);

// What every score's inputs share: CUDA tensors on the layout's device,
// contiguous (the scores check shapes and dtypes).
void check_inputs(at::TensorList inputs, const CallPlan& P, const char* op) {
  TORCH_CHECK(!inputs.empty(), op, ": no inputs");
  for (size_t i = 0; i < inputs.size(); ++i) {
    const Tensor& t = inputs[i];
    TORCH_CHECK(t.defined(), op, ": input ", num((int64_t)i), " is undefined");
    TORCH_CHECK(t.is_cuda(), op, ": the ", P.score_name, " score's input ", num((int64_t)i),
                " must be a CUDA tensor, got device ", t.device());
    TORCH_CHECK(t.device() == P.L.rowptr.device(), op, ": input ", num((int64_t)i), " is on ",
                t.device(), " but the graph's layout is on ", P.L.rowptr.device(),
                "; move the graph with .to()");
    TORCH_CHECK(t.is_contiguous(), op, ": input ", num((int64_t)i),
                " must be contiguous (call .contiguous())");
  }
}

// `inputs` with each one that does not start on a 16-byte boundary (a
// contiguous view at an odd offset) copied: vector rows assume it. Empty where
// every input does, the common case.
Tensors aligned_copies(at::TensorList inputs) {
  bool all = true;
  for (const Tensor& t : inputs)
    all = all && (!t.defined() || reinterpret_cast<uintptr_t>(t.data_ptr()) % 16 == 0);
  if (all) return {};
  Tensors res(inputs.begin(), inputs.end());
  for (Tensor& t : res)
    if (t.defined() && reinterpret_cast<uintptr_t>(t.data_ptr()) % 16 != 0)
      t = t.clone(at::MemoryFormat::Contiguous);
  return res;
}

// Whether a forward on plan P keeps its rows in fp32 (ScoreOps::keeps_out32)
// for fp16 / bf16 inputs: only where a backward follows (the plan has the CSC),
// so inference and fp32 calls pay nothing. Its saved list then ends with them.
bool keeps_out32(const CallPlan& P) { return P.has_csc && P.score->keeps_out32; }

void check_dropout(double dropout, const char* op) {
  TORCH_CHECK(dropout >= 0.0 && dropout < 1.0, op, ": dropout must be in [0, 1), got ",
              std::to_string(dropout));
}

FwdResult attention_fwd(at::TensorList inputs, const Tensor& handle, const OptPlan& given,
                        int64_t key, at::ArrayRef<double> params, double dropout, int64_t seed,
                        bool need_attn) {
  PlanPtr plan = given.has_value() ? *given : resolve_plan(handle, key, inputs, dropout, &seed);
  TORCH_CHECK(plan, kFwd, ": no plan");
  const CallPlan& P = *plan;
  check_inputs(inputs, P, kFwd);
  const Tensors copies = aligned_copies(inputs);
  if (!copies.empty()) inputs = copies;
  check_dropout(dropout, kFwd);
  AttentionCall call{inputs, P.L, P.p, params, dropout, seed, need_attn};
  call.keep_out32 = keeps_out32(P);
  P.score->check(call, P.n_dst, P.n_src);
  const c10::cuda::CUDAGuard guard(inputs[0].device());  // the inputs' device and its stream
  ForwardOut r = P.score->forward(call);
  if (call.keep_out32 && r.out.scalar_type() != at::kFloat) {
    TORCH_INTERNAL_ASSERT(r.out32.defined(), kFwd, ": the ", P.score_name,
                          " score's forward returned no out32");
    r.saved.push_back(std::move(r.out32));  // last: backward_call takes it from there
  }
  return {std::move(r.out), std::move(r.lse2), std::move(r.attn),
          make_token(std::move(plan), seed), std::move(r.saved)};
}

// The backward's arguments past `inputs`, checked; the call, with the forward's
// fp32 rows taken off the end of `saved` where it kept them (keeps_out32).
AttentionCall backward_call(const char* op, const Tensor& grad_out, at::TensorList inputs,
                            const Tensor& out, const Tensor& lse2, at::TensorList& saved,
                            const CallPlan& P, at::ArrayRef<double> params, double dropout,
                            int64_t seed) {
  check_inputs(inputs, P, op);
  check_dropout(dropout, op);
  TORCH_CHECK(P.score->backward != nullptr, op, ": the ", P.score_name,
              " score has no backward");
  TORCH_CHECK(P.has_csc, op, ": the forward was called without the CSC layout (colptr, row, "
              "perm, col_items, col_combine), so it cannot be differentiated");
  for (auto [t, name] : {std::make_pair(&out, "out"), std::make_pair(&grad_out, "grad_out")}) {
    check_cuda(*t, name, inputs[0]);
    TORCH_CHECK(t->dim() == 3 && t->size(0) == P.n_dst, op, ": ", name,
                " must be [N_dst, H, C] with N_dst = ", num(P.n_dst), ", got ",
                shape(t->sizes()));
  }
  TORCH_CHECK(grad_out.sizes() == out.sizes() && grad_out.scalar_type() == out.scalar_type(),
              op, ": grad_out must have out's shape and dtype ", shape(out.sizes()), ", got ",
              shape(grad_out.sizes()), " ", grad_out.scalar_type());
  check_cuda(lse2, "lse", inputs[0]);
  TORCH_CHECK(lse2.scalar_type() == at::kFloat && lse2.dim() == 2 && lse2.size(0) == P.n_dst &&
                  lse2.size(1) == out.size(1),
              op, ": lse must be float32 [N_dst, H]");
  AttentionCall call{inputs, P.L, P.p, params, dropout, seed, false};
  P.score->check(call, P.n_dst, P.n_src);
  if (keeps_out32(P) && out.scalar_type() != at::kFloat) {
    const Tensor* o32 = saved.empty() ? nullptr : &saved.back();
    TORCH_CHECK(o32 != nullptr && o32->defined() && o32->scalar_type() == at::kFloat &&
                    o32->sizes() == out.sizes() && o32->is_contiguous() &&
                    o32->device() == out.device(),
                op, ": an fp16 / bf16 ", P.score_name, " backward takes D = dO . O from the "
                "forward's float32 rows, the last entry of saved: a contiguous float32 tensor "
                "of out's shape ", shape(out.sizes()), " (pass saved as the forward returned it)");
    call.out32 = *o32;
    saved = saved.slice(0, saved.size() - 1);
  }
  return call;
}

Tensors attention_bwd(const Tensor& grad_out, at::TensorList inputs, const Tensor& out,
                      const Tensor& lse2, const Tensor& token, at::TensorList saved,
                      at::ArrayRef<double> params, double dropout) {
  const TokenParts t = token_parts(token, kBwd);
  const CallPlan& P = *t.plan;
  const Tensors copies = aligned_copies(inputs);
  if (!copies.empty()) inputs = copies;
  const AttentionCall call =
      backward_call(kBwd, grad_out, inputs, out, lse2, saved, P, params, dropout, t.seed);
  const c10::cuda::CUDAGuard guard(inputs[0].device());
  return P.score->backward(grad_out, out, lse2, saved, call, {});
}

// An output of attention_bwd_into: on the input's device, in its dtype and
// shape, the last dimension contiguous and the others packed above it, rows at
// least one row's elements apart (a column slice of a joined gradient; size-1
// dimensions may have any stride).
void check_into(const Tensor& t, const Tensor& like, size_t i) {
  TORCH_CHECK(t.is_cuda() && t.device() == like.device(), kBwdInto, ": grads[", num((int64_t)i),
              "] must be on the input's device ", like.device(), ", got ", t.device());
  TORCH_CHECK(t.scalar_type() == like.scalar_type() && t.sizes() == like.sizes(), kBwdInto,
              ": grads[", num((int64_t)i), "] must have the dtype and shape of its input ",
              shape(like.sizes()), ", got ", t.scalar_type(), " ", shape(t.sizes()));
  int64_t inner = 1;
  for (int64_t d = t.dim() - 1; d >= 1; --d) {
    TORCH_CHECK(t.size(d) <= 1 || t.stride(d) == inner, kBwdInto, ": grads[", num((int64_t)i),
                "] needs packed rows (the last dimensions contiguous), got strides ",
                shape(t.strides()));
    inner *= t.size(d);
  }
  TORCH_CHECK(t.dim() == 0 || t.size(0) <= 1 || t.stride(0) >= inner, kBwdInto, ": grads[",
              num((int64_t)i), "] rows overlap (stride ", num(t.stride(0)), ")");
}

void attention_bwd_into(at::TensorList grads, const Tensor& grad_out, at::TensorList inputs,
                        const Tensor& out, const Tensor& lse2, const Tensor& token,
                        at::TensorList saved, at::ArrayRef<double> params, double dropout) {
  const TokenParts t = token_parts(token, kBwdInto);
  const CallPlan& P = *t.plan;
  const Tensors copies = aligned_copies(inputs);
  if (!copies.empty()) inputs = copies;
  const AttentionCall call =
      backward_call(kBwdInto, grad_out, inputs, out, lse2, saved, P, params, dropout, t.seed);
  TORCH_CHECK(P.score->writes_into, kBwdInto, ": the ", P.score_name,
              " score's backward allocates its gradients (it does not write into given ones)");
  TORCH_CHECK(grads.size() == inputs.size(), kBwdInto, ": one gradient per input (",
              num((int64_t)inputs.size()), "), got ", num((int64_t)grads.size()));
  for (size_t i = 0; i < grads.size(); ++i) check_into(grads[i], inputs[i], i);
  const c10::cuda::CUDAGuard guard(inputs[0].device());
  P.score->backward(grad_out, out, lse2, saved, call, grads);
}

// ------------------------------------------------------------------- autograd
// Where an input `t` is a view of a whole 2-D output of a JoinedGradients node
// (the GT projections, projections.cpp): that node and the output's first column
// in its joined gradient; column -1 otherwise. Storage offsets, not data
// pointers: traced (fake) tensors have none.
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

struct AttentionBackward final : Node {
  std::vector<torch::autograd::SavedVariable> inputs_;
  torch::autograd::SavedVariable out_;
  Tensor lse2_;
  Tensor token_;
  Tensors saved_;
  // The plan where the call passed it (eager calls); none in a traced call,
  // whose backward finds it in token_ when it runs.
  PlanPtr plan_;
  std::vector<double> params_;
  double dropout_ = 0.0;
  // For inputs that are whole outputs of a JoinedGradients node (scores with
  // writes_into): that node and the input's first column in its joined
  // gradient, where the backward writes the input's gradient; column -1
  // otherwise.
  std::vector<NodePtr> sink_;
  std::vector<int64_t> column_;

  std::string name() const override { return "dfgnn::AttentionBackward"; }

  void release_variables() override {
    std::lock_guard<std::mutex> lock(mutex_);
    for (auto& v : inputs_) v.reset_data();
    out_.reset_data();
    lse2_.reset();
    token_.reset();
    saved_.clear();
  }

  variable_list apply(variable_list&& grads) override {
    std::lock_guard<std::mutex> lock(mutex_);
    variable_list res(inputs_.size());
    if (!grads[0].defined()) return res;  // out unused: nothing flows back
    TORCH_CHECK(!plan_ || plan_->has_csc, "dfgnn::AttentionBackward: the forward was called "
                "without the CSC layout (colptr, row, perm, col_items, col_combine), so it cannot be "
                "differentiated");
    Tensors in;
    in.reserve(inputs_.size());
    for (auto& v : inputs_) in.push_back(v.unpack());
    const Tensor out = out_.unpack(getptr());
    const Tensor grad = grads[0].contiguous();
    // Not under create_graph: attention_bwd_into has no autograd kernel.
    if (!sink_.empty() && !at::GradMode::is_enabled()) {
      const auto col = joined_columns();
      for (int64_t c : col)
        if (c >= 0) return backward_joined(col, grad, in, out);
    }
    static const auto op = find_op<BwdSig>(kBwd);
    Tensors g = call_backward_op(op, grad, at::TensorList(in), out, lse2_, token_,
                                 at::TensorList(saved_), at::ArrayRef<double>(params_), dropout_);
    for (size_t i = 0; i < res.size() && i < g.size(); ++i) res[i] = std::move(g[i]);
    return res;
  }

  // column_ as a writes_into score takes them: the first input at any row
  // stride, the others at one shared stride, so all of them are slices of
  // buffers of one width or none of them is.
  std::vector<int64_t> joined_columns() const {
    std::vector<int64_t> col = column_;
    auto width = [&](size_t i) {
      return static_cast<const JoinedGradients*>(sink_[i].get())->joined_width();
    };
    bool shared = true;
    for (size_t i = 1; i < col.size(); ++i)
      shared = shared && col[i] >= 0 && width(i) == width(1);
    if (!shared)
      for (size_t i = 1; i < col.size(); ++i) col[i] = -1;
    return col;
  }

  // Without create_graph, where some inputs come from a JoinedGradients node:
  // their gradients are written into column slices of that node's joined
  // gradient (one buffer per node, [its rows, its width]), which is offered to
  // it, so that it does not concatenate them again. The slices are the returned
  // gradients: views with rows `width` elements apart.
  variable_list backward_joined(const std::vector<int64_t>& column, const Tensor& grad,
                                const Tensors& in, const Tensor& out) {
    const size_t n = in.size();
    // owner[i]: the first joined input with input i's sink; it allocates that
    // sink's buffer and offers it, once
    std::vector<size_t> owner(n);
    for (size_t i = 0; i < n; ++i) {
      owner[i] = i;
      for (size_t j = 0; j < i; ++j)
        if (column[i] >= 0 && column[j] >= 0 && sink_[j] == sink_[i]) {
          owner[i] = j;
          break;
        }
    }
    Tensors buffers(n);
    variable_list res(n);
    for (size_t i = 0; i < n; ++i) {
      const Tensor& t = in[i];
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
      res[i] = buffers[i].as_strided(t.sizes(), {buffers[i].size(1), t.size(2), 1}, column[i]);
    }
    static const auto op = find_op<BwdIntoSig>(kBwdInto);
    {
      at::AutoDispatchBelowADInplaceOrView below;
      op.call(at::TensorList(res), grad, at::TensorList(in), out, lse2_, token_,
              at::TensorList(saved_), at::ArrayRef<double>(params_), dropout_);
    }
    for (size_t i = 0; i < n; ++i)
      if (column[i] >= 0 && owner[i] == i)
        static_cast<JoinedGradients*>(sink_[i].get())->offer_joined(buffers[i]);
    return res;
  }
};

FwdResult attention_below(at::TensorList inputs, const Tensor& handle, const OptPlan& plan,
                          int64_t key, at::ArrayRef<double> params, double dropout, int64_t seed,
                          bool need_attn) {
  static const auto op = find_op<FwdSig>(kFwd);
  at::AutoDispatchBelowADInplaceOrView below;
  return op.call(inputs, handle, plan, key, params, dropout, seed, need_attn);
}

// The Autograd kernel of attention_fwd: out is differentiable in every input;
// lse2, attn and saved are not.
FwdResult attention_autograd(at::TensorList inputs, const Tensor& handle, const OptPlan& plan,
                             int64_t key, at::ArrayRef<double> params, double dropout,
                             int64_t seed, bool need_attn) {
  // Before the no-node shortcut: a dual tensor need not require a gradient, and
  // its tangent would be dropped silently.
  for (const Tensor& t : inputs)
    TORCH_CHECK(!t.defined() || !t._fw_grad(/*level=*/0).defined(), kFwd,
                ": forward-mode AD (dual tensors) is not supported");
  if (!records_grad(inputs))
    return attention_below(inputs, handle, plan, key, params, dropout, seed, need_attn);
  if (const auto& functorch = at::functorch::functorchTLSAccessor())
    functorch->checkSupportsCppAutogradFunction();  // functorch transforms: not supported
  // The kernel is launched before the node is built: a small graph's step is
  // host-bound, and the node's bookkeeping then runs while the kernel does.
  auto [out, lse2, attn, token, saved] =
      attention_below(inputs, handle, plan, key, params, dropout, seed, need_attn);
  auto node = make_node<AttentionBackward>();
  node->set_next_edges(torch::autograd::collect_next_edges(inputs));
  torch::autograd::set_history(out, NodePtr(node));
  node->inputs_.reserve(inputs.size());
  for (const Tensor& t : inputs) node->inputs_.emplace_back(t, /*is_output=*/false);
  node->out_ = torch::autograd::SavedVariable(out, /*is_output=*/true);
  node->lse2_ = lse2;
  node->token_ = token;
  node->saved_ = saved;
  if (plan.has_value()) node->plan_ = *plan;
  node->params_ = params.vec();
  node->dropout_ = dropout;
  if (node->plan_ && node->plan_->score->writes_into && inputs[0].is_cuda()) {
    const size_t n = inputs.size();
    node->sink_.resize(n);
    node->column_.assign(n, -1);
    bool any = false;
    for (size_t i = 0; i < n; ++i) {
      std::tie(node->sink_[i], node->column_[i]) = joined_target(inputs[i]);
      // one writer per slice: an input passed twice (q is k) gets its own
      // gradient, which the engine adds to the slice's
      for (size_t j = 0; j < i; ++j)
        if (node->column_[j] >= 0 && node->sink_[j] == node->sink_[i] &&
            node->column_[j] == node->column_[i])
          node->column_[i] = -1;
      any = any || node->column_[i] >= 0;
    }
    if (!any) {
      node->sink_.clear();
      node->column_.clear();
    }
  }
  return {out, lse2, attn, token, saved};
}

}  // namespace

// The plan class first: the schemas below name it.
TORCH_LIBRARY_FRAGMENT(dfgnn, m) {
  m.class_<CallPlan>("Plan")
      .def(torch::init<std::string, c10::Dict<std::string, at::Tensor>,
                       c10::Dict<std::string, int64_t>, c10::Dict<std::string, double>>())
      .def("score", [](const PlanPtr& p) { return p->score_name; })
      .def("num_edges", [](const PlanPtr& p) { return p->num_edges; })
      .def("num_dst", [](const PlanPtr& p) { return p->n_dst; })
      .def("num_src", [](const PlanPtr& p) { return p->n_src; })
      .def("has_csc", [](const PlanPtr& p) { return p->has_csc; })
      .def("chunk", [](const PlanPtr& p) { return p->L.chunk; })
      .def("pmf", [](const PlanPtr& p) { return p->p.pmf; })
      .def("normalize_first", [](const PlanPtr& p) { return p->p.normalize_first; })
      // Whether an fp16 / bf16 forward's saved ends with its fp32 rows (the fakes).
      .def("keeps_out32", [](const PlanPtr& p) { return keeps_out32(*p); })
      // A layout tensor by its constructor name (None where the plan has none).
      .def("layout_tensor",
           [](const PlanPtr& p, const std::string& name) -> std::optional<at::Tensor> {
             const LayoutView& L = p->L;
             const std::pair<const char*, const at::Tensor*> fields[] = {
                 {"rowptr", &L.rowptr}, {"col", &L.col}, {"row_items", &L.rw.items},
                 {"row_combine", &L.rw.combine}, {"csr_row", &L.csr_row}, {"tiles", &L.tiles},
                 {"colptr", &L.colptr}, {"row", &L.row}, {"perm", &L.perm},
                 {"col_items", &L.cw.items}, {"col_combine", &L.cw.combine}};
             for (const auto& [n, t] : fields)
               if (name == n) return t->defined() ? std::optional<at::Tensor>(*t) : std::nullopt;
             TORCH_CHECK(false, "dfgnn.Plan: no layout tensor named '", name, "'");
           })
      // FakeTensor tracing (torch.library.opcheck) hands the real object to the
      // fakes, which read its sizes (torch._library.fake_class_registry).
      .def("tracing_mode", [](const PlanPtr&) { return std::string("real"); });
  // cudagraph_unsafe: a CUDA graph that Inductor records (mode="reduce-overhead")
  // would replay the launches of one layout for every later handle.
  // nondeterministic_seeded: a traced forward draws its dropout seed when it runs,
  // so two calls are never merged or recomputed.
  m.def(
      "attention_fwd(Tensor[] inputs, Tensor handle, __torch__.torch.classes.dfgnn.Plan? plan, "
      "int key, float[] params, float dropout, int seed, bool need_attn) "
      "-> (Tensor, Tensor, Tensor, Tensor, Tensor[])",
      {at::Tag::cudagraph_unsafe, at::Tag::nondeterministic_seeded});
  m.def(
      "attention_bwd(Tensor grad_out, Tensor[] inputs, Tensor out, Tensor lse, Tensor token, "
      "Tensor[] saved, float[] params, float dropout) -> Tensor[]",
      {at::Tag::cudagraph_unsafe});
  m.def(
      "attention_bwd_into(Tensor(a!)[] grads, Tensor grad_out, Tensor[] inputs, Tensor out, "
      "Tensor lse, Tensor token, Tensor[] saved, float[] params, float dropout) -> ()",
      {at::Tag::cudagraph_unsafe});
}

TORCH_LIBRARY_IMPL(dfgnn, CUDA, m) {
  m.impl("attention_fwd", &attention_fwd);
  m.impl("attention_bwd", &attention_bwd);
  m.impl("attention_bwd_into", &attention_bwd_into);
}

TORCH_LIBRARY_IMPL(dfgnn, Autograd, m) { m.impl("attention_fwd", &attention_autograd); }

}  // namespace dfgnn
