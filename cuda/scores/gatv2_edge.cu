// GATv2's score with edge rows: forward, input checks and registration
// (host/score_ops.h); the score is scores/gatv2_edge.cuh, its backward
// scores/gatv2_edge_backward.cu.
#include "host/forward_launch.cuh"
#include "host/input_checks.h"
#include "scores/gatv2_edge.cuh"

namespace dfgnn {

namespace {

constexpr const char* kFwd = "dfgnn::attention_fwd (gatv2_edge)";

void check(const AttentionCall& c, int64_t n_dst, int64_t n_src) {
  TORCH_CHECK(c.inputs.size() == 4 && c.params.size() == 1, kFwd, ": the gatv2_edge score "
              "takes inputs (q, k, att, e) and params (negative_slope), got ",
              num(c.inputs.size()), " inputs and ", num(c.params.size()), " params");
  const at::Tensor &q = c.inputs[0], &k = c.inputs[1], &att = c.inputs[2], &e = c.inputs[3];
  TORCH_CHECK(q.is_cuda(), "dfgnn: q must be a CUDA tensor, got device ", q.device());
  const auto st = q.scalar_type();
  TORCH_CHECK(st == at::kFloat || st == at::kHalf || st == at::kBFloat16,
              "dfgnn: q must be float32, float16 or bfloat16, got ", st);
  for (auto [t, name] : {std::make_pair(&q, "q"), std::make_pair(&k, "k"),
                         std::make_pair(&e, "e")})
    check_features(*t, name, q);
  check_rows(kFwd, q, "q", n_dst, "N_dst");
  check_rows(kFwd, k, "k", n_src, "N_src");
  check_rows(kFwd, e, "e", c.L.col.numel(), "E");
  check_head_param(att, "att", q);
  check_dropout(c.dropout, kFwd);
}

ForwardOut forward(const AttentionCall& c) {
  const at::Tensor &q = c.inputs[0], &k = c.inputs[1], &att = c.inputs[2], &e = c.inputs[3];
  ForwardCall fc(k, q.size(0), c.L, c.plan.pmf, c.need_attn, c.keep_out32);
  check_vector_rows(kFwd, c.plan.vector_rows,
                    {{"q", &q}, {"k", &k}, {"att", &att}, {"e", &e}, {"out", &fc.out}});
  row_forward<GATv2EdgeScore, /*HAS_PMF=*/false>(kFwd, fc, k, c.L, c.plan, c.dropout, c.seed,
                                                 gatv2_edge_params(c));
  return {fc.out, fc.lse2, fc.attn, {}, fc.out32};
}

}  // namespace

// SMMF and the two-launch CUDA-core backward only (scores/score.cuh, kEdgeRows).
DFGNN_REGISTER_SCORE(gatv2_edge,
                     ScoreOps{"gatv2_edge", &check, &forward, &gatv2_edge_backward, false, false,
                              ScorePaths{/*pmf=*/false, /*mma=*/false, /*dense_tiles=*/false,
                                         /*two_rows=*/false, /*one_launch_backward=*/false},
                              /*keeps_out32=*/true});

}  // namespace dfgnn
