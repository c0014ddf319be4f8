// AGNN's one-call composition (dfgnn::agnn_fwd) and its autograd kernel: the
// normalisation and the SMMF attention in one op call and one autograd node.
#include <torch/csrc/autograd/custom_function.h>
#include <torch/library.h>

#include <tuple>

#include "glue/autograd_common.h"

namespace dfgnn {
namespace {

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

TORCH_LIBRARY_IMPL(dfgnn, Autograd, m) { m.impl("agnn_fwd", &agnn_autograd); }

TORCH_LIBRARY_IMPL(dfgnn, CompositeExplicitAutograd, m) {
  m.impl("agnn_fwd", &agnn_composite);
}

}  // namespace dfgnn
