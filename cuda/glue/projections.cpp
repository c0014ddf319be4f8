// The query / key / value / skip projections of FusedTransformerConv as one op,
// dfgnn::projections, with a C++ autograd node: a GEMM per projection forward
// (each output contiguous, as the attention kernels read it) and one input plus
// one weight GEMM over the joined output gradients backward (docs/design.md, "GT
// projections").
//
// Why C++: the same node as a Python autograd.Function (pyg_dfgnn/nn/
// _projections.py, Projections, the path without the extension) ran its twenty
// ops of backward as Python on the engine's thread, holding the GIL. Mini-batch
// steps on power-law graphs are host-bound, and that backward was the largest
// single item of their host time (docs/design.md, "The mini-batch step").
//
// The op is CompositeExplicitAutograd (any device); its Autograd kernel casts
// once to autocast's dtype where autocast is on, as F.linear would cast each
// call, and builds the node.
#include <ATen/ATen.h>
#include <ATen/autocast_mode.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <torch/csrc/autograd/functions/basic_ops.h>
#include <torch/library.h>

#include <optional>
#include <string>
#include <vector>

#include "glue/autograd_common.h"

namespace dfgnn {
namespace {

constexpr char kOp[] = "dfgnn::projections";
using OptList = c10::List<std::optional<Tensor>>;

// F.linear(x, w, b) over the first `rows` rows of a 2-D x, zeros below (the GEMM
// writes the output's leading rows in place).
Tensor linear_rows(const Tensor& x, const Tensor& w, const std::optional<Tensor>& b,
                   int64_t rows) {
  Tensor out = at::empty({x.size(0), w.size(0)}, x.options());
  out.narrow(0, rows, x.size(0) - rows).zero_();
  if (rows > 0) {
    Tensor head = out.narrow(0, 0, rows);
    const Tensor xs = x.narrow(0, 0, rows);
    if (b.has_value() && b->defined())
      at::addmm_out(head, *b, xs, w.t());
    else
      at::mm_out(head, xs, w.t());
  }
  return out;
}

// The row prefix a call applies: `rows` for a 2-D x with more rows, else none
// (every row projected).
std::optional<int64_t> effective_rows(const Tensor& x, std::optional<int64_t> rows) {
  if (!rows.has_value()) return std::nullopt;
  TORCH_CHECK_VALUE(*rows >= 0, kOp, ": rows must be >= 0, got ", std::to_string(*rows));
  if (x.dim() != 2 || *rows >= x.size(0)) return std::nullopt;
  return rows;
}

// Numbers enter the messages as std::to_string, not streamed: streaming an
// integer into a TORCH_CHECK message segfaulted in this extension under torch
// 2.11 (host/input_checks.h, num()).
void check_args(const Tensor& x, at::TensorList weights, const OptList& biases) {
  TORCH_CHECK_VALUE(!weights.empty(), kOp, ": needs at least one weight");
  TORCH_CHECK_VALUE(weights.size() == biases.size(), kOp, ": ", std::to_string(weights.size()),
                    " weights but ", std::to_string(biases.size()),
                    " biases (pass None for a missing bias)");
  TORCH_CHECK_VALUE(x.dim() >= 1, kOp, ": x must have at least one dimension");
}

// The outputs for checked arguments and the row prefix effective_rows gave.
std::vector<Tensor> run_projections(const Tensor& x, std::optional<int64_t> rows,
                                    at::TensorList weights, const OptList& biases) {
  std::vector<Tensor> outs;
  outs.reserve(weights.size());
  for (size_t i = 0; i < weights.size(); ++i) {
    const std::optional<Tensor> b = biases.get(i);
    outs.push_back(i == 0 && rows.has_value() ? linear_rows(x, weights[i], b, *rows)
                                              : at::linear(x, weights[i], b));
  }
  return outs;
}

// The CompositeExplicitAutograd kernel: the outputs, below autograd.
std::vector<Tensor> projections_forward(const Tensor& x, std::optional<int64_t> rows,
                                        at::TensorList weights, const OptList& biases) {
  check_args(x, weights, biases);
  return run_projections(x, effective_rows(x, rows), weights, biases);
}

// g.sum(0) of a 2-D g as a GEMV against ones: it reads g at 1.2-2.7x the rate of
// the column reduction on an H100 (nn/_projections.py, _column_sums).
Tensor column_sums(const Tensor& g) {
  if (g.size(0) == 0) return g.sum(0);
  return at::mv(g.t(), at::ones({g.size(0)}, g.options()));
}

// The node of a call with grad. Edges: x, the n weights, the n biases. Saved:
// x in the compute dtype where a weight needs a gradient, the weights in it
// where x does. Its joined gradient: the outputs but a row-cut first one, in
// order (JoinedGradients: the GT attention node writes dq, dk, dv into it).
struct ProjectionsBackward final : JoinedGradients {
  torch::autograd::SavedVariable x_;
  std::vector<torch::autograd::SavedVariable> ws_;
  std::vector<int64_t> sizes_;     // output columns per projection
  std::vector<int64_t> x_shape_;   // x's sizes, for its gradient
  std::vector<at::ScalarType> dtypes_;  // of x, the weights, the biases (the gradients')
  std::optional<int64_t> rows_;
  Tensor offered_;  // offer_joined's buffer, until the next apply

