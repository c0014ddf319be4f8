// The backward of GATv2's score with edge rows (scores/gatv2_edge.cuh): dq, dk,
// datt and the edge rows' gradient from the two-launch CUDA-core walks, with D
// in fp32 for half inputs.
#include "host/backward_launch.cuh"
#include "host/input_checks.h"
#include "scores/gatv2_edge.cuh"

namespace dfgnn {
namespace {

constexpr const char* kBwd = "dfgnn::attention_bwd (gatv2_edge)";

}  // namespace

std::vector<at::Tensor> gatv2_edge_backward(const at::Tensor& grad_out, const at::Tensor& out,
                                            const at::Tensor& lse2, at::TensorList,
                                            const AttentionCall& c, at::TensorList) {
  const at::Tensor &q = c.inputs[0], &k = c.inputs[1], &att = c.inputs[2], &e = c.inputs[3];
  check_backward_tensors(kBwd, grad_out, out, lse2, q, q.size(0));
  check_vector_rows(kBwd, c.plan.vector_rows, {{"q", &q}, {"k", &k}, {"att", &att}, {"e", &e},
                                               {"out", &out}, {"grad_out", &grad_out}});
  const BackwardArgs a{kBwd, grad_out, out, lse2, q, k, c.L, c.plan, c.dropout, c.seed};
  const RowGrads r = row_backward_walks<GATv2EdgeScore>(a, c.out32, gatv2_edge_params(c));
  return {r.dq, r.dk, r.param.to(att.scalar_type()), r.de};
}

}  // namespace dfgnn
