// A score function's host entry points, as the generic attention ops see them
// (glue/attention.cpp: dfgnn::attention_fwd / attention_bwd). Each score's own
// files (cuda/scores/<name>.cuh, the functor; <name>.cu or .cpp, the host entry
// points) register one ScoreOps under the name its Python spec uses
// (pyg_dfgnn/ops/scores/<name>.py); the ops find it through the call's plan, so
// adding a score touches no shared file.
#pragma once
#include "host/tensor.h"

#include <string>
#include <vector>

#include "host/params.h"

namespace dfgnn {

// One call of a fused attention op: the score's inputs in its spec's order,
// the layout and the plan's decisions, the score's scalar parameters, and what
// every score shares (attention dropout, its seed, returned weights).
// keep_out32 (forward): a backward follows and the score keeps_out32, so an
// fp16 / bf16 forward returns its rows in fp32 too (ForwardOut::out32); out32
// (backward): those rows, where the forward returned them.
struct AttentionCall {
  at::TensorList inputs;
  const LayoutView& L;
  const KernelPlan& plan;
  at::ArrayRef<double> params;
  double dropout = 0.0;
  int64_t seed = 0;
  bool need_attn = false;
  bool keep_out32 = false;
  at::Tensor out32;
};

// A forward's results: out [N_dst, H, C], lse2 [N_dst, H] (float32, base 2),
// attn [E, H] (float32, CSR order; [0] unless need_attn) and the tensors the
// score's backward needs beyond its inputs, out and lse2 (may be empty);
// out32 [N_dst, H, C] float32, out before its rounding, where the call's
// keep_out32 and fp16 / bf16 inputs ask for it (undefined otherwise).
struct ForwardOut {
  at::Tensor out, lse2, attn;
  std::vector<at::Tensor> saved;
  at::Tensor out32;
};

// `into`: tensors the backward writes the gradients of its inputs into, one per
// input (undefined: allocate it), or empty; only scores with writes_into take it.
using ScoreForward = ForwardOut (*)(const AttentionCall& call);
using ScoreBackward = std::vector<at::Tensor> (*)(const at::Tensor& grad_out, const at::Tensor& out,
                                                  const at::Tensor& lse2,
                                                  at::TensorList saved, const AttentionCall& call,
                                                  at::TensorList into);
// Raises (TORCH_CHECK) on inputs the score cannot take: shapes, dtypes, the
// number of parameters, against the layout's sizes.
using ScoreCheck = void (*)(const AttentionCall& call, int64_t n_dst, int64_t n_src);

// The kernel paths a score has, as its Python spec declares them (ScoreSpec's
// pmf, mma, dense_tiles, two_rows, one_launch_backward; tests/test_structure.py
// holds the two to each other): a plan object that asks a score for a path it
// lacks raises when it is built (glue/call_plan.cpp), so no score's own file
// checks the plan's flags of other scores. mma covers mma_backward.
struct ScorePaths {
  bool pmf = true;                  // the edge-parallel SDDMM + softmax_spmm forward
  bool mma = false;                 // the tensor-core forward and backward walks
  bool dense_tiles = false;         // the dense-tile forward
  bool two_rows = true;             // the fp32 two-rows-per-warp SMMF shapes
  bool one_launch_backward = true;  // both backward walks in one launch
  bool row_walk = false;            // a second SMMF forward on the shared row walk (additive)
};

struct ScoreOps {
  const char* name = nullptr;  // the spec's name (pyg_dfgnn/ops/scores)
  ScoreCheck check = nullptr;
  ScoreForward forward = nullptr;
  ScoreBackward backward = nullptr;
  bool writes_into = false;    // the backward takes `into`
  bool normalizes = false;     // the plan's normalize_first may be set (ScoreSpec.normalize_first)
  ScorePaths paths = {};
  // Its fp16 / bf16 backward takes D = dO . O from the forward's fp32 rows,
  // which the forward keeps where a backward follows (ScoreSpec.keeps_out32;
  // the additive scores compute D in their own backward walk).
  bool keeps_out32 = false;
};

// The registered score of `name`; raises for an unknown one.
const ScoreOps& find_score(const std::string& name);

// Registers a score at load time (a static object in the score's file):
//   DFGNN_REGISTER_SCORE(gatv2, ScoreOps{"gatv2", &check, &forward, &backward});
struct ScoreRegistrar {
  explicit ScoreRegistrar(const ScoreOps& ops);
};

#define DFGNN_REGISTER_SCORE(ID, ...) \
  static const ::dfgnn::ScoreRegistrar dfgnn_score_registrar_##ID{__VA_ARGS__}

}  // namespace dfgnn