  std::string name() const override { return "dfgnn::ProjectionsBackward"; }

  void release_variables() override {
    std::lock_guard<std::mutex> lock(mutex_);
    x_.reset_data();
    for (auto& w : ws_) w.reset_data();
    offered_.reset();
  }

  // The joined outputs where every output has a gradient: all but a first one
  // cut at rows (gradients() joins the live ones the same way).
  size_t first_joined() const { return rows_.has_value() ? 1 : 0; }

  int64_t joined_column(int64_t nr) const override {
    if (nr < static_cast<int64_t>(first_joined()) || nr >= static_cast<int64_t>(sizes_.size()))
      return -1;
    int64_t column = 0;
    for (int64_t i = static_cast<int64_t>(first_joined()); i < nr; ++i) column += sizes_[i];
    return column;
  }

  int64_t joined_width() const override {
    int64_t width = 0;
    for (size_t i = first_joined(); i < sizes_.size(); ++i) width += sizes_[i];
    return width;
  }

  void offer_joined(Tensor joined) override {
    std::lock_guard<std::mutex> lock(mutex_);
    offered_ = std::move(joined);
  }

  // G from the offered buffer: where the joined projections are the ones
  // joined_column assumed and the buffer has their rows, each gradient that is
  // not already its column slice (the skip's, from the output's addition) is
  // copied into it. Undefined otherwise (the caller concatenates).
  Tensor take_offered(const variable_list& grads, const std::vector<size_t>& joined) {
    Tensor buf = std::move(offered_);
    offered_.reset();
    if (!buf.defined() || joined.size() != sizes_.size() - first_joined() ||
        (!joined.empty() && joined[0] != first_joined()))
      return Tensor();
    std::vector<Tensor> parts;
    for (size_t i : joined) {
      parts.push_back(grads[i].reshape({-1, sizes_[i]}));
      if (parts.back().size(0) != buf.size(0)) return Tensor();
    }
    const auto* base = static_cast<const char*>(buf.data_ptr());
    const int64_t width = buf.size(1), item = buf.element_size();
    int64_t column = 0;
    for (size_t j = 0; j < joined.size(); ++j) {
      const Tensor& part = parts[j];
      const bool in_place = part.data_ptr() == base + column * item &&
                            (part.size(0) <= 1 || part.stride(0) == width) &&
                            (part.size(1) <= 1 || part.stride(1) == 1) &&
                            part.scalar_type() == buf.scalar_type();
      if (!in_place) buf.narrow(1, column, sizes_[joined[j]]).copy_(part);
      column += sizes_[joined[j]];
    }
    return buf;
  }

  variable_list apply(variable_list&& grads) override {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!at::GradMode::is_enabled()) return gradients(grads);
    // create_graph: the gradients are not differentiable (an autocast x has no
    // path back to the input), so, as torch.autograd.function's
    // once_differentiable does, they are computed without grad and a double
    // backward through them raises instead of dropping this node's terms.
    variable_list res;
    {
      at::NoGradGuard no_grad;
      res = gradients(grads);
    }
    for (auto& r : res)
      if (r.defined()) r = r.detach().requires_grad_(true);
    torch::autograd::DelayedError err(
        "dfgnn::ProjectionsBackward is once_differentiable: a double backward through "
        "FusedTransformerConv's joined projections is not supported (fused_projection=False "
        "runs PyG's separate Linear layers)",
        static_cast<int64_t>(res.size()));
    return err.apply(std::move(res));
  }

  // The joined gradient `t` (the joined projections' rows, in order) split into
  // res[base + i] per joined projection i, in its parameter's dtype: one cast
  // where they share one (autocast's bf16 GEMMs over fp32 parameters), not one
  // per projection (each a launch of host time).
  void split_into(const Tensor& t, size_t base, const std::vector<size_t>& joined,
                  const std::vector<int64_t>& sizes, variable_list& res) {
    const at::ScalarType first = dtypes_[base + joined[0]];
    bool same = true;
    for (size_t i : joined) same &= dtypes_[base + i] == first;
    const auto parts = (same ? t.to(first) : t).split_with_sizes(sizes);
    for (size_t j = 0; j < joined.size(); ++j)
      if (task_should_compute_output(base + joined[j]))
        res[base + joined[j]] = same ? parts[j] : parts[j].to(dtypes_[base + joined[j]]);
  }

