// The outputs and scratch of one attention forward call and its split-row
// finish, shared by the forwards of every score.
#pragma once
#include "host/tensor.h"
#include "host/params.h"
#include "host/scratch.h"

namespace dfgnn {

// Outputs and scratch of one forward call, SMMF or PMF (forward_call.cpp):
// out [N_dst, H, C] (dtype of x), lse2 [N_dst, H] and attn [E, H] (or [0]);
// out32 [N_dst, H, C] float32, the rows before their rounding to x's dtype,
// where the call keeps them (keep_out32 with fp16 / bf16 x; undefined
// otherwise): a half-precision backward takes D = dO . O from them
// (host/backward_launch.cuh);
// scratch: the split rows' partial rows [slots, H, C] (merged in the kernel
// when `counters` is set), SMMF's partial (max, sum) [slots, H, 2] and PMF's
// base-2 scores [E, H].
struct ForwardCall {
  bool pmf, need_attn;
  at::Tensor out, lse2, attn;  // lse2 holds small scratch after its elements
  at::Tensor out32;
  Scratch scratch;
  int* counters = nullptr;  // set by merge_in_kernel (SMMF kernels that merge split rows)
  ForwardCall(const at::Tensor& x, int64_t n_dst, const LayoutView& L, bool pmf,
              bool need_attn, bool keep_out32 = false);
  // The SMMF kernel merges the split rows itself where the plan says so
  // (forward_split_counters, split_merge.h); call before its launch.
  void merge_in_kernel(const char* op, const KernelPlan& plan, const LayoutView& L);
  float* attn_ptr() { return need_attn ? attn.data_ptr<float>() : nullptr; }
  float* out32_ptr() const { return out32.defined() ? out32.data_ptr<float>() : nullptr; }
  float* partial() const { return scratch[0]; }
  float* partial_ml() const { return scratch[1]; }
  float* score() const { return scratch[2]; }
  // After the score / SMMF kernel: PMF runs softmax_spmm over `score` and rows
  // x; SMMF merges the split rows' partials unless the kernel did.
  void finish(const at::Tensor& x, const LayoutView& L, const KernelPlan& plan, double dropout,
              int64_t seed);
};

}  // namespace dfgnn
