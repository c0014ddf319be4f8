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
using CosFwdSig = Tensor4(const Tensor&, const Tensor&, double, const CsrList&, at::IntArrayRef,
                          bool, at::IntArrayRef);

// One agnn_fwd call's arguments after x, beta and eps; refers to the caller's
// arguments, for the call. AGNNAttention::apply takes it as one non-tensor
// argument next to the differentiable tensors: apply's host cost grows with its
// number of tensor arguments (an input VariableInfo, an edge and a saved
// variable each), and with the nine layout tensors as arguments building the
// node took about half of a Cora-sized forward's host time.
struct AgnnCall {
  const CsrList& csr;
  const OptTensorList& csc;
  at::IntArrayRef sizes;
  bool need_attn;
  at::IntArrayRef plan;
};

// k, q (undefined on the fp32 cos_fwd path), rnorm, then (out, lse2, attn) of the
// attention; no dropout, SMMF.
std::tuple<Tensor, Tensor, Tensor, Tensor, Tensor, Tensor> agnn_forward(const Tensor& x,
                                                                        const Tensor& beta,
                                                                        double eps,
                                                                        const AgnnCall& a) {
  static const auto l2 = find_op<L2FwdSig>("dfgnn::l2norm_fwd");
  static const auto gt = find_op<GtFwdSig>(kGtFwd);
  static const auto cos = find_op<CosFwdSig>("dfgnn::cos_fwd");
  TORCH_CHECK(!plan_flag(a.plan, kPlanPmf), "dfgnn::agnn_fwd: runs SMMF only (plan's pmf must "
              "be 0; PMF AGNN is l2norm_fwd then gt_fwd)");
  if (x.scalar_type() == at::kFloat) {
    auto [out, lse2, attn, rnorm] = cos.call(x, beta, eps, a.csr, a.sizes, a.need_attn, a.plan);
    return {Tensor(), Tensor(), rnorm, out, lse2, attn};
  }
  auto [k, q, rnorm] = l2.call(x, beta, eps);
  auto [out, lse2, attn] = gt.call(q, k, x, a.csr, a.csc, a.sizes, 1.0, 0.0, 0, a.need_attn,
                                   a.plan, 0.0);
  return {k, q, rnorm, out, lse2, attn};
}

// Below autograd (and for FakeTensor tracing): the two ops, outputs (out, attn).
Tensor2 agnn_composite(const Tensor& x, const Tensor& beta, double eps, const CsrList& csr,
                       const OptTensorList& csc, at::IntArrayRef sizes, bool need_attn,
                       at::IntArrayRef plan) {
  auto r = agnn_forward(x, beta, eps, AgnnCall{csr, csc, sizes, need_attn, plan});
  return {std::get<3>(r), std::get<5>(r)};
}

struct AGNNAttention : torch::autograd::Function<AGNNAttention> {
  static variable_list forward(AutogradContext* ctx, const Tensor& x, const Tensor& beta,
                               double eps, const AgnnCall& a) {
    Tensor k, q, rnorm, out, lse2, attn;
    {
      at::AutoDispatchBelowADInplaceOrView below;
      std::tie(k, q, rnorm, out, lse2, attn) = agnn_forward(x, beta, eps, a);
    }
    ctx->save_for_backward({x, beta, out});
    // The layout and the tensors that carry no gradient go to saved_data, not to
    // saved variables (KeptLayout says why).
    auto& d = ctx->saved_data;
    d["csr"] = a.csr;
    d["csc"] = a.csc.has_value() ? a.csc->vec() : std::vector<Tensor>();
    d["sizes"] = a.sizes.vec();
    d["extra"] = std::vector<Tensor>{k, q, rnorm, lse2};
    d["eps"] = eps;
    d["bwd_one_launch"] = plan_flag(a.plan, kPlanBwdOneLaunch);
    d["bwd_mma"] = plan_flag(a.plan, kPlanMmaBwd);
    ctx->set_materialize_grads(false);
    ctx->mark_non_differentiable({attn});
    return {out, attn};
  }

  // dx = (normalisation backward of dk, dq) + dv, since x is both v and the
  // normalised k / q; dbeta from the normalisation's per-row terms.
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    variable_list res(4);  // x, beta, eps, the call's other arguments
    if (!grads[0].defined()) return res;
    static const auto gt_bwd = find_op<GtBwdSig>(kGtBwd);
    static const auto l2 = find_op<L2FwdSig>("dfgnn::l2norm_fwd");
    static const auto l2_bwd = find_op<L2BwdSig>("dfgnn::l2norm_bwd");
    const auto s = ctx->get_saved_variables();  // x, beta, out
    const auto& d = ctx->saved_data;
    KeptLayout L;
    L.csr = d.at("csr").toOptionalTensorList();
    L.csc = d.at("csc").toTensorVector();
    L.sizes = d.at("sizes").toIntVector();
    const std::vector<Tensor> extra = d.at("extra").toTensorVector();  // k, q, rnorm, lse2
    Tensor k = extra[0], q = extra[1];
    if (!k.defined())  // the fp32 forward (cos_fwd) did not build k and q
      std::tie(k, q, std::ignore) = call_backward_op(l2, s[0], s[1], d.at("eps").toDouble());
    auto [dq, dk, dv] = L.backward("dfgnn::agnn_fwd", gt_bwd, grads[0].contiguous(), q, k, s[0],
                                   s[2], extra[3], 1.0, 0.0, 0, d.at("bwd_one_launch").toBool(),
                                   d.at("bwd_mma").toBool());
    auto [dxn, dbeta_part] = call_backward_op(l2_bwd, dk, dq, k, extra[2], s[1]);
    res[0] = dxn.add(dv);
    res[1] = dbeta_part.sum().reshape(s[1].sizes());
    return res;
  }
};

Tensor2 agnn_autograd(const Tensor& x, const Tensor& beta, double eps, const CsrList& csr,
                      const OptTensorList& csc, at::IntArrayRef sizes, bool need_attn,
                      at::IntArrayRef plan) {
  if (!records_grad({x, beta})) {
    at::AutoDispatchBelowADInplaceOrView below;
    return agnn_composite(x, beta, eps, csr, csc, sizes, need_attn, plan);
  }
  auto o = AGNNAttention::apply(x, beta, eps, AgnnCall{csr, csc, sizes, need_attn, plan});
  return {o[0], o[1]};
}

}  // namespace

TORCH_LIBRARY_IMPL(dfgnn, Autograd, m) { m.impl("agnn_fwd", &agnn_autograd); }

TORCH_LIBRARY_IMPL(dfgnn, CompositeExplicitAutograd, m) {
  m.impl("agnn_fwd", &agnn_composite);
}

}  // namespace dfgnn
