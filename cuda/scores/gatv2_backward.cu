// GATv2's backward (scores/gatv2.cuh): dq, dk and datt from the CUDA-core walks,
// with D in fp32 for half inputs.
#include "host/backward_launch.cuh"
#include "host/input_checks.h"
#include "scores/gatv2.cuh"

namespace dfgnn {
namespace {

constexpr const char* kBwd = "dfgnn::attention_bwd (gatv2)";

}  // namespace

std::vector<at::Tensor> gatv2_backward(const at::Tensor& grad_out, const at::Tensor& out,
                                       const at::Tensor& lse2, at::TensorList,
                                       const AttentionCall& c, at::TensorList) {
  const at::Tensor &q = c.inputs[0], &k = c.inputs[1], &att = c.inputs[2];
  check_backward_tensors(kBwd, grad_out, out, lse2, q, q.size(0));
  check_vector_rows(kBwd, c.plan.vector_rows, {{"q", &q}, {"k", &k}, {"att", &att},
                                               {"out", &out}, {"grad_out", &grad_out}});
  const BackwardArgs a{kBwd, grad_out, out, lse2, q, k, c.L, c.plan, c.dropout, c.seed};
  const RowGrads r = row_backward_walks<GATv2Score>(a, c.out32, gatv2_params(c));
  return {r.dq, r.dk, r.param.to(att.scalar_type())};
}


}  // namespace dfgnn
