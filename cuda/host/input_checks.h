// The input checks the scores' entry points (cuda/scores/) run before a kernel
// sees the data: bad input raises a RuntimeError that names the argument, never
// a CUDA fault. Messages as the ops have always given them.
#pragma once
#include "host/tensor.h"

#include <string>

#include "host/params.h"

namespace dfgnn {

// Integers and shapes are formatted with std::to_string rather than streamed into
// the TORCH_CHECK message: streaming them segfaulted under torch 2.11.
std::string num(int64_t v);
std::string shape(at::IntArrayRef s);

// On ref's device and contiguous.
void check_cuda(const at::Tensor& t, const char* name, const at::Tensor& ref);
// [N, H, C] with ref's dtype, heads and channels (`ref_name` names ref); channels >= 0:
// that many channels instead of ref's.
void check_features(const at::Tensor& t, const char* name, const at::Tensor& ref,
                    const char* ref_name = "q", int64_t channels = -1);
// The dot score's q, k, v: CUDA, float32 / float16 / bfloat16, [N, H, C] alike,
// k and v of one source count. kv_channels >= 0: k and v are [N_src, H, kv_channels]
// (the tails' score reads keys and values without the tails' channels).
void check_qkv(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
               int64_t kv_channels = -1);
// x [N, H, C], CUDA, float32 / float16 / bfloat16, contiguous.
void check_x(const at::Tensor& x);
// A per-head parameter of the score (GATv2's att): [H, C] of q's heads and
// channels, on q's device, in q's dtype.
void check_head_param(const at::Tensor& t, const char* name, const at::Tensor& q);
// beta: a float32 tensor of one element on x's device.
void check_beta(const at::Tensor& beta, const at::Tensor& x);
void check_dropout(double dropout, const char* op);
// t has n rows (`what`: the layout's count they must match, "N_dst" / "N_src").
void check_rows(const char* op, const at::Tensor& t, const char* name, int64_t n,
                const char* what);
// The tile plan (csr entry 5) runs in the tensor-core forward with a bound;
// n_dst rows.
void check_tile_plan(const char* op, const LayoutView& L, const KernelPlan& p,
                     const at::Tensor& q);
// A backward's grad_out and out [N_dst, H, C] like `ref` (the query rows' heads
// and channels, the features' dtype) and lse [N_dst, H] float32.
void check_backward_tensors(const char* op, const at::Tensor& grad_out, const at::Tensor& out,
                            const at::Tensor& lse, const at::Tensor& ref, int64_t n_dst);
// An output the dot backward writes into: on like's device, its dtype and shape,
// C contiguous and heads C apart, rows at least H * C apart (a column slice of a
// joined gradient; size-1 dimensions may have any stride).
void check_grad_into(const char* op, const at::Tensor& t, const char* name,
                     const at::Tensor& like);

}  // namespace dfgnn
