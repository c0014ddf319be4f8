// The token of a forward call: what its backward needs beyond tensors (the
// call's plan and dropout seed), as a tensor, so that compiled code, which saves
// only tensors for a backward, carries it from the forward to the backward.
//
// A token is a CPU int64 tensor [1] holding the seed; its storage owns the
// plan, which keeps the layout view (and with it the graph) alive until the
// backward has run, whoever drops the layout first. Tokens come only from
// make_token; a tensor made otherwise (a copy too) is not one.
//
// resolve_plan: the plan and seed of a forward call that names its plan by the
// layout's handle and a plan key instead of passing it (code that
// torch.compile traces, which cannot build a plan from the layout's integers).
// pyg_dfgnn.ops.calls builds them (python_entry.cpp calls it).
#pragma once
#include <ATen/core/Tensor.h>

#include "glue/call_plan.h"

namespace dfgnn {

at::Tensor make_token(PlanPtr plan, int64_t seed);

struct TokenParts {
  const PlanPtr& plan;
  int64_t seed;
};

// The plan and seed of `token`; raises (naming `op`) for a tensor that is not a token.
TokenParts token_parts(const at::Tensor& token, const char* op);

PlanPtr resolve_plan(const at::Tensor& handle, int64_t key, at::TensorList inputs,
                     double dropout, int64_t* seed);

}  // namespace dfgnn
