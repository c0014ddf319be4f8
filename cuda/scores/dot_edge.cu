// The dot score with edge rows: forward, input checks and registration
// (host/score_ops.h); the score is scores/dot_edge.cuh, its backward
// scores/dot_edge_backward.cu.
#include "host/forward_launch.cuh"
#include "host/input_checks.h"
#include "host/plan_checks.h"
#include "scores/dot_edge.cuh"

namespace dfgnn {

namespace {

constexpr const char* kFwd = "dfgnn::attention_fwd (dot_edge)";

void check(const AttentionCall& c, int64_t n_dst, int64_t n_src) {
  TORCH_CHECK(c.inputs.size() == 4 && c.params.size() == 1, kFwd, ": the dot_edge score takes "
              "inputs (q, k, v, e) and params (scale), got ", num(c.inputs.size()),
              " inputs and ", num(c.params.size()), " params");
  const at::Tensor &q = c.inputs[0], &k = c.inputs[1], &v = c.inputs[2], &e = c.inputs[3];
  check_qkv(q, k, v);
  check_rows(kFwd, q, "q", n_dst, "N_dst");
  check_rows(kFwd, k, "k", n_src, "N_src");
  check_features(e, "e", q);
  check_rows(kFwd, e, "e", c.L.col.numel(), "E");
  check_dropout(c.dropout, kFwd);
}

ForwardOut forward(const AttentionCall& c) {
  const at::Tensor &q = c.inputs[0], &k = c.inputs[1], &v = c.inputs[2], &e = c.inputs[3];
  ForwardCall fc(v, q.size(0), c.L, c.plan.pmf, c.need_attn, c.keep_out32);
  check_vector_rows(kFwd, c.plan.vector_rows,
                    {{"q", &q}, {"k", &k}, {"v", &v}, {"e", &e}, {"out", &fc.out}});
  row_forward<DotEdgeScore, /*HAS_PMF=*/false>(kFwd, fc, v, c.L, c.plan, c.dropout, c.seed,
                                               dot_edge_params(c));
  return {fc.out, fc.lse2, fc.attn, {}, fc.out32};
}

}  // namespace

// SMMF and the two-launch CUDA-core backward only (scores/score.cuh, kEdgeRows).
DFGNN_REGISTER_SCORE(dot_edge,
                     ScoreOps{"dot_edge", &check, &forward, &dot_edge_backward, false, false,
                              ScorePaths{/*pmf=*/false, /*mma=*/false, /*dense_tiles=*/false,
                                         /*two_rows=*/false, /*one_launch_backward=*/false},
                              /*keeps_out32=*/true});

}  // namespace dfgnn
