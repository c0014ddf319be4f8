// Input checks of the scores' entry points (input_checks.h).
#include "host/input_checks.h"

#include <cstdint>
#include <utility>

#include "host/ops.h"

namespace dfgnn {

std::string num(int64_t v) { return std::to_string(v); }

std::string shape(at::IntArrayRef s) {
  std::string out = "[";
  for (size_t i = 0; i < s.size(); ++i) out += (i ? ", " : "") + std::to_string(s[i]);
  return out + "]";
}

void check_cuda(const at::Tensor& t, const char* name, const at::Tensor& ref) {
  TORCH_CHECK(t.is_cuda(), "dfgnn: ", name, " must be a CUDA tensor, got device ", t.device());
  TORCH_CHECK(t.device() == ref.device(), "dfgnn: ", name, " is on ", t.device(),
              " but the features are on ", ref.device());
  TORCH_CHECK(t.is_contiguous(), "dfgnn: ", name, " must be contiguous (call .contiguous())");
}

void check_features(const at::Tensor& t, const char* name, const at::Tensor& ref,
                    const char* ref_name, int64_t channels) {
  check_cuda(t, name, ref);
  TORCH_CHECK(t.dim() == 3, "dfgnn: ", name, " must be [N, H, C], got shape ", shape(t.sizes()));
  TORCH_CHECK(t.scalar_type() == ref.scalar_type(), "dfgnn: ", name, " has dtype ",
              t.scalar_type(), " but ", ref_name, " has ", ref.scalar_type());
  if (channels < 0) {
    TORCH_CHECK(t.size(1) == ref.size(1) && t.size(2) == ref.size(2), "dfgnn: ", name,
                " must have the heads and channels of ", ref_name, " ",
                shape(ref.sizes().slice(1)), ", got ", shape(t.sizes().slice(1)));
  } else {
    TORCH_CHECK(t.size(1) == ref.size(1) && t.size(2) == channels, "dfgnn: ", name,
                " must be [N_src, H, ", num(channels), "] = [N_src, ", num(ref.size(1)), ", ",
                num(channels), "] (", ref_name, "'s heads), got ", shape(t.sizes()));
  }
}

void check_qkv(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
               int64_t kv_channels) {
  TORCH_CHECK(q.is_cuda(), "dfgnn: q must be a CUDA tensor, got device ", q.device());
  auto st = q.scalar_type();
  TORCH_CHECK(st == at::kFloat || st == at::kHalf || st == at::kBFloat16,
              "dfgnn: q must be float32, float16 or bfloat16, got ", st);
  check_features(q, "q", q);
  check_features(k, "k", q, "q", kv_channels);
  check_features(v, "v", q, "q", kv_channels);
  TORCH_CHECK(k.size(0) == v.size(0), "dfgnn: k and v must have the same number of source "
              "nodes, got ", num(k.size(0)), " and ", num(v.size(0)));
}

void check_x(const at::Tensor& x) {
  TORCH_CHECK(x.is_cuda(), "dfgnn: x must be a CUDA tensor, got device ", x.device());
  auto st = x.scalar_type();
  TORCH_CHECK(st == at::kFloat || st == at::kHalf || st == at::kBFloat16,
              "dfgnn: x must be float32, float16 or bfloat16, got ", st);
  check_cuda(x, "x", x);
  TORCH_CHECK(x.dim() == 3, "dfgnn: x must be [N_src, H, C], got shape ", shape(x.sizes()));
}

void check_head_param(const at::Tensor& t, const char* name, const at::Tensor& q) {
  check_cuda(t, name, q);
  TORCH_CHECK(t.scalar_type() == q.scalar_type(), "dfgnn: ", name, " has dtype ",
              t.scalar_type(), " but q has ", q.scalar_type());
  TORCH_CHECK(t.dim() == 2 && t.size(0) == q.size(1) && t.size(1) == q.size(2), "dfgnn: ", name,
              " must be [H, C] = ", shape(q.sizes().slice(1)), ", got ", shape(t.sizes()));
}

void check_beta(const at::Tensor& beta, const at::Tensor& x) {
  check_cuda(beta, "beta", x);
  TORCH_CHECK(beta.scalar_type() == at::kFloat && beta.numel() == 1,
              "dfgnn: beta must be a float32 tensor with one element, got ", beta.scalar_type(),
              " ", shape(beta.sizes()));
}

void check_dropout(double dropout, const char* op) {
  TORCH_CHECK(dropout >= 0.0 && dropout < 1.0, op, ": dropout must be in [0, 1), got ",
              std::to_string(dropout));
}

void check_rows(const char* op, const at::Tensor& t, const char* name, int64_t n,
                const char* what) {
  TORCH_CHECK(t.size(0) == n, op, ": ", name, " must have the layout's ", what, " = ", num(n),
              " rows, got ", num(t.size(0)));
}

void check_tile_plan(const char* op, const LayoutView& L, const KernelPlan& p,
                     const at::Tensor& q) {
  if (!L.tiles.defined()) {
    TORCH_CHECK(p.dense_cells <= 0.0, op, ": dense_cells > 0 runs the dense tiles of the "
                "layout's tile plan, and the call has none (csr entry 5 is None)");
    return;
  }
  TORCH_CHECK(p.mma, op, ": dense_tiles runs in the tensor-core forward: it needs mma=True");
  TORCH_CHECK(p.dense_cells > 0.0, op, ": dense_cells (window cells per edge of a dense block) "
              "must be > 0 with dense_tiles, got ", std::to_string(p.dense_cells));
  check_cuda(L.tiles, "dense_tiles", q);
  TORCH_CHECK(L.tiles.scalar_type() == at::kInt && L.tiles.dim() == 1, "dfgnn: dense_tiles "
              "must be a 1-D int32 tensor");
  const int64_t n_tiles = (q.size(0) + kTileRows - 1) / kTileRows;
  TORCH_CHECK(L.tiles.numel() >= kTileMetaInts * n_tiles && L.tiles.numel() < INT32_MAX, op,
              ": dense_tiles must hold ", num(kTileMetaInts), " ints per ", num(kTileRows),
              " destination rows (", num(kTileMetaInts * n_tiles), ") and its masks, got ",
              num(L.tiles.numel()));
  TORCH_CHECK(reinterpret_cast<uintptr_t>(L.tiles.data_ptr()) % 16 == 0, op,
              ": dense_tiles must be 16-byte aligned (a tensor of its own, not a view at an "
              "offset)");
}

void check_backward_tensors(const char* op, const at::Tensor& grad_out, const at::Tensor& out,
                            const at::Tensor& lse, const at::Tensor& ref, int64_t n_dst) {
  for (auto [t, name] : {std::make_pair(&out, "out"), std::make_pair(&grad_out, "grad_out")}) {
    check_cuda(*t, name, ref);
    TORCH_CHECK(t->scalar_type() == ref.scalar_type() && t->dim() == 3 &&
                    t->size(0) == n_dst && t->size(1) == ref.size(1) &&
                    t->size(2) == ref.size(2),
                op, ": ", name, " must be [N_dst, H, C] with the features' dtype, got ",
                shape(t->sizes()));
  }
  check_cuda(lse, "lse", ref);
  TORCH_CHECK(lse.scalar_type() == at::kFloat && lse.dim() == 2 && lse.size(0) == n_dst &&
                  lse.size(1) == ref.size(1),
              op, ": lse must be float32 [N_dst, H]");
}

void check_grad_into(const char* op, const at::Tensor& t, const char* name,
                     const at::Tensor& like) {
  TORCH_CHECK(t.is_cuda() && t.device() == like.device(), op, ": ", name,
              " must be on the features' device ", like.device(), ", got ", t.device());
  TORCH_CHECK(t.scalar_type() == like.scalar_type() && t.sizes() == like.sizes(), op, ": ",
              name, " must have the dtype and shape of its feature ", shape(like.sizes()),
              ", got ", t.scalar_type(), " ", shape(t.sizes()));
  const int64_t H = t.size(1), C = t.size(2);
  TORCH_CHECK((C <= 1 || t.stride(2) == 1) && (H <= 1 || t.stride(1) == C) &&
                  (t.size(0) <= 1 || t.stride(0) >= H * C),
              op, ": ", name, " needs rows of H * C elements (C contiguous), got strides ",
              shape(t.strides()));
}

}  // namespace dfgnn
