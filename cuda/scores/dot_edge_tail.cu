// The dot score with tail edge rows: forward, input checks and registration
// (host/score_ops.h); the score is scores/dot_edge_tail.cuh, its backward
// scores/dot_edge_tail_backward.cu.
#include "host/forward_launch.cuh"
#include "host/input_checks.h"
#include "host/plan_checks.h"
#include "scores/dot_edge_tail.cuh"

namespace dfgnn {

namespace {

constexpr const char* kFwd = "dfgnn::attention_fwd (dot_edge_tail)";

void check(const AttentionCall& c, int64_t n_dst, int64_t n_src) {
  TORCH_CHECK(c.inputs.size() == 4 && c.params.size() == 1, kFwd, ": the dot_edge_tail score "
              "takes inputs (q, k, v, a) and params (scale), got ", num(c.inputs.size()),
              " inputs and ", num(c.params.size()), " params");
  const at::Tensor &q = c.inputs[0], &k = c.inputs[1], &v = c.inputs[2], &a = c.inputs[3];
  TORCH_CHECK(a.dim() == 2 && a.size(1) >= 1 && (q.dim() != 3 || a.size(1) < q.size(2)),
              kFwd, ": a must be [E, D] with 1 <= D < C, got ", shape(a.sizes()),
              " (q: ", shape(q.sizes()), ")");
  // Keys and values are the rows without the tails: C - D channels per head.
  check_qkv(q, k, v, q.dim() == 3 ? q.size(2) - a.size(1) : 0);
  check_cuda(a, "a", q);
  TORCH_CHECK(a.scalar_type() == q.scalar_type(), kFwd, ": a has dtype ", a.scalar_type(),
              " but q has ", q.scalar_type());
  check_rows(kFwd, q, "q", n_dst, "N_dst");
  check_rows(kFwd, k, "k", n_src, "N_src");
  // The tails are whole 16-byte vectors of the rows where the rows are read so.
  const int64_t vec = c.plan.vector_rows ? 16 / (int64_t)a.element_size() : 1;
  TORCH_CHECK(a.size(1) % vec == 0, kFwd, ": with vector rows the tails' width D = ",
              num(a.size(1)), " must be a multiple of ", num(vec));
  check_rows(kFwd, a, "a", c.L.col.numel(), "E");
  check_dropout(c.dropout, kFwd);
}

ForwardOut forward(const AttentionCall& c) {
  const at::Tensor &q = c.inputs[0], &k = c.inputs[1], &v = c.inputs[2], &a = c.inputs[3];
  // The output has q's C channels per head (its last D the weighted sums of the
  // tails), where k and v have C - D.
  ForwardCall fc(q, q.size(0), c.L, c.plan.pmf, c.need_attn, c.keep_out32);
  check_vector_rows(kFwd, c.plan.vector_rows,
                    {{"q", &q}, {"k", &k}, {"v", &v}, {"a", &a}, {"out", &fc.out}});
  row_forward<DotEdgeTailScore, /*HAS_PMF=*/false>(kFwd, fc, q, c.L, c.plan, c.dropout, c.seed,
                                                   dot_edge_tail_params(c));
  return {fc.out, fc.lse2, fc.attn, {}, fc.out32};
}

}  // namespace

// SMMF and the two-launch CUDA-core backward only, as the dot_edge score.
DFGNN_REGISTER_SCORE(dot_edge_tail,
                     ScoreOps{"dot_edge_tail", &check, &forward, &dot_edge_tail_backward, false,
                              false,
                              ScorePaths{/*pmf=*/false, /*mma=*/false, /*dense_tiles=*/false,
                                         /*two_rows=*/false, /*one_launch_backward=*/false},
                              /*keeps_out32=*/true});

}  // namespace dfgnn
