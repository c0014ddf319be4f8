// Operator schemas (TORCH_LIBRARY(dfgnn)) and the input checks every CUDA entry
// point runs before a kernel sees the data: bad input raises a RuntimeError that
// names the argument, never a CUDA fault. The fake (meta) implementations are
// registered from Python (pyg_dfgnn/ops/_custom.py), autograd in autograd.cpp
// and agnn.cpp.
#include <Python.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/library.h>

#include <string>

#include "glue/layout_args.h"
#include "host/ops.h"
#include "host/plan_checks.h"

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

void check_qkv(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v) {
  TORCH_CHECK(q.is_cuda(), "dfgnn: q must be a CUDA tensor, got device ", q.device());
  auto st = q.scalar_type();
  TORCH_CHECK(st == at::kFloat || st == at::kHalf || st == at::kBFloat16,
              "dfgnn: q must be float32, float16 or bfloat16, got ", st);
  check_features(q, "q", q);
  check_features(k, "k", q);
  check_features(v, "v", q);
  TORCH_CHECK(k.size(0) == v.size(0), "dfgnn: k and v must have the same number of source "
              "nodes, got ", num(k.size(0)), " and ", num(v.size(0)));
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

// Entry i of an op's `csr` list, undefined where it is None (csr_row, tiles).
at::Tensor csr_entry(const CsrList& csr, size_t i) {
  std::optional<at::Tensor> t = csr.get(i);
  return t.has_value() ? *std::move(t) : at::Tensor();
}

// The one LayoutView of a call, built and checked from the op's layout arguments
// (host/params.h says what each holds): `n_dst` / `n_src` (-1: not known from the
// features) fix the pointers' lengths; `csc` is checked where the call walks it
// (`need_csc`), else only kept for the backward.
LayoutView layout_view(const CsrList& csr, const OptTensorList& csc, at::IntArrayRef sizes,
                       const at::Tensor& ref, const char* op, int64_t n_dst, int64_t n_src,
                       bool need_csc) {
  TORCH_CHECK(csr.size() == kCsrEntries, op, ": csr must hold ", num(kCsrEntries),
              " entries (rowptr, col, row_items, row_combine, csr_row or None, tiles or None), "
              "got ", num(csr.size()));
  TORCH_CHECK(sizes.size() == kLayoutSizes, op, ": sizes must be [row_slots, col_slots, "
              "chunk], got ", num(sizes.size()), " entries");
  LayoutView L;
  const char* names[] = {"rowptr", "col", "row_items", "row_combine"};
  at::Tensor t[4];
  for (size_t i = 0; i < 4; ++i) {
    t[i] = csr_entry(csr, i);
    TORCH_CHECK(t[i].defined(), op, ": csr entry ", num(i), " (", names[i], ") is None");
  }
  L.rowptr = t[0];
  L.col = t[1];
  check_index(L.rowptr, "rowptr", n_dst < 0 ? -1 : n_dst + 1, ref);
  TORCH_CHECK(L.rowptr.numel() >= 1, "dfgnn: rowptr must have N_dst + 1 entries");
  check_index(L.col, "col", -1, ref);
  TORCH_CHECK(L.rowptr.numel() <= INT32_MAX && n_src < INT32_MAX && L.col.numel() < INT32_MAX,
              "dfgnn: graphs with more than 2^31 - 1 nodes or edges need int64 kernels");
  L.chunk = sizes[2];
  TORCH_CHECK(L.chunk > 0, op, ": chunk must be > 0, got ", num(L.chunk));
  L.rw = make_work(t[2], t[3], sizes[0], "row", ref);
  L.csr_row = csr_entry(csr, 4);
  if (L.csr_row.defined()) check_index(L.csr_row, "csr_row", L.col.numel(), ref);
  L.tiles = csr_entry(csr, 5);
  TORCH_CHECK(!need_csc || csc.has_value(), op, ": the CSC layout (csc) is None");
  if (csc.has_value()) {
    TORCH_CHECK(csc->size() == kCscEntries, op, ": csc must hold ", num(kCscEntries),
                " entries (colptr, row, perm, col_items, col_combine), got ",
                num(csc->size()));
    L.colptr = (*csc)[0];
    L.row = (*csc)[1];
    L.perm = (*csc)[2];
    if (need_csc) {
      check_index(L.colptr, "colptr", n_src < 0 ? -1 : n_src + 1, ref);
      check_index(L.row, "row", L.col.numel(), ref);
      check_index(L.perm, "perm", L.col.numel(), ref);
      L.cw = make_work((*csc)[3], (*csc)[4], sizes[1], "col", ref);
    }
  }
  return L;
}

// The plan's decisions (pyg_dfgnn/ops/plan.py) arrive as arguments; one the call
// cannot run raises here, before anything is launched. Two rows per warp compile
// the split-row merge out of the SMMF forward, so they need a call without
// split rows.
KernelPlan kernel_plan(at::IntArrayRef plan, double dense_cells, const LayoutView& L,
                       const char* op) {
  TORCH_CHECK(plan.size() == kPlanEntries, op, ": plan must be [pmf, two_rows, mma, "
              "bwd_one_launch, mma_backward], got ", num(plan.size()), " entries");
  KernelPlan p;
  p.pmf = plan[kPlanPmf] != 0;
  p.two_rows = plan[kPlanTwoRows] != 0;
  p.mma = plan[kPlanMma] != 0;
  p.bwd_one_launch = plan[kPlanBwdOneLaunch] != 0;
  p.dense_cells = dense_cells;
  TORCH_CHECK(!p.pmf || L.csr_row.defined(), op, ": pmf=True needs csr_row (csr entry 4)");
  TORCH_CHECK(!p.two_rows || (!p.pmf && L.rw.num_slots == 0), op, ": two_rows=True needs SMMF "
              "(pmf=False) and no split rows (row_slots == 0), got pmf=", p.pmf ? "True" : "False",
              ", row_slots=", num(L.rw.num_slots));
  return p;
}

// These ops' plan lists say nothing of row accesses and split-row merges: their
// calls keep the choices the kernels made before the plan held them: 16-byte
// rows where every row is aligned, the tensor-core walks only there, the
// in-kernel merge wherever the kernels carry it and the stream is not
// captured, two rows per warp only where the shape has them.
KernelPlan legacy_plan(KernelPlan p, at::ScalarType st, int64_t C, const LayoutView& L,
                       std::initializer_list<const at::Tensor*> rows) {
  bool aligned = true;
  for (const at::Tensor* t : rows) aligned = aligned && (!t->defined() || rows_aligned16(*t));
  p.vector_rows = aligned && row_shape_supported(st, C, true);
  p.two_rows = p.two_rows && smmf_two_rows_supported(st, C, p.vector_rows);
  p.mma = p.mma && p.vector_rows;
  p.mma_backward = p.mma_backward && p.vector_rows;
  if (!p.mma || !L.tiles.defined() || L.col.numel() == 0) p.dense_cells = 0.0;
  const bool capturing = stream_is_capturing();
  p.merge_in_kernel = !capturing && !p.pmf;
  p.bwd_merge_in_kernel = !capturing && backward_merge_in_kernel_supported(st);
  return p;
}

void check_dropout(double dropout, const char* op) {
  TORCH_CHECK(dropout >= 0.0 && dropout < 1.0, op, ": dropout must be in [0, 1), got ",
              std::to_string(dropout));
}

// The tile plan (csr entry 5) only runs in the tensor-core forward, with a bound.
void check_tiles(const LayoutView& L, const KernelPlan& p, const at::Tensor& q) {
  if (!L.tiles.defined()) return;
  TORCH_CHECK(p.mma, "dfgnn::gt_fwd: dense_tiles runs in the tensor-core forward: it needs "
              "mma=True");
  TORCH_CHECK(p.dense_cells > 0.0, "dfgnn::gt_fwd: dense_cells (window cells per edge of a "
              "dense block) must be > 0 with dense_tiles, got ", std::to_string(p.dense_cells));
  check_index(L.tiles, "dense_tiles", -1, q);
  const int64_t n_tiles = (q.size(0) + kTileRows - 1) / kTileRows;
  TORCH_CHECK(L.tiles.numel() >= kTileMetaInts * n_tiles && L.tiles.numel() < INT32_MAX,
              "dfgnn::gt_fwd: dense_tiles must hold ", num(kTileMetaInts), " ints per ",
              num(kTileRows), " destination rows (", num(kTileMetaInts * n_tiles),
              ") and its masks, got ", num(L.tiles.numel()));
  TORCH_CHECK(reinterpret_cast<uintptr_t>(L.tiles.data_ptr()) % 16 == 0,
              "dfgnn::gt_fwd: dense_tiles must be 16-byte aligned (a tensor of its own, "
              "not a view at an offset)");
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> gt_fwd(
    const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const CsrList& csr,
    const OptTensorList& csc, at::IntArrayRef sizes, double scale, double dropout, int64_t seed,
    bool need_attn, at::IntArrayRef plan, double dense_cells) {
  // The CSC and bwd_one_launch are only kept for the backward (the autograd node
  // keeps them).
  check_qkv(q, k, v);
  const LayoutView L = layout_view(csr, csc, sizes, q, "dfgnn::gt_fwd", q.size(0), k.size(0),
                                   /*need_csc=*/false);
  check_dropout(dropout, "dfgnn::gt_fwd");
  const KernelPlan p = kernel_plan(plan, dense_cells, L, "dfgnn::gt_fwd");
  TORCH_CHECK(!p.mma || (!p.pmf && dropout == 0.0 && !need_attn &&
                         gt_forward_mma_supports(q.scalar_type(), q.size(2), /*aligned16=*/true)),
              "dfgnn::gt_fwd: mma=True (the tensor-core forward) needs float16 / bfloat16, C in "
              "{32, 64, 128}, pmf=False, dropout 0 and need_attn=False");
  check_tiles(L, p, q);
  const c10::cuda::CUDAGuard guard(q.device());  // the inputs' device and its stream
  return gt_forward_cuda(q, k, v, L, scale, dropout, seed, need_attn,
                         legacy_plan(p, q.scalar_type(), q.size(2), L, {&q, &k, &v}));
}

// gt_bwd's and gt_bwd_into's arguments past the outputs, checked; the layout.
LayoutView check_gt_bwd(const char* op, const at::Tensor& grad_out, const at::Tensor& q,
                        const at::Tensor& k, const at::Tensor& v, const at::Tensor& out,
                        const at::Tensor& lse, const CsrList& csr, at::TensorList csc,
                        at::IntArrayRef sizes) {
  check_qkv(q, k, v);
  check_features(out, "out", q);
  check_features(grad_out, "grad_out", q);
  TORCH_CHECK(out.size(0) == q.size(0) && grad_out.size(0) == q.size(0), op,
              ": out and grad_out must have q's number of rows");
  check_cuda(lse, "lse", q);
  TORCH_CHECK(lse.scalar_type() == at::kFloat && lse.dim() == 2 && lse.size(0) == q.size(0) &&
                  lse.size(1) == q.size(1),
              op, ": lse must be float32 [N_dst, H]");
  return layout_view(csr, csc, sizes, q, op, q.size(0), k.size(0), /*need_csc=*/true);
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> gt_bwd(
    const at::Tensor& grad_out, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
    const at::Tensor& out, const at::Tensor& lse, const CsrList& csr, at::TensorList csc,
    at::IntArrayRef sizes, double scale, double dropout, int64_t seed, bool one_launch,
    bool mma) {
  const LayoutView L =
      check_gt_bwd("dfgnn::gt_bwd", grad_out, q, k, v, out, lse, csr, csc, sizes);
  const c10::cuda::CUDAGuard guard(q.device());  // the inputs' device and its stream
  KernelPlan p;
  p.bwd_one_launch = one_launch;
  p.mma_backward = mma;
  return gt_backward_cuda(grad_out, q, k, v, out, lse, L, scale, dropout, seed,
                          legacy_plan(p, q.scalar_type(), q.size(2), L,
                                      {&q, &k, &v, &out, &grad_out}));
}

// An output of gt_bwd_into: on q's device, in its dtype, the rows of `like`, C
// contiguous and heads C apart, rows at least H * C apart (a column slice of a
// joined gradient; size-1 dimensions may have any stride).
void check_grad_out(const at::Tensor& t, const char* name, const at::Tensor& like) {
  TORCH_CHECK(t.is_cuda() && t.device() == like.device(), "dfgnn::gt_bwd_into: ", name,
              " must be on the features' device ", like.device(), ", got ", t.device());
  TORCH_CHECK(t.scalar_type() == like.scalar_type() && t.sizes() == like.sizes(),
              "dfgnn::gt_bwd_into: ", name, " must have the dtype and shape of its feature ",
              shape(like.sizes()), ", got ", t.scalar_type(), " ", shape(t.sizes()));
  const int64_t H = t.size(1), C = t.size(2);
  TORCH_CHECK((C <= 1 || t.stride(2) == 1) && (H <= 1 || t.stride(1) == C) &&
                  (t.size(0) <= 1 || t.stride(0) >= H * C),
              "dfgnn::gt_bwd_into: ", name, " needs rows of H * C elements (C contiguous), "
              "got strides ", shape(t.strides()));
}

void gt_bwd_into(const at::Tensor& dq, const at::Tensor& dk, const at::Tensor& dv,
                 const at::Tensor& grad_out, const at::Tensor& q, const at::Tensor& k,
                 const at::Tensor& v, const at::Tensor& out, const at::Tensor& lse,
                 const CsrList& csr, at::TensorList csc, at::IntArrayRef sizes, double scale,
                 double dropout, int64_t seed, bool one_launch, bool mma) {
  const LayoutView L =
      check_gt_bwd("dfgnn::gt_bwd_into", grad_out, q, k, v, out, lse, csr, csc, sizes);
  check_grad_out(dq, "dq", q);
  check_grad_out(dk, "dk", k);
  check_grad_out(dv, "dv", v);
  TORCH_CHECK(dk.size(0) <= 1 || dk.stride(0) == dv.stride(0),
              "dfgnn::gt_bwd_into: dk and dv need the same row stride, got ",
              num(dk.stride(0)), " and ", num(dv.stride(0)));
  const c10::cuda::CUDAGuard guard(q.device());  // the inputs' device and its stream
  const GradsOut into{dq, dk, dv};
  KernelPlan p;
  p.bwd_one_launch = one_launch;
  p.mma_backward = mma;
  gt_backward_cuda(grad_out, q, k, v, out, lse, L, scale, dropout, seed,
                   legacy_plan(p, q.scalar_type(), q.size(2), L,
                               {&q, &k, &v, &out, &grad_out, &dq, &dk, &dv}),
                   &into);
}

void check_gat(const at::Tensor& a_dst, const at::Tensor& a_src, const at::Tensor& x,
               const LayoutView& L) {
  auto st = x.scalar_type();
  for (auto [t, name, n] : {std::make_tuple(&a_dst, "a_dst", L.rowptr.numel() - 1),
                            std::make_tuple(&a_src, "a_src", x.size(0))}) {
    check_cuda(*t, name, x);
    TORCH_CHECK(t->scalar_type() == st, "dfgnn: ", name, " has dtype ", t->scalar_type(),
                " but x has ", st);
    TORCH_CHECK(t->dim() == 2 && t->size(0) == n && t->size(1) == x.size(1), "dfgnn: ", name,
                " must be [", num(n), ", ", num(x.size(1)), "], got ", shape(t->sizes()));
  }
}

void check_x(const at::Tensor& x) {
  TORCH_CHECK(x.is_cuda(), "dfgnn: x must be a CUDA tensor, got device ", x.device());
  auto st = x.scalar_type();
  TORCH_CHECK(st == at::kFloat || st == at::kHalf || st == at::kBFloat16,
              "dfgnn: x must be float32, float16 or bfloat16, got ", st);
  check_cuda(x, "x", x);
  TORCH_CHECK(x.dim() == 3, "dfgnn: x must be [N_src, H, C], got shape ", shape(x.sizes()));
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> gat_fwd(
    const at::Tensor& a_dst, const at::Tensor& a_src, const at::Tensor& x, const CsrList& csr,
    const OptTensorList& csc, at::IntArrayRef sizes, double negative_slope, double dropout,
    int64_t seed, bool need_attn, at::IntArrayRef plan) {
  check_x(x);
  const LayoutView L = layout_view(csr, csc, sizes, x, "dfgnn::gat_fwd", -1, x.size(0),
                                   /*need_csc=*/false);
  check_gat(a_dst, a_src, x, L);
  check_dropout(dropout, "dfgnn::gat_fwd");
  const KernelPlan p = kernel_plan(plan, 0.0, L, "dfgnn::gat_fwd");
  TORCH_CHECK(!p.mma && !L.tiles.defined(), "dfgnn::gat_fwd: the tensor-core and dense-tile "
              "forwards are GT's: mma must be 0 and tiles None");
  const c10::cuda::CUDAGuard guard(x.device());  // the inputs' device and its stream
  return gat_forward_cuda(a_dst, a_src, x, L, negative_slope, dropout, seed, need_attn,
                          legacy_plan(p, x.scalar_type(), x.size(2), L, {&x}));
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> gat_bwd(
    const at::Tensor& grad_out, const at::Tensor& a_dst, const at::Tensor& a_src,
    const at::Tensor& x, const at::Tensor& out, const at::Tensor& lse, const CsrList& csr,
    at::TensorList csc, at::IntArrayRef sizes, double negative_slope, double dropout,
    int64_t seed) {
  check_x(x);
  const LayoutView L = layout_view(csr, csc, sizes, x, "dfgnn::gat_bwd", -1, x.size(0),
                                   /*need_csc=*/true);
  check_gat(a_dst, a_src, x, L);
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
  const c10::cuda::CUDAGuard guard(x.device());  // the inputs' device and its stream
  return gat_backward_cuda(grad_out, a_dst, a_src, x, out, lse, L, negative_slope, dropout,
                           seed, legacy_plan(KernelPlan{}, x.scalar_type(), x.size(2), L,
                                             {&x, &out, &grad_out}));
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
  return l2norm_forward_cuda(x, beta, eps,
                             rows_aligned16(x) && row_shape_supported(st, x.size(2), true));
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> cos_fwd(
    const at::Tensor& x, const at::Tensor& beta, double eps, const CsrList& csr,
    at::IntArrayRef sizes, bool need_attn, at::IntArrayRef plan) {
  TORCH_CHECK(x.is_cuda(), "dfgnn::cos_fwd: x must be a CUDA tensor, got device ", x.device());
  TORCH_CHECK(x.scalar_type() == at::kFloat, "dfgnn::cos_fwd: x must be float32, got ",
              x.scalar_type(), " (fp16 / bf16 AGNN runs l2norm_fwd then gt_fwd)");
  check_qkv(x, x, x);
  const LayoutView L = layout_view(csr, c10::nullopt, sizes, x, "dfgnn::cos_fwd", x.size(0),
                                   x.size(0), /*need_csc=*/false);
  check_beta(beta, x);
  TORCH_CHECK(eps > 0.0, "dfgnn::cos_fwd: eps must be > 0, got ", std::to_string(eps));
  const KernelPlan p = kernel_plan(plan, 0.0, L, "dfgnn::cos_fwd");
  TORCH_CHECK(!p.pmf && !L.tiles.defined(), "dfgnn::cos_fwd: runs SMMF only: pmf must be 0 "
              "and tiles None");
  const c10::cuda::CUDAGuard guard(x.device());  // the inputs' device and its stream
  return cosine_forward_cuda(x, beta, eps, L, need_attn,
                             legacy_plan(p, x.scalar_type(), x.size(2), L, {&x}));
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
  return l2norm_backward_cuda(dk, dq, k, rnorm, beta,
                              rows_aligned16(k) && rows_aligned16(dk) && rows_aligned16(dq) &&
                                  row_shape_supported(k.scalar_type(), k.size(2), true));
}

}  // namespace

TORCH_LIBRARY(dfgnn, m) {
  m.def("csr_rowptr(Tensor index, int num_rows) -> Tensor");
  m.def("l2norm_fwd(Tensor x, Tensor beta, float eps) -> (Tensor, Tensor, Tensor)");
  m.def("l2norm_bwd(Tensor dk, Tensor dq, Tensor k, Tensor rnorm, Tensor beta) -> (Tensor, Tensor)");
  // The graph layout of a call is three arguments, one LayoutView in C++
  // (host/params.h): csr = [rowptr, col, row_items, row_combine, csr_row (PMF) or
  // None, the tile plan (dense tiles, pyg_dfgnn/ops/tiles.py) or None]; csc =
  // [colptr, row, perm, col_items, col_combine], None where the call records no
  // backward; sizes = [row_slots, col_slots, chunk] (work items: Work in
  // host/params.h).
  // The kernel plan's decisions (pyg_dfgnn/ops/plan.py) are arguments: plan =
  // [pmf, two_rows (two rows per warp in the SMMF forward, where the head shape
  // has that variant), mma (the fp16 / bf16 tensor-core GT forward; rows that are
  // not 16-byte aligned run the CUDA-core kernel), bwd_one_launch (the GT
  // backward's two walks in one launch), mma_backward (the GT backward's two
  // walks on tensor cores; rows that are not 16-byte aligned run the CUDA-core
  // walks)], and gt_fwd's dense_cells (the window cells per edge up to which a
  // block of the tile plan runs dense); gt_bwd takes the forward's
  // bwd_one_launch as one_launch and its mma_backward as mma.
  // AGNN in one call (cuda/glue/agnn.cpp): cos_fwd for fp32, else l2norm_fwd then
  // gt_fwd (SMMF, scale 1).
  m.def(
      "agnn_fwd(Tensor x, Tensor beta, float eps, Tensor?[] csr, Tensor[]? csc, int[] sizes, "
      "bool need_attn, int[] plan) -> (Tensor, Tensor)");
  // AGNN's attention over unnormalised x (fp32): (out, lse, attn, rnorm).
  m.def(
      "cos_fwd(Tensor x, Tensor beta, float eps, Tensor?[] csr, int[] sizes, bool need_attn, "
      "int[] plan) -> (Tensor, Tensor, Tensor, Tensor)");
  m.def(
      "gt_fwd(Tensor q, Tensor k, Tensor v, Tensor?[] csr, Tensor[]? csc, int[] sizes, "
      "float scale, float dropout, int seed, bool need_attn, int[] plan, float dense_cells) "
      "-> (Tensor, Tensor, Tensor)");
  m.def(
      "gt_bwd(Tensor grad_out, Tensor q, Tensor k, Tensor v, Tensor out, Tensor lse, "
      "Tensor?[] csr, Tensor[] csc, int[] sizes, float scale, float dropout, int seed, "
      "bool one_launch, bool mma) -> (Tensor, Tensor, Tensor)");
  // gt_bwd writing dq, dk, dv into the given tensors, whose rows may be further
  // apart than H * C (column slices of the joined gradient of the GT projections;
  // dk and dv equally far): the C++ autograd node's call (glue/autograd.cpp).
  m.def(
      "gt_bwd_into(Tensor(a!) dq, Tensor(b!) dk, Tensor(c!) dv, Tensor grad_out, Tensor q, "
      "Tensor k, Tensor v, Tensor out, Tensor lse, Tensor?[] csr, Tensor[] csc, int[] sizes, "
      "float scale, float dropout, int seed, bool one_launch, bool mma) -> ()");
  m.def(
      "gat_fwd(Tensor a_dst, Tensor a_src, Tensor x, Tensor?[] csr, Tensor[]? csc, int[] sizes, "
      "float negative_slope, float dropout, int seed, bool need_attn, int[] plan) "
      "-> (Tensor, Tensor, Tensor)");
  m.def(
      "gat_bwd(Tensor grad_out, Tensor a_dst, Tensor a_src, Tensor x, Tensor out, Tensor lse, "
      "Tensor?[] csr, Tensor[] csc, int[] sizes, float negative_slope, float dropout, "
      "int seed) -> (Tensor, Tensor, Tensor)");
}

TORCH_LIBRARY_IMPL(dfgnn, CUDA, m) {
  m.impl("csr_rowptr", &csr_rowptr);
  m.impl("gt_fwd", &gt_fwd);
  m.impl("gt_bwd", &gt_bwd);
  m.impl("gt_bwd_into", &gt_bwd_into);
  m.impl("gat_fwd", &gat_fwd);
  m.impl("gat_bwd", &gat_bwd);
  m.impl("l2norm_fwd", &l2norm_fwd);
  m.impl("cos_fwd", &cos_fwd);
  m.impl("l2norm_bwd", &l2norm_bwd);
}

}  // namespace dfgnn

// The Python module pyg_dfgnn._C itself: python_entry.cpp.