  // The gradients of x, the weights and the biases.
  variable_list gradients(const variable_list& grads) {
    const size_t n = sizes_.size();
    variable_list res(1 + 2 * n);
    std::vector<size_t> live;
    for (size_t i = 0; i < n; ++i)
      if (grads[i].defined()) live.push_back(i);
    if (live.empty()) return res;
    // A first projection cut at rows stays out of the join: its gradient has
    // rows only in the prefix.
    const bool cut = rows_.has_value() && live[0] == 0;
    const std::vector<size_t> joined(live.begin() + (cut ? 1 : 0), live.end());
    const Tensor x = x_.unpack();
    std::vector<Tensor> ws;
    for (auto& w : ws_) ws.push_back(w.unpack());
    const int64_t rows = rows_.value_or(0);
    const Tensor gq = cut ? grads[0].narrow(0, 0, rows) : Tensor();
    Tensor g = take_offered(grads, joined);  // G [M, sum(out_i)] over the joined projections
    std::vector<int64_t> sizes;
    for (size_t i : joined) sizes.push_back(sizes_[i]);
    if (!g.defined() && !joined.empty()) {
      std::vector<Tensor> parts;
      for (size_t i : joined) parts.push_back(grads[i].reshape({-1, sizes_[i]}));
      g = parts.size() > 1 ? at::cat(parts, -1) : parts[0];
    }
    const int64_t in_features = x_shape_.back();
    if (task_should_compute_output(0)) {
      Tensor gx;
      if (g.defined()) {
        std::vector<Tensor> wj;
        for (size_t i : joined) wj.push_back(ws[i]);
        const Tensor w = wj.size() > 1 ? at::cat(wj) : wj[0];
        gx = g.to(w.scalar_type()).mm(w);
      } else {
        gx = at::zeros({grads[0].size(0), in_features}, ws[0].options());
      }
      if (cut && rows > 0) gx.narrow(0, 0, rows).addmm_(gq.to(ws[0].scalar_type()), ws[0]);
      res[0] = gx.view(x_shape_).to(dtypes_[0]);
    }
    bool any_w = false, any_b = false;
    for (size_t i : joined) {
      any_w |= task_should_compute_output(1 + i);
      any_b |= task_should_compute_output(1 + n + i);
    }
    if (g.defined() && any_w)
      split_into(g.to(x.scalar_type()).t().mm(x.reshape({-1, in_features})), 1, joined, sizes,
                 res);
    if (g.defined() && any_b) split_into(column_sums(g), 1 + n, joined, sizes, res);
    if (cut) {
      if (task_should_compute_output(1)) {
        const Tensor gw0 = rows > 0 ? gq.to(x.scalar_type()).t().mm(x.narrow(0, 0, rows))
                                    : at::zeros({sizes_[0], in_features}, x.options());
        res[1] = gw0.to(dtypes_[1]);
      }
      if (task_should_compute_output(1 + n)) res[1 + n] = column_sums(gq).to(dtypes_[1 + n]);
    }
    return res;
  }
};

// The dtype autocast runs F.linear(x, ...) in, or none where it leaves x's:
// autocast off for x's device type, or x other than float32 / float16 /
// bfloat16 (autocast does not cast float64).
std::optional<at::ScalarType> autocast_dtype(const Tensor& x) {
  const auto st = x.scalar_type();
  if (st != at::kFloat && st != at::kHalf && st != at::kBFloat16) return std::nullopt;
  const auto dev = x.device().type();
  if (!at::autocast::is_autocast_available(dev) || !at::autocast::is_autocast_enabled(dev))
    return std::nullopt;
  return at::autocast::get_autocast_dtype(dev);
}

// The weights and biases in `dtype`, cast by one multi-tensor copy into one
// buffer. Cast one by one they cost an allocation and a launch each, eight per
// GT layer under autocast: on the full GitHub graph the bf16 layer's forward
// took 0.53 ms of host time against 0.29 ms in fp32. Each one starts on a
// 128-byte boundary, as GEMM operands of their own would. Parameters on
// another device than x are cast one by one (the GEMM then reports the
// mismatch).
void cast_parameters(std::vector<Tensor>& ws, OptList& bs, at::ScalarType dtype,
                     const at::Device& device) {
  constexpr int64_t kAlign = 128;
  const int64_t align = kAlign / static_cast<int64_t>(c10::elementSize(dtype));
  std::vector<Tensor*> todo;
  std::vector<Tensor> bias(bs.size());
  for (auto& w : ws) todo.push_back(&w);
  for (size_t i = 0; i < bs.size(); ++i) {
    const std::optional<Tensor> b = bs.get(i);
    if (b.has_value() && b->defined()) {
      bias[i] = *b;
      todo.push_back(&bias[i]);
    }
  }
  int64_t total = 0;
  bool together = true;
  for (const Tensor* t : todo) {
    together &= t->device() == device;
    if (t->scalar_type() != dtype) total += (t->numel() + align - 1) / align * align;
  }
  if (!together) {
    for (Tensor* t : todo) *t = t->to(dtype);
  } else if (total > 0) {
    const Tensor buffer = at::empty({total}, ws[0].options().dtype(dtype));
    std::vector<Tensor> dst, src;
    int64_t offset = 0;
    for (Tensor* t : todo) {
      if (t->scalar_type() == dtype) continue;
      dst.push_back(buffer.narrow(0, offset, t->numel()).view(t->sizes()));
      src.push_back(*t);
      offset += (t->numel() + align - 1) / align * align;
      *t = dst.back();
    }
    at::_foreach_copy_(dst, src);
  }
  for (size_t i = 0; i < bs.size(); ++i)
    if (bias[i].defined()) bs.set(i, bias[i]);
}

std::vector<Tensor> projections_autograd(const Tensor& x, std::optional<int64_t> rows,
                                         at::TensorList weights, const OptList& biases) {
  check_args(x, weights, biases);
  rows = effective_rows(x, rows);
  const size_t n = weights.size();
  // The node's inputs in edge order: x, the weights, the biases (undefined where
  // absent).
  std::vector<Tensor> inputs{x};
  inputs.insert(inputs.end(), weights.begin(), weights.end());
  for (size_t i = 0; i < n; ++i) {
    const std::optional<Tensor> b = biases.get(i);
    inputs.push_back(b.has_value() ? *b : Tensor());
  }
  for (const Tensor& t : inputs)
    TORCH_CHECK(!t.defined() || !t._fw_grad(/*level=*/0).defined(), kOp,
                ": forward-mode AD (dual tensors) is not supported");
  // Cast once here, not per GEMM (autocast would cast x in each F.linear); the
  // casts and GEMMs below record nothing: the node stands for all of them.
  std::vector<Tensor> ws(weights.begin(), weights.end());
  OptList bs = biases.copy();
  Tensor xc = x;
  const auto cast = autocast_dtype(x);
  std::vector<Tensor> outs;
  {
    at::AutoDispatchBelowADInplaceOrView below;
    c10::impl::ExcludeDispatchKeyGuard no_autocast(c10::autocast_dispatch_keyset);
    if (cast.has_value()) {
      xc = x.to(*cast);
      cast_parameters(ws, bs, *cast, x.device());
    }
    outs = run_projections(xc, rows, ws, bs);
  }
  if (!records_grad(inputs)) return outs;
  if (const auto& functorch = at::functorch::functorchTLSAccessor())
    functorch->checkSupportsCppAutogradFunction();  // functorch transforms: not supported

  auto node = make_node<ProjectionsBackward>();
  node->set_next_edges(torch::autograd::collect_next_edges(inputs));
  for (const Tensor& o : outs) torch::autograd::set_history(o, NodePtr(node));
  bool weight_grad = false;
  for (const Tensor& w : weights) weight_grad |= w.requires_grad();
  if (weight_grad) node->x_ = torch::autograd::SavedVariable(xc, /*is_output=*/false);
  if (x.requires_grad())
    for (const Tensor& w : ws) node->ws_.emplace_back(w, /*is_output=*/false);
  for (const Tensor& w : ws) node->sizes_.push_back(w.size(0));
  node->x_shape_ = x.sizes().vec();
  for (const Tensor& t : inputs)
    node->dtypes_.push_back(t.defined() ? t.scalar_type() : x.scalar_type());
  node->rows_ = rows;
  return outs;
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(dfgnn, m) {
  // weights [out_i, F_in], biases [out_i] or None (as many as weights); rows: the
  // first output covers x[:rows] only (2-D x), zeros below.
  m.def("projections(Tensor x, int? rows, Tensor[] weights, Tensor?[] biases) -> Tensor[]");
}

TORCH_LIBRARY_IMPL(dfgnn, CompositeExplicitAutograd, m) {
  m.impl("projections", &projections_forward);
}

TORCH_LIBRARY_IMPL(dfgnn, Autograd, m) { m.impl("projections", &projections_autograd); }

}  // namespace dfgnn
