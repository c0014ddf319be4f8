// The backward of the dot score with edge rows (scores/dot_edge.cuh): dq, dk,
// dv and the edge rows' gradient from the two-launch CUDA-core walks, with D in
// fp32 for half inputs.
#include "host/backward_launch.cuh"
#include "host/input_checks.h"
#include "host/plan_checks.h"
#include "scores/dot_edge.cuh"

namespace dfgnn {
namespace {

constexpr const char* kBwd = "dfgnn::attention_bwd (dot_edge)";

}  // namespace

std::vector<at::Tensor> dot_edge_backward(const at::Tensor& grad_out, const at::Tensor& out,
                                          const at::Tensor& lse2, at::TensorList,
                                          const AttentionCall& c, at::TensorList) {
  const at::Tensor &q = c.inputs[0], &k = c.inputs[1], &v = c.inputs[2], &e = c.inputs[3];
  check_backward_tensors(kBwd, grad_out, out, lse2, q, q.size(0));
  check_vector_rows(kBwd, c.plan.vector_rows, {{"q", &q}, {"k", &k}, {"v", &v}, {"e", &e},
                                               {"out", &out}, {"grad_out", &grad_out}});
  const BackwardArgs a{kBwd, grad_out, out, lse2, q, k, c.L, c.plan, c.dropout, c.seed};
  const RowGrads r = row_backward_walks<DotEdgeScore>(a, c.out32, dot_edge_params(c));
  return {r.dq, r.dk, r.dv, r.de};
}

}  // namespace dfgnn
