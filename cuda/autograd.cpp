// Autograd kernels of the fused ops (the Autograd dispatch key of dfgnn::gt_fwd,
// dfgnn::gat_fwd and dfgnn::l2norm_fwd), paper §4.3.
//
// Why C++ and not torch.library.register_autograd: the Python autograd kernel
// runs for every call of the op, also under no_grad, and the backward ran a
// Python function through the engine. On the H100 machine's host that was most
// of a Cora-sized layer's wall time (benchmarks/NOTES.md, "host overhead").
// Here a call with grad costs one C++ Node; the backward never takes the GIL.
//
// The forward and backward call the ops through the dispatcher below autograd,
// so FakeTensor tracing (torch.compile, opcheck) sees dfgnn::*_bwd with their
// register_fake implementations (pyg_dfgnn/ops/_custom.py).
#include <torch/csrc/autograd/custom_function.h>
#include <torch/library.h>

#include <tuple>

namespace dfgnn {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;
using at::Tensor;
using OptTensor = c10::optional<Tensor>;
using Tensor3 = std::tuple<Tensor, Tensor, Tensor>;

// The schema shared by gt_fwd and gat_fwd (three feature tensors first).
using FwdSig = Tensor3(const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                       const Tensor&, const Tensor&, int64_t, const OptTensor&, const OptTensor&,
                       const OptTensor&, const OptTensor&, const OptTensor&, const OptTensor&,
                       int64_t, int64_t, double, double, int64_t, bool, bool);
using BwdSig = Tensor3(const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                       const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                       int64_t, const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                       const Tensor&, int64_t, int64_t, double, double, int64_t);
constexpr size_t kFwdArgs = 21;

template <typename Sig>
c10::TypedOperatorHandle<Sig> find_op(const char* name) {
  return c10::Dispatcher::singleton().findSchemaOrThrow(name, "").typed<Sig>();
}

Tensor value_or_undefined(const OptTensor& t) { return t.has_value() ? *t : Tensor(); }

// One attention op: outputs (out, lse2, attn); out is differentiable, the row
// statistics and the attention weights are not. The backward needs the CSC
// arguments (colptr ... col_combine), which a call without grad may omit.
// Names: kFwd / kBwd are the op names, and the three feature tensors get
// gradients at argument positions 0, 1, 2.
template <const char* kFwd, const char* kBwd>
struct FusedAttention : torch::autograd::Function<FusedAttention<kFwd, kBwd>> {
  static variable_list forward(AutogradContext* ctx, const Tensor& a, const Tensor& b,
                               const Tensor& c, const Tensor& rowptr, const Tensor& col,
                               const Tensor& row_items, const Tensor& row_combine,
                               int64_t row_slots, const OptTensor& csr_row,
                               const OptTensor& colptr, const OptTensor& row,
                               const OptTensor& perm, const OptTensor& col_items,
                               const OptTensor& col_combine, int64_t col_slots, int64_t chunk,
                               double param, double dropout, int64_t seed, bool pmf,
                               bool need_attn) {
    static const auto op = find_op<FwdSig>(kFwd);
    Tensor out, lse2, attn;
    {
      at::AutoDispatchBelowADInplaceOrView below;
      std::tie(out, lse2, attn) =
          op.call(a, b, c, rowptr, col, row_items, row_combine, row_slots, csr_row, colptr, row,
                  perm, col_items, col_combine, col_slots, chunk, param, dropout, seed, pmf,
                  need_attn);
    }
    ctx->save_for_backward({a, b, c, out, lse2, rowptr, col, row_items, row_combine,
                            value_or_undefined(colptr), value_or_undefined(row),
                            value_or_undefined(perm), value_or_undefined(col_items),
                            value_or_undefined(col_combine)});
    ctx->saved_data["row_slots"] = row_slots;
    ctx->saved_data["col_slots"] = col_slots;
    ctx->saved_data["chunk"] = chunk;
    ctx->saved_data["param"] = param;
    ctx->saved_data["dropout"] = dropout;
    ctx->saved_data["seed"] = seed;
    ctx->mark_non_differentiable({lse2, attn});
    ctx->set_materialize_grads(false);
    return {out, lse2, attn};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    variable_list res(kFwdArgs);
    if (!grads[0].defined()) return res;  // out unused: nothing flows back
    static const auto op = find_op<BwdSig>(kBwd);
    const auto s = ctx->get_saved_variables();
    TORCH_CHECK(s[9].defined() && s[10].defined() && s[11].defined() && s[12].defined() &&
                    s[13].defined(),
                kFwd, " was called without the CSC layout (colptr, row, perm, col_items, "
                "col_combine), so it cannot be differentiated");
    const auto& d = ctx->saved_data;
    std::tie(res[0], res[1], res[2]) =
        op.call(grads[0].contiguous(), s[0], s[1], s[2], s[3], s[4], s[5], s[6], s[7], s[8],
                d.at("row_slots").toInt(), s[9], s[10], s[11], s[12], s[13],
                d.at("col_slots").toInt(), d.at("chunk").toInt(), d.at("param").toDouble(),
                d.at("dropout").toDouble(), d.at("seed").toInt());
    return res;
  }
};

constexpr char kGtFwd[] = "dfgnn::gt_fwd";
constexpr char kGtBwd[] = "dfgnn::gt_bwd";
constexpr char kGatFwd[] = "dfgnn::gat_fwd";
constexpr char kGatBwd[] = "dfgnn::gat_bwd";

template <typename F>
Tensor3 attention_autograd(const Tensor& a, const Tensor& b, const Tensor& c,
                           const Tensor& rowptr, const Tensor& col, const Tensor& row_items,
                           const Tensor& row_combine, int64_t row_slots, const OptTensor& csr_row,
                           const OptTensor& colptr, const OptTensor& row, const OptTensor& perm,
                           const OptTensor& col_items, const OptTensor& col_combine,
                           int64_t col_slots, int64_t chunk, double param, double dropout,
                           int64_t seed, bool pmf, bool need_attn) {
  auto o = F::apply(a, b, c, rowptr, col, row_items, row_combine, row_slots, csr_row, colptr, row,
                    perm, col_items, col_combine, col_slots, chunk, param, dropout, seed, pmf,
                    need_attn);
  return {o[0], o[1], o[2]};
}

// AGNN's normalisation: k = x / max(||x||, eps), q = beta k (both differentiable),
// rnorm (not). An unused k or q gets a zero gradient (materialised by autograd).
struct L2Norm : torch::autograd::Function<L2Norm> {
  static variable_list forward(AutogradContext* ctx, const Tensor& x, const Tensor& beta,
                               double eps) {
    static const auto op =
        find_op<Tensor3(const Tensor&, const Tensor&, double)>("dfgnn::l2norm_fwd");
    Tensor k, q, rnorm;
    {
      at::AutoDispatchBelowADInplaceOrView below;
      std::tie(k, q, rnorm) = op.call(x, beta, eps);
    }
    ctx->save_for_backward({k, rnorm, beta});
    ctx->mark_non_differentiable({rnorm});
    return {k, q, rnorm};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    static const auto op =
        find_op<std::tuple<Tensor, Tensor>(const Tensor&, const Tensor&, const Tensor&,
                                           const Tensor&, const Tensor&)>("dfgnn::l2norm_bwd");
    const auto s = ctx->get_saved_variables();
    auto [dx, dbeta_part] = op.call(grads[0].contiguous(), grads[1].contiguous(), s[0], s[1], s[2]);
    return {dx, dbeta_part.sum().reshape(s[2].sizes()), Tensor()};
  }
};

Tensor3 l2norm_autograd(const Tensor& x, const Tensor& beta, double eps) {
  auto o = L2Norm::apply(x, beta, eps);
  return {o[0], o[1], o[2]};
}

}  // namespace

TORCH_LIBRARY_IMPL(dfgnn, Autograd, m) {
  m.impl("gt_fwd", &attention_autograd<FusedAttention<kGtFwd, kGtBwd>>);
  m.impl("gat_fwd", &attention_autograd<FusedAttention<kGatFwd, kGatBwd>>);
  m.impl("l2norm_fwd", &l2norm_autograd);
}

}  // namespace dfgnn
