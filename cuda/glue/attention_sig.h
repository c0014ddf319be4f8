// The C++ signature of dfgnn::attention_fwd: attention.cpp registers its
// kernels with it, and the direct entry (python_entry.cpp) calls the operator
// with it, unboxed.
#pragma once
#include <ATen/core/Tensor.h>

#include <cstdint>
#include <optional>
#include <tuple>
#include <vector>

#include "glue/call_plan.h"

namespace dfgnn {

// (out, lse2, attn, token, saved)
using FwdResult =
    std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, std::vector<at::Tensor>>;
using OptPlan = std::optional<PlanPtr>;
using FwdSig = FwdResult(at::TensorList, const at::Tensor&, const OptPlan&, int64_t,
                         at::ArrayRef<double>, double, int64_t, bool);

}  // namespace dfgnn
