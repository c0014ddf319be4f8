// Input checks shared by the op entry points and the scores' check functions:
// bad input raises a RuntimeError that names the argument, never a CUDA fault.
#pragma once
#include <ATen/ATen.h>

#include <string>

namespace dfgnn {

// Integers and shapes enter check messages through std::to_string rather than
// being streamed into TORCH_CHECK: streaming them segfaulted under one torch.
inline std::string num(int64_t v) { return std::to_string(v); }

inline std::string shape(at::IntArrayRef s) {
  std::string out = "[";
  for (size_t i = 0; i < s.size(); ++i) out += (i ? ", " : "") + std::to_string(s[i]);
  return out + "]";
}

// A CUDA tensor on `ref`'s device, contiguous.
inline void check_cuda(const at::Tensor& t, const char* name, const at::Tensor& ref) {
  TORCH_CHECK(t.is_cuda(), "dfgnn: ", name, " must be a CUDA tensor, got device ", t.device());
  TORCH_CHECK(t.device() == ref.device(), "dfgnn: ", name, " is on ", t.device(),
              " but the features are on ", ref.device());
  TORCH_CHECK(t.is_contiguous(), "dfgnn: ", name, " must be contiguous (call .contiguous())");
}

inline void check_float_dtype(const at::Tensor& t, const char* name) {
  const auto st = t.scalar_type();
  TORCH_CHECK(st == at::kFloat || st == at::kHalf || st == at::kBFloat16, "dfgnn: ", name,
              " must be float32, float16 or bfloat16, got ", st);
}

// [rows, H, C] features with the dtype, heads and channels of `ref` (named
// `ref_name` in messages); rows < 0: any.
inline void check_features(const at::Tensor& t, const char* name, int64_t rows,
                           const at::Tensor& ref, const char* ref_name) {
  check_cuda(t, name, ref);
  TORCH_CHECK(t.dim() == 3, "dfgnn: ", name, " must be [N, H, C], got shape ", shape(t.sizes()));
  TORCH_CHECK(t.scalar_type() == ref.scalar_type(), "dfgnn: ", name, " has dtype ",
              t.scalar_type(), " but ", ref_name, " has ", ref.scalar_type());
  TORCH_CHECK(t.size(1) == ref.size(1) && t.size(2) == ref.size(2), "dfgnn: ", name,
              " must have the heads and channels of ", ref_name, " ",
              shape(ref.sizes().slice(1)), ", got ", shape(t.sizes().slice(1)));
  TORCH_CHECK(rows < 0 || t.size(0) == rows, "dfgnn: ", name, " must have ", num(rows),
              " rows (the graph's nodes), got ", num(t.size(0)));
}

// [rows, H] per-node terms with `ref`'s dtype and heads.
inline void check_node_terms(const at::Tensor& t, const char* name, int64_t rows,
                             const at::Tensor& ref, const char* ref_name) {
  check_cuda(t, name, ref);
  TORCH_CHECK(t.scalar_type() == ref.scalar_type(), "dfgnn: ", name, " has dtype ",
              t.scalar_type(), " but ", ref_name, " has ", ref.scalar_type());
  TORCH_CHECK(t.dim() == 2 && t.size(0) == rows && t.size(1) == ref.size(1), "dfgnn: ", name,
              " must be [", num(rows), ", ", num(ref.size(1)), "], got ", shape(t.sizes()));
}

inline void check_params(at::ArrayRef<double> params, size_t n, const char* score,
                         const char* names) {
  TORCH_CHECK(params.size() == n, "dfgnn: the ", score, " score takes ", num((int64_t)n),
              " parameter(s) (", names, "), got ", num((int64_t)params.size()));
}

}  // namespace dfgnn
