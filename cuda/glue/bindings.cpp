// Operator schemas (TORCH_LIBRARY(dfgnn)) and the input checks every CUDA entry
// point runs before a kernel sees the data: bad input raises a RuntimeError that
// names the argument, never a CUDA fault. The fake (meta) implementations are
// registered from Python (pyg_dfgnn/ops/_custom.py), autograd in autograd.cpp.
#include <Python.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/library.h>

#include <string>

#include "host/ops.h"

namespace dfgnn {
namespace {

// Integers and shapes are formatted with std::to_string rather than streamed into
// the TORCH_CHECK message: streaming them segfaulted under torch 2.11.
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

void check_index(const at::Tensor& t, const char* name, int64_t numel, const at::Tensor& ref) {
  check_cuda(t, name, ref);
  TORCH_CHECK(t.scalar_type() == at::kInt, "dfgnn: ", name, " must be int32, got ",
              t.scalar_type());
  TORCH_CHECK(t.dim() == 1, "dfgnn: ", name, " must be 1-D, got shape ", shape(t.sizes()));
  TORCH_CHECK(numel < 0 || t.numel() == numel, "dfgnn: ", name, " must have ", num(numel),
              " entries, got ", num(t.numel()));
}

// `ref` (named `ref_name` in messages) sets the dtype, heads and channels.
void check_features(const at::Tensor& t, const char* name, const at::Tensor& ref,
                    const char* ref_name = "q") {
  check_cuda(t, name, ref);
  TORCH_CHECK(t.dim() == 3, "dfgnn: ", name, " must be [N, H, C], got shape ", shape(t.sizes()));
  TORCH_CHECK(t.scalar_type() == ref.scalar_type(), "dfgnn: ", name, " has dtype ",
              t.scalar_type(), " but ", ref_name, " has ", ref.scalar_type());
  TORCH_CHECK(t.size(1) == ref.size(1) && t.size(2) == ref.size(2), "dfgnn: ", name,
              " must have the heads and channels of ", ref_name, " ",
              shape(ref.sizes().slice(1)), ", got ", shape(t.sizes().slice(1)));
}

void check_qkv(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
               const at::Tensor& rowptr, const at::Tensor& col) {
  TORCH_CHECK(q.is_cuda(), "dfgnn: q must be a CUDA tensor, got device ", q.device());
  auto st = q.scalar_type();
  TORCH_CHECK(st == at::kFloat || st == at::kHalf || st == at::kBFloat16,
              "dfgnn: q must be float32, float16 or bfloat16, got ", st);
  check_features(q, "q", q);
  check_features(k, "k", q);
  check_features(v, "v", q);
  TORCH_CHECK(k.size(0) == v.size(0), "dfgnn: k and v must have the same number of source "
              "nodes, got ", num(k.size(0)), " and ", num(v.size(0)));
  check_index(rowptr, "rowptr", q.size(0) + 1, q);
  check_index(col, "col", -1, q);
  TORCH_CHECK(q.size(0) < INT32_MAX && k.size(0) < INT32_MAX && col.numel() < INT32_MAX,
              "dfgnn: graphs with more than 2^31 - 1 nodes or edges need int64 kernels");
}

at::Tensor csr_rowptr(const at::Tensor& index, int64_t num_rows) {
  TORCH_CHECK(index.is_cuda(), "dfgnn::csr_rowptr: index must be a CUDA tensor");
  TORCH_CHECK(index.dim() == 1 && index.is_contiguous(),
              "dfgnn::csr_rowptr: index must be a contiguous 1-D tensor");
  TORCH_CHECK(index.scalar_type() == at::kInt || index.scalar_type() == at::kLong,
              "dfgnn::csr_rowptr: index must be int32 or int64, got ", index.scalar_type());
  TORCH_CHECK(num_rows >= 0 && num_rows < INT32_MAX && index.numel() < INT32_MAX,
              "dfgnn::csr_rowptr: sizes must fit int32");
  const c10::cuda::CUDAGuard guard(index.device());  // the inputs' device and its stream
  return csr_rowptr_cuda(index, num_rows);
}

Work make_work(const at::Tensor& items, const at::Tensor& combine, int64_t num_slots,
               const char* what, const at::Tensor& ref) {
  check_cuda(items, what, ref);
  check_cuda(combine, what, ref);
  TORCH_CHECK(items.scalar_type() == at::kInt && items.dim() == 2 && items.size(1) == 3,
              "dfgnn: ", what, " items must be an int32 [I, 3] tensor (row, start, slot), got ",
              items.scalar_type(), " ", shape(items.sizes()));
  TORCH_CHECK(combine.scalar_type() == at::kInt && combine.dim() == 2 && combine.size(1) == 3,
              "dfgnn: ", what, " combine must be an int32 [R, 3] tensor (row, first slot, n), got ",
              combine.scalar_type(), " ", shape(combine.sizes()));
  TORCH_CHECK(num_slots >= 0, "dfgnn: ", what, " num_slots must be >= 0");
  return Work{items, combine, num_slots};
}

// The plan's decisions (pyg_dfgnn/ops/plan.py) arrive as arguments; one the call
// cannot run raises here, before anything is launched. Two rows per warp compile
// the split-row merge out of the SMMF forward, so they need a call without
// split rows.
void check_two_rows(bool two_rows, bool pmf, const Work& rw, const char* op) {
  TORCH_CHECK(!two_rows || (!pmf && rw.num_slots == 0), op, ": two_rows=True needs SMMF "
              "(pmf=False) and no split rows (row_slots == 0), got pmf=", pmf ? "True" : "False",
              ", row_slots=", num(rw.num_slots));
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> gt_fwd(
    const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& rowptr,
    const at::Tensor& col, const at::Tensor& row_items, const at::Tensor& row_combine,
    int64_t row_slots, const c10::optional<at::Tensor>& csr_row,
    const c10::optional<at::Tensor>& /*colptr*/, const c10::optional<at::Tensor>& /*row*/,
    const c10::optional<at::Tensor>& /*perm*/, const c10::optional<at::Tensor>& /*col_items*/,
    const c10::optional<at::Tensor>& /*col_combine*/, int64_t /*col_slots*/, int64_t chunk,
    double scale, double dropout, int64_t seed, bool pmf, bool need_attn,
    const c10::optional<at::Tensor>& dense_tiles, double dense_cells, bool mma, bool two_rows,
    bool /*bwd_one_launch*/) {
  // The CSC arguments and bwd_one_launch are only kept for the backward (the
  // autograd node saves them).
  check_qkv(q, k, v, rowptr, col);
  TORCH_CHECK(dropout >= 0.0 && dropout < 1.0, "dfgnn::gt_fwd: dropout must be in [0, 1), got ",
              std::to_string(dropout));
  TORCH_CHECK(chunk > 0, "dfgnn::gt_fwd: chunk must be > 0, got ", num(chunk));
  Work rw = make_work(row_items, row_combine, row_slots, "row", q);
  if (pmf) {
    TORCH_CHECK(csr_row.has_value(), "dfgnn::gt_fwd: pmf=True needs csr_row");
    check_index(*csr_row, "csr_row", col.numel(), q);
  }
  check_two_rows(two_rows, pmf, rw, "dfgnn::gt_fwd");
  TORCH_CHECK(!mma || (!pmf && dropout == 0.0 && !need_attn &&
                       gt_forward_mma_supports(q.scalar_type(), q.size(2), /*aligned16=*/true)),
              "dfgnn::gt_fwd: mma=True (the tensor-core forward) needs float16 / bfloat16, C in "
              "{32, 64, 128}, pmf=False, dropout 0 and need_attn=False");
  if (dense_tiles.has_value()) {
    TORCH_CHECK(mma, "dfgnn::gt_fwd: dense_tiles runs in the tensor-core forward: it needs "
                "mma=True");
    TORCH_CHECK(dense_cells > 0.0, "dfgnn::gt_fwd: dense_cells (window cells per edge of a "
                "dense block) must be > 0 with dense_tiles, got ", std::to_string(dense_cells));
    check_index(*dense_tiles, "dense_tiles", -1, q);
    const int64_t n_tiles = (q.size(0) + kTileRows - 1) / kTileRows;
    TORCH_CHECK(dense_tiles->numel() >= kTileMetaInts * n_tiles &&
                    dense_tiles->numel() < INT32_MAX,
                "dfgnn::gt_fwd: dense_tiles must hold ", num(kTileMetaInts), " ints per ",
                num(kTileRows), " destination rows (", num(kTileMetaInts * n_tiles),
                ") and its masks, got ", num(dense_tiles->numel()));
    TORCH_CHECK(reinterpret_cast<uintptr_t>(dense_tiles->data_ptr()) % 16 == 0,
                "dfgnn::gt_fwd: dense_tiles must be 16-byte aligned (a tensor of its own, "
                "not a view at an offset)");
  }
  const c10::cuda::CUDAGuard guard(q.device());  // the inputs' device and its stream
  return gt_forward_cuda(q, k, v, rowptr, col, rw, csr_row, chunk, scale, dropout, seed, pmf,
                         need_attn, dense_tiles, dense_cells, mma, two_rows);
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> gt_bwd(
    const at::Tensor& grad_out, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
    const at::Tensor& out, const at::Tensor& lse, const at::Tensor& rowptr, const at::Tensor& col,
    const at::Tensor& row_items, const at::Tensor& row_combine, int64_t row_slots,
    const at::Tensor& colptr, const at::Tensor& row, const at::Tensor& perm,
    const at::Tensor& col_items, const at::Tensor& col_combine, int64_t col_slots, int64_t chunk,
    double scale, double dropout, int64_t seed, bool one_launch) {
  check_qkv(q, k, v, rowptr, col);
  check_features(out, "out", q);
  check_features(grad_out, "grad_out", q);
  TORCH_CHECK(out.size(0) == q.size(0) && grad_out.size(0) == q.size(0),
              "dfgnn::gt_bwd: out and grad_out must have q's number of rows");
  check_cuda(lse, "lse", q);
  TORCH_CHECK(lse.scalar_type() == at::kFloat && lse.dim() == 2 && lse.size(0) == q.size(0) &&
                  lse.size(1) == q.size(1),
              "dfgnn::gt_bwd: lse must be float32 [N_dst, H]");
  check_index(colptr, "colptr", k.size(0) + 1, q);
  check_index(row, "row", col.numel(), q);
  check_index(perm, "perm", col.numel(), q);
  TORCH_CHECK(chunk > 0, "dfgnn::gt_bwd: chunk must be > 0, got ", num(chunk));
  Work rw = make_work(row_items, row_combine, row_slots, "row", q);
  Work cw = make_work(col_items, col_combine, col_slots, "col", q);
  const c10::cuda::CUDAGuard guard(q.device());  // the inputs' device and its stream
  return gt_backward_cuda(grad_out, q, k, v, out, lse, rowptr, col, rw, colptr, row, perm, cw,
                          chunk, scale, dropout, seed, one_launch);
}

void check_gat(const at::Tensor& a_dst, const at::Tensor& a_src, const at::Tensor& x,
               const at::Tensor& rowptr, const at::Tensor& col) {
  TORCH_CHECK(x.is_cuda(), "dfgnn: x must be a CUDA tensor, got device ", x.device());
  auto st = x.scalar_type();
  TORCH_CHECK(st == at::kFloat || st == at::kHalf || st == at::kBFloat16,
              "dfgnn: x must be float32, float16 or bfloat16, got ", st);
  check_cuda(x, "x", x);
  TORCH_CHECK(x.dim() == 3, "dfgnn: x must be [N_src, H, C], got shape ", shape(x.sizes()));
  for (auto [t, name, n] : {std::make_tuple(&a_dst, "a_dst", rowptr.numel() - 1),
                            std::make_tuple(&a_src, "a_src", x.size(0))}) {
    check_cuda(*t, name, x);
    TORCH_CHECK(t->scalar_type() == st, "dfgnn: ", name, " has dtype ", t->scalar_type(),
                " but x has ", st);
    TORCH_CHECK(t->dim() == 2 && t->size(0) == n && t->size(1) == x.size(1), "dfgnn: ", name,
                " must be [", num(n), ", ", num(x.size(1)), "], got ", shape(t->sizes()));
  }
  check_index(rowptr, "rowptr", -1, x);
  check_index(col, "col", -1, x);
  TORCH_CHECK(rowptr.numel() >= 1, "dfgnn: rowptr must have N_dst + 1 entries");
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> gat_fwd(
    const at::Tensor& a_dst, const at::Tensor& a_src, const at::Tensor& x,
    const at::Tensor& rowptr, const at::Tensor& col, const at::Tensor& row_items,
    const at::Tensor& row_combine, int64_t row_slots, const c10::optional<at::Tensor>& csr_row,
    const c10::optional<at::Tensor>& /*colptr*/, const c10::optional<at::Tensor>& /*row*/,
    const c10::optional<at::Tensor>& /*perm*/, const c10::optional<at::Tensor>& /*col_items*/,
    const c10::optional<at::Tensor>& /*col_combine*/, int64_t /*col_slots*/, int64_t chunk,
    double negative_slope, double dropout, int64_t seed, bool pmf, bool need_attn,
    bool two_rows) {
  check_gat(a_dst, a_src, x, rowptr, col);
  TORCH_CHECK(dropout >= 0.0 && dropout < 1.0, "dfgnn::gat_fwd: dropout must be in [0, 1), got ",
              std::to_string(dropout));
  TORCH_CHECK(chunk > 0, "dfgnn::gat_fwd: chunk must be > 0, got ", num(chunk));
  Work rw = make_work(row_items, row_combine, row_slots, "row", x);
  if (pmf) {
    TORCH_CHECK(csr_row.has_value(), "dfgnn::gat_fwd: pmf=True needs csr_row");
    check_index(*csr_row, "csr_row", col.numel(), x);
  }
  check_two_rows(two_rows, pmf, rw, "dfgnn::gat_fwd");
  const c10::cuda::CUDAGuard guard(x.device());  // the inputs' device and its stream
  return gat_forward_cuda(a_dst, a_src, x, rowptr, col, rw, csr_row, chunk, negative_slope,
                          dropout, seed, pmf, need_attn, two_rows);
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> gat_bwd(
    const at::Tensor& grad_out, const at::Tensor& a_dst, const at::Tensor& a_src,
    const at::Tensor& x, const at::Tensor& out, const at::Tensor& lse, const at::Tensor& rowptr,
    const at::Tensor& col, const at::Tensor& row_items, const at::Tensor& row_combine,
    int64_t row_slots, const at::Tensor& colptr, const at::Tensor& row, const at::Tensor& perm,
    const at::Tensor& col_items, const at::Tensor& col_combine, int64_t col_slots, int64_t chunk,
    double negative_slope, double dropout, int64_t seed) {
  check_gat(a_dst, a_src, x, rowptr, col);
  for (auto [t, name] : {std::make_pair(&out, "out"), std::make_pair(&grad_out, "grad_out")}) {
    check_cuda(*t, name, x);
    TORCH_CHECK(t->scalar_type() == x.scalar_type() && t->dim() == 3 &&
                    t->size(0) == a_dst.size(0) && t->size(1) == x.size(1) &&
                    t->size(2) == x.size(2),
                "dfgnn::gat_bwd: ", name, " must be [N_dst, H, C] with x's dtype, got ",
                shape(t->sizes()));
  }
  check_cuda(lse, "lse", x);
  TORCH_CHECK(lse.scalar_type() == at::kFloat && lse.dim() == 2 && lse.size(0) == a_dst.size(0),
              "dfgnn::gat_bwd: lse must be float32 [N_dst, H]");
  check_index(colptr, "colptr", x.size(0) + 1, x);
  check_index(row, "row", col.numel(), x);
  check_index(perm, "perm", col.numel(), x);
  TORCH_CHECK(chunk > 0, "dfgnn::gat_bwd: chunk must be > 0, got ", num(chunk));
  Work rw = make_work(row_items, row_combine, row_slots, "row", x);
  Work cw = make_work(col_items, col_combine, col_slots, "col", x);
  const c10::cuda::CUDAGuard guard(x.device());  // the inputs' device and its stream
  return gat_backward_cuda(grad_out, a_dst, a_src, x, out, lse, rowptr, col, rw, colptr, row, perm,
                           cw, chunk, negative_slope, dropout, seed);
}

void check_beta(const at::Tensor& beta, const at::Tensor& x) {
  check_cuda(beta, "beta", x);
  TORCH_CHECK(beta.scalar_type() == at::kFloat && beta.numel() == 1,
              "dfgnn: beta must be a float32 tensor with one element, got ", beta.scalar_type(),
              " ", shape(beta.sizes()));
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> l2norm_fwd(const at::Tensor& x,
                                                          const at::Tensor& beta, double eps) {
  TORCH_CHECK(x.is_cuda(), "dfgnn::l2norm_fwd: x must be a CUDA tensor, got device ", x.device());
  auto st = x.scalar_type();
  TORCH_CHECK(st == at::kFloat || st == at::kHalf || st == at::kBFloat16,
              "dfgnn::l2norm_fwd: x must be float32, float16 or bfloat16, got ", st);
  check_features(x, "x", x, "x");
  check_beta(beta, x);
  TORCH_CHECK(eps > 0.0, "dfgnn::l2norm_fwd: eps must be > 0, got ", std::to_string(eps));
  const c10::cuda::CUDAGuard guard(x.device());  // the inputs' device and its stream
  return l2norm_forward_cuda(x, beta, eps);
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> cos_fwd(
    const at::Tensor& x, const at::Tensor& beta, double eps, const at::Tensor& rowptr,
    const at::Tensor& col, const at::Tensor& row_items, const at::Tensor& row_combine,
    int64_t row_slots, int64_t chunk, bool need_attn, bool two_rows) {
  TORCH_CHECK(x.is_cuda(), "dfgnn::cos_fwd: x must be a CUDA tensor, got device ", x.device());
  TORCH_CHECK(x.scalar_type() == at::kFloat, "dfgnn::cos_fwd: x must be float32, got ",
              x.scalar_type(), " (fp16 / bf16 AGNN runs l2norm_fwd then gt_fwd)");
  check_qkv(x, x, x, rowptr, col);
  check_beta(beta, x);
  TORCH_CHECK(eps > 0.0, "dfgnn::cos_fwd: eps must be > 0, got ", std::to_string(eps));
  TORCH_CHECK(chunk > 0, "dfgnn::cos_fwd: chunk must be > 0, got ", num(chunk));
  Work rw = make_work(row_items, row_combine, row_slots, "row", x);
  check_two_rows(two_rows, false, rw, "dfgnn::cos_fwd");
  const c10::cuda::CUDAGuard guard(x.device());  // the inputs' device and its stream
  return cosine_forward_cuda(x, beta, eps, rowptr, col, rw, chunk, need_attn, two_rows);
}

std::tuple<at::Tensor, at::Tensor> l2norm_bwd(const at::Tensor& dk, const at::Tensor& dq,
                                              const at::Tensor& k, const at::Tensor& rnorm,
                                              const at::Tensor& beta) {
  TORCH_CHECK(k.is_cuda(), "dfgnn::l2norm_bwd: k must be a CUDA tensor, got device ", k.device());
  check_features(k, "k", k, "k");
  check_features(dk, "dk", k, "k");
  check_features(dq, "dq", k, "k");
  TORCH_CHECK(dk.size(0) == k.size(0) && dq.size(0) == k.size(0),
              "dfgnn::l2norm_bwd: dk and dq must have k's shape ", shape(k.sizes()));
  check_cuda(rnorm, "rnorm", k);
  TORCH_CHECK(rnorm.scalar_type() == at::kFloat && rnorm.dim() == 2 &&
                  rnorm.size(0) == k.size(0) && rnorm.size(1) == k.size(1),
              "dfgnn::l2norm_bwd: rnorm must be float32 [N, H]");
  check_beta(beta, k);
  const c10::cuda::CUDAGuard guard(k.device());  // the inputs' device and its stream
  return l2norm_backward_cuda(dk, dq, k, rnorm, beta);
}

}  // namespace

TORCH_LIBRARY(dfgnn, m) {
  m.def("csr_rowptr(Tensor index, int num_rows) -> Tensor");
  m.def("l2norm_fwd(Tensor x, Tensor beta, float eps) -> (Tensor, Tensor, Tensor)");
  m.def("l2norm_bwd(Tensor dk, Tensor dq, Tensor k, Tensor rnorm, Tensor beta) -> (Tensor, Tensor)");
  // The kernel plan's decisions (pyg_dfgnn/ops/plan.py) are arguments: pmf,
  // chunk, two_rows (two rows per warp in the SMMF forward, where the head shape
  // has that variant), mma (the fp16 / bf16 tensor-core GT forward; rows that are
  // not 16-byte aligned run the CUDA-core kernel), dense_tiles with dense_cells
  // (the layout's tile plan, pyg_dfgnn/ops/tiles.py, and the window cells per
  // edge up to which a block runs dense) and bwd_one_launch / one_launch (the GT
  // backward's two walks in one launch).
  // AGNN in one call (cuda/glue/agnn.cpp): cos_fwd for fp32, else l2norm_fwd then gt_fwd
  // (SMMF, scale 1).
  m.def(
      "agnn_fwd(Tensor x, Tensor beta, float eps, Tensor rowptr, Tensor col, Tensor row_items, "
      "Tensor row_combine, int row_slots, Tensor? colptr, Tensor? row, Tensor? perm, "
      "Tensor? col_items, Tensor? col_combine, int col_slots, int chunk, bool need_attn, "
      "bool mma, bool two_rows, bool bwd_one_launch) -> (Tensor, Tensor)");
  // AGNN's attention over unnormalised x (fp32): (out, lse, attn, rnorm).
  m.def(
      "cos_fwd(Tensor x, Tensor beta, float eps, Tensor rowptr, Tensor col, Tensor row_items, "
      "Tensor row_combine, int row_slots, int chunk, bool need_attn, bool two_rows) "
      "-> (Tensor, Tensor, Tensor, Tensor)");
  // Work items (row_items / col_items, *_combine, *_slots): see Work in host/params.h.
  m.def(
      "gt_fwd(Tensor q, Tensor k, Tensor v, Tensor rowptr, Tensor col, Tensor row_items, "
      "Tensor row_combine, int row_slots, Tensor? csr_row, Tensor? colptr, Tensor? row, "
      "Tensor? perm, Tensor? col_items, Tensor? col_combine, int col_slots, int chunk, "
      "float scale, float dropout, int seed, bool pmf, bool need_attn, Tensor? dense_tiles, "
      "float dense_cells, bool mma, bool two_rows, bool bwd_one_launch) "
      "-> (Tensor, Tensor, Tensor)");
  m.def(
      "gt_bwd(Tensor grad_out, Tensor q, Tensor k, Tensor v, Tensor out, Tensor lse, "
      "Tensor rowptr, Tensor col, Tensor row_items, Tensor row_combine, int row_slots, "
      "Tensor colptr, Tensor row, Tensor perm, Tensor col_items, Tensor col_combine, "
      "int col_slots, int chunk, float scale, float dropout, int seed, bool one_launch) "
      "-> (Tensor, Tensor, Tensor)");
  m.def(
      "gat_fwd(Tensor a_dst, Tensor a_src, Tensor x, Tensor rowptr, Tensor col, "
      "Tensor row_items, Tensor row_combine, int row_slots, Tensor? csr_row, Tensor? colptr, "
      "Tensor? row, Tensor? perm, Tensor? col_items, Tensor? col_combine, int col_slots, "
      "int chunk, float negative_slope, float dropout, int seed, bool pmf, bool need_attn, "
      "bool two_rows) -> (Tensor, Tensor, Tensor)");
  m.def(
      "gat_bwd(Tensor grad_out, Tensor a_dst, Tensor a_src, Tensor x, Tensor out, Tensor lse, "
      "Tensor rowptr, Tensor col, Tensor row_items, Tensor row_combine, int row_slots, "
      "Tensor colptr, Tensor row, Tensor perm, Tensor col_items, Tensor col_combine, "
      "int col_slots, int chunk, float negative_slope, float dropout, int seed) "
      "-> (Tensor, Tensor, Tensor)");
}

TORCH_LIBRARY_IMPL(dfgnn, CUDA, m) {
  m.impl("csr_rowptr", &csr_rowptr);
  m.impl("gt_fwd", &gt_fwd);
  m.impl("gt_bwd", &gt_bwd);
  m.impl("gat_fwd", &gat_fwd);
  m.impl("gat_bwd", &gat_bwd);
  m.impl("l2norm_fwd", &l2norm_fwd);
  m.impl("cos_fwd", &cos_fwd);
  m.impl("l2norm_bwd", &l2norm_bwd);
}

}  // namespace dfgnn

// The Python module pyg_dfgnn._C itself: python_entry.cpp.
