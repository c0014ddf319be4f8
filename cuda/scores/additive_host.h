// The additive score's host entry points, with and without the per-edge term
// (host/score_ops.h), shared by the two registrations:
//   additive (scores/additive.cpp): inputs (a_dst [N_dst, H], a_src [N_src, H],
//     x [N_src, H, C]); the backward returns (d a_dst, d a_src, dx);
//   additive_edge (scores/additive_edge.cpp): inputs (a_dst, a_src, x, a_edge
//     [E, H] in CSR edge order; GATConv with edge_dim); the backward also
//     returns d a_edge;
// params (negative_slope). Their functors are scores/additive.cuh, their walks
// scores/additive_forward.cu and additive_backward.cu.
#pragma once

#include <tuple>
#include <vector>

#include "host/input_checks.h"
#include "host/params.h"
#include "host/score_ops.h"
#include "host/tensor.h"

namespace dfgnn {

// The walks' entry points (additive_forward.cu, additive_backward.cu): the
// plan's pmf, vector_rows, two_rows, merge_in_kernel (forward) and
// bwd_merge_in_kernel. A defined a_edge [E, H] (CSR order) adds the per-edge
// term (the additive_edge score); the backward then returns its gradient
// fourth: (d a_dst, d a_src, dx [, d a_edge]).
std::tuple<at::Tensor, at::Tensor, at::Tensor> gat_forward_cuda(
    const at::Tensor& a_dst, const at::Tensor& a_src, const at::Tensor& x, const LayoutView& L,
    double negative_slope, double dropout, int64_t seed, bool need_attn,
    const KernelPlan& plan, const at::Tensor& a_edge);

std::vector<at::Tensor> gat_backward_cuda(
    const at::Tensor& grad_out, const at::Tensor& a_dst, const at::Tensor& a_src,
    const at::Tensor& x, const at::Tensor& out, const at::Tensor& lse2, const LayoutView& L,
    double negative_slope, double dropout, int64_t seed, const KernelPlan& plan,
    const at::Tensor& a_edge);

namespace additive_host {

template <bool EDGE> struct Names;
template <> struct Names<false> {
  static constexpr const char* fwd = "dfgnn::attention_fwd (additive)";
  static constexpr const char* bwd = "dfgnn::attention_bwd (additive)";
  static constexpr const char* inputs = "(a_dst, a_src, x)";
};
template <> struct Names<true> {
  static constexpr const char* fwd = "dfgnn::attention_fwd (additive_edge)";
  static constexpr const char* bwd = "dfgnn::attention_bwd (additive_edge)";
  static constexpr const char* inputs = "(a_dst, a_src, x, a_edge)";
};

template <bool EDGE> void check(const AttentionCall& c, int64_t n_dst, int64_t n_src) {
  using N = Names<EDGE>;
  const size_t n_in = EDGE ? 4 : 3;
  TORCH_CHECK(c.inputs.size() == n_in && c.params.size() == 1, N::fwd, ": the score takes "
              "inputs ", N::inputs, " and params (negative_slope), got ", num(c.inputs.size()),
              " inputs and ", num(c.params.size()), " params");
  const at::Tensor &a_dst = c.inputs[0], &a_src = c.inputs[1], &x = c.inputs[2];
  check_x(x);
  check_rows(N::fwd, x, "x", n_src, "N_src");
  std::vector<std::tuple<const at::Tensor*, const char*, int64_t>> terms{
      {&a_dst, "a_dst", n_dst}, {&a_src, "a_src", n_src}};
  if (EDGE) terms.emplace_back(&c.inputs[3], "a_edge", c.L.col.numel());
  for (auto [t, name, n] : terms) {
    check_cuda(*t, name, x);
    TORCH_CHECK(t->scalar_type() == x.scalar_type(), "dfgnn: ", name, " has dtype ",
                t->scalar_type(), " but x has ", x.scalar_type());
    TORCH_CHECK(t->dim() == 2 && t->size(0) == n && t->size(1) == x.size(1), "dfgnn: ", name,
                " must be [", num(n), ", ", num(x.size(1)), "], got ", shape(t->sizes()));
  }
  check_dropout(c.dropout, N::fwd);
}

inline at::Tensor edge_term(const AttentionCall& c) {
  return c.inputs.size() > 3 ? c.inputs[3] : at::Tensor();
}

inline ForwardOut forward(const AttentionCall& c) {
  auto [out, lse2, attn] = gat_forward_cuda(c.inputs[0], c.inputs[1], c.inputs[2], c.L,
                                            c.params[0], c.dropout, c.seed, c.need_attn, c.plan,
                                            edge_term(c));
  return {out, lse2, attn, {}};
}

template <bool EDGE>
std::vector<at::Tensor> backward(const at::Tensor& grad_out, const at::Tensor& out,
                                 const at::Tensor& lse2, at::TensorList, const AttentionCall& c,
                                 at::TensorList) {
  const at::Tensor &a_dst = c.inputs[0], &a_src = c.inputs[1], &x = c.inputs[2];
  check_backward_tensors(Names<EDGE>::bwd, grad_out, out, lse2, x, a_dst.size(0));
  return gat_backward_cuda(grad_out, a_dst, a_src, x, out, lse2, c.L, c.params[0], c.dropout,
                           c.seed, c.plan, edge_term(c));
}

}  // namespace additive_host
}  // namespace dfgnn
