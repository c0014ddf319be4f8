// The backward of the dot score with tail edge rows (scores/dot_edge_tail.cuh):
// dq, dk, dv and the tails' gradient from the two-launch CUDA-core walks (D in
// fp32 for half inputs); the dq walk writes it per head, [E, H, D], and a_ij
// feeds every head, so its gradient is their sum.
#include "host/backward_launch.cuh"
#include "host/input_checks.h"
#include "host/plan_checks.h"
#include "scores/dot_edge_tail.cuh"

namespace dfgnn {
namespace {

constexpr const char* kBwd = "dfgnn::attention_bwd (dot_edge_tail)";

}  // namespace

std::vector<at::Tensor> dot_edge_tail_backward(const at::Tensor& grad_out, const at::Tensor& out,
                                               const at::Tensor& lse2, at::TensorList,
                                               const AttentionCall& c, at::TensorList) {
  const at::Tensor &q = c.inputs[0], &k = c.inputs[1], &v = c.inputs[2], &a = c.inputs[3];
  check_backward_tensors(kBwd, grad_out, out, lse2, q, q.size(0));
  check_vector_rows(kBwd, c.plan.vector_rows, {{"q", &q}, {"k", &k}, {"v", &v}, {"a", &a},
                                               {"out", &out}, {"grad_out", &grad_out}});
  const BackwardArgs b{kBwd, grad_out, out, lse2, q, k, c.L, c.plan, c.dropout, c.seed};
  const RowGrads r = row_backward_walks<DotEdgeTailScore>(b, c.out32, dot_edge_tail_params(c));
  return {r.dq, r.dk, r.dv, r.de.size(1) == 1 ? r.de.squeeze(1) : r.de.sum(1)};
}

}  // namespace dfgnn
