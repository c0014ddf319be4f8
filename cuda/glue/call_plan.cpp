// CallPlan (call_plan.h): the checks a layout and its plan pass once, when the
// plan object is built, instead of on every call.
#include "glue/call_plan.h"

#include <initializer_list>
#include <tuple>
#include <string>

#include "host/input_checks.h"
#include "host/ops.h"

namespace dfgnn {
namespace {

constexpr const char* kTensorNames[] = {"rowptr", "col", "row_items", "row_combine", "csr_row",
                                        "tiles", "colptr", "row", "perm", "col_items",
                                        "col_combine", "tiles_t", "rank_pos"};
constexpr const char* kIntNames[] = {"n_src", "chunk", "row_slots", "col_slots", "pmf",
                                     "vector_rows", "two_rows", "mma", "merge_in_kernel",
                                     "bwd_one_launch", "mma_backward", "bwd_merge_in_kernel",
                                     "normalize_first", "dense_backward", "save_weights", "row_walk"};
constexpr const char* kFloatNames[] = {"dense_cells"};

template <size_t N, typename V>
void check_names(const c10::Dict<std::string, V>& d, const char* const (&names)[N],
                 const char* what) {
  for (const auto& item : d) {
    bool known = false;
    for (const char* n : names) known = known || item.key() == n;
    TORCH_CHECK(known, "dfgnn.Plan: unknown ", what, " entry '", item.key(), "'");
  }
}

at::Tensor opt_tensor(const c10::Dict<std::string, at::Tensor>& d, const char* name) {
  auto it = d.find(name);
  return it == d.end() ? at::Tensor() : it->value();
}

at::Tensor tensor(const c10::Dict<std::string, at::Tensor>& d, const char* name) {
  at::Tensor t = opt_tensor(d, name);
  TORCH_CHECK(t.defined(), "dfgnn.Plan: the layout entry '", name, "' is missing");
  return t;
}

int64_t integer(const c10::Dict<std::string, int64_t>& d, const char* name) {
  auto it = d.find(name);
  TORCH_CHECK(it != d.end(), "dfgnn.Plan: the entry '", name, "' is missing");
  return it->value();
}

bool flag(const c10::Dict<std::string, int64_t>& d, const char* name) {
  const int64_t v = integer(d, name);
  TORCH_CHECK(v == 0 || v == 1, "dfgnn.Plan: the flag '", name, "' must be 0 or 1, got ", num(v));
  return v == 1;
}

// An int32, 1-D, contiguous index tensor on `ref`'s device with `numel` entries
// (-1: any).
void check_index(const at::Tensor& t, const char* name, int64_t numel, const at::Tensor& ref) {
  TORCH_CHECK(t.device() == ref.device(), "dfgnn.Plan: ", name, " is on ", t.device(),
              " but rowptr is on ", ref.device());
  TORCH_CHECK(t.scalar_type() == at::kInt, "dfgnn.Plan: ", name, " must be int32, got ",
              t.scalar_type());
  TORCH_CHECK(t.dim() == 1 && t.is_contiguous(), "dfgnn.Plan: ", name,
              " must be a contiguous 1-D tensor, got shape ", shape(t.sizes()));
  TORCH_CHECK(numel < 0 || t.numel() == numel, "dfgnn.Plan: ", name, " must have ", num(numel),
              " entries, got ", num(t.numel()));
}

// A tile plan (pyg_dfgnn/ops/tiles.py) over n_rows rows (`what`: their kind):
// int32, its blocks' entries and masks, and 16-byte aligned (the kernels read
// entries as int4).
void check_tiles(const at::Tensor& t, const char* name, int64_t n_rows, const char* what,
                 const at::Tensor& ref) {
  check_index(t, name, -1, ref);
  const int64_t n_tiles = (n_rows + kTileRows - 1) / kTileRows;
  TORCH_CHECK(t.numel() >= kTileMetaInts * n_tiles && t.numel() < INT32_MAX, "dfgnn.Plan: ",
              name, " must hold ", num(kTileMetaInts), " ints per ", num(kTileRows), " ", what,
              " rows (", num(kTileMetaInts * n_tiles), ") and its masks, got ", num(t.numel()));
  TORCH_CHECK(reinterpret_cast<uintptr_t>(t.data_ptr()) % 16 == 0, "dfgnn.Plan: ", name,
              " must be 16-byte aligned (a tensor of its own, not a view at an offset)");
}

Work work(const at::Tensor& items, const at::Tensor& combine, int64_t slots, const char* what,
          const at::Tensor& ref) {
  for (const at::Tensor* t : {&items, &combine}) {
    TORCH_CHECK(t->device() == ref.device() && t->scalar_type() == at::kInt && t->dim() == 2 &&
                    t->size(1) == 3 && t->is_contiguous(),
                "dfgnn.Plan: the ", what, " work items and combine must be contiguous int32 "
                "[n, 3] tensors on rowptr's device, got ", t->scalar_type(), " ",
                shape(t->sizes()), " on ", t->device());
  }
  TORCH_CHECK(slots >= 0, "dfgnn.Plan: ", what, "_slots must be >= 0, got ", num(slots));
  return Work{items, combine, slots};
}

}  // namespace

CallPlan::CallPlan(const std::string& score_, const c10::Dict<std::string, at::Tensor>& t,
                   const c10::Dict<std::string, int64_t>& ints,
                   const c10::Dict<std::string, double>& floats)
    : score(&find_score(score_)), score_name(score_) {
  check_names(t, kTensorNames, "layout");
  check_names(ints, kIntNames, "integer");
  check_names(floats, kFloatNames, "float");
  L.rowptr = tensor(t, "rowptr");
  L.col = tensor(t, "col");
  check_index(L.rowptr, "rowptr", -1, L.rowptr);
  check_index(L.col, "col", -1, L.rowptr);
  TORCH_CHECK(L.rowptr.numel() >= 1, "dfgnn.Plan: rowptr must have N_dst + 1 entries");
  n_dst = L.rowptr.numel() - 1;
  n_src = integer(ints, "n_src");
  num_edges = L.col.numel();
  TORCH_CHECK(n_src >= 0 && n_src < INT32_MAX && n_dst < INT32_MAX && num_edges < INT32_MAX,
              "dfgnn.Plan: graphs with more than 2^31 - 1 nodes or edges need int64 kernels");
  L.chunk = integer(ints, "chunk");
  TORCH_CHECK(L.chunk > 0, "dfgnn.Plan: chunk must be > 0, got ", num(L.chunk));
  L.rw = work(tensor(t, "row_items"), tensor(t, "row_combine"), integer(ints, "row_slots"), "row",
              L.rowptr);
  L.csr_row = opt_tensor(t, "csr_row");
  if (L.csr_row.defined()) check_index(L.csr_row, "csr_row", num_edges, L.rowptr);
  L.tiles = opt_tensor(t, "tiles");
  const char* csc_names[] = {"colptr", "row", "perm", "col_items", "col_combine"};
  int csc_given = 0;
  for (const char* n : csc_names) csc_given += t.contains(n) ? 1 : 0;
  TORCH_CHECK(csc_given == 0 || csc_given == 5, "dfgnn.Plan: the CSC entries (colptr, row, "
              "perm, col_items, col_combine) come all together or not at all");
  has_csc = csc_given == 5;
  if (has_csc) {
    L.colptr = tensor(t, "colptr");
    L.row = tensor(t, "row");
    L.perm = tensor(t, "perm");
    check_index(L.colptr, "colptr", n_src + 1, L.rowptr);
    check_index(L.row, "row", num_edges, L.rowptr);
    check_index(L.perm, "perm", num_edges, L.rowptr);
    L.cw = work(tensor(t, "col_items"), tensor(t, "col_combine"), integer(ints, "col_slots"),
                "col", L.rowptr);
  }

  p.pmf = flag(ints, "pmf");
  p.vector_rows = flag(ints, "vector_rows");
  p.two_rows = flag(ints, "two_rows");
  p.mma = flag(ints, "mma");
  p.merge_in_kernel = flag(ints, "merge_in_kernel");
  p.bwd_one_launch = flag(ints, "bwd_one_launch");
  p.mma_backward = flag(ints, "mma_backward");
  p.bwd_merge_in_kernel = flag(ints, "bwd_merge_in_kernel");
  p.normalize_first = flag(ints, "normalize_first");
  // Optional: absent where the plan has no dense-tile backward.
  p.dense_backward = ints.contains("dense_backward") && flag(ints, "dense_backward");
  p.save_weights = !ints.contains("save_weights") || flag(ints, "save_weights");
  // Optional: absent where the score has one SMMF forward.
  p.row_walk = ints.contains("row_walk") && flag(ints, "row_walk");
  auto dc = floats.find("dense_cells");
  p.dense_cells = dc == floats.end() ? 0.0 : dc->value();

  TORCH_CHECK(!p.pmf || L.csr_row.defined(), "dfgnn.Plan: pmf needs csr_row");
  TORCH_CHECK(!p.two_rows || (!p.pmf && L.rw.num_slots == 0), "dfgnn.Plan: two_rows needs SMMF "
              "(pmf=0) and no split rows (row_slots == 0), got pmf=", num(p.pmf),
              ", row_slots=", num(L.rw.num_slots));
  TORCH_CHECK(!p.mma || !p.pmf, "dfgnn.Plan: mma (the tensor-core forward) needs SMMF (pmf=0)");
  TORCH_CHECK(!p.row_walk || !p.pmf, "dfgnn.Plan: row_walk (an SMMF forward) needs pmf=0");
  TORCH_CHECK(!p.normalize_first || score->normalizes, "dfgnn.Plan: normalize_first=1, but the ",
              score_name, " score has no normalised form");
  // The paths the score has (ScorePaths, host/score_ops.h): the one place that
  // holds a plan to them.
  const ScorePaths& has = score->paths;
  for (auto [asked, there, what] :
       {std::make_tuple(p.pmf, has.pmf, "pmf"), std::make_tuple(p.mma, has.mma, "mma"),
        std::make_tuple(p.mma_backward, has.mma, "mma_backward"),
        std::make_tuple(p.dense_cells > 0.0, has.dense_tiles, "dense_cells"),
        std::make_tuple(p.dense_backward, has.dense_tiles && has.mma, "dense_backward"),
        std::make_tuple(p.two_rows, has.two_rows, "two_rows"),
        std::make_tuple(p.bwd_one_launch, has.one_launch_backward, "bwd_one_launch"),
        std::make_tuple(p.row_walk, has.row_walk, "row_walk")})
    TORCH_CHECK(!asked || there, "dfgnn.Plan: ", what, " is set, but the ", score_name,
                " score has no such path (ScoreSpec and its registration)");
  TORCH_CHECK(!p.mma_backward || !p.bwd_one_launch, "dfgnn.Plan: mma_backward needs two "
              "backward launches (bwd_one_launch=0): its CSC walk reads the CSR walk's weights");
  TORCH_CHECK((p.dense_cells > 0.0) == L.tiles.defined(), "dfgnn.Plan: dense tiles need both a "
              "tile plan and dense_cells > 0, got dense_cells=", std::to_string(p.dense_cells),
              L.tiles.defined() ? " with" : " without", " a tile plan");
  if (L.tiles.defined()) {
    TORCH_CHECK(p.mma, "dfgnn.Plan: dense tiles run in the tensor-core forward: they need mma=1");
    check_tiles(L.tiles, "tiles", n_dst, "destination", L.rowptr);
  }
  // The dense-tile backward: both tile plans and the tensor-core walks (its
  // sparse blocks run their units); the transposed plan comes with the CSC, that
  // is where the call records a backward.
  L.tiles_t = opt_tensor(t, "tiles_t");
  L.rank_pos = opt_tensor(t, "rank_pos");
  TORCH_CHECK(!p.dense_backward || (p.mma_backward && L.tiles.defined()), "dfgnn.Plan: "
              "dense_backward runs in the tensor-core backward over the forward's dense tiles: "
              "it needs mma_backward=1 and dense_cells > 0");
  TORCH_CHECK(L.tiles_t.defined() == (p.dense_backward && has_csc), "dfgnn.Plan: the "
              "transposed tile plan (tiles_t) comes iff dense_backward=1 and the CSC is given, "
              "got dense_backward=", num(p.dense_backward), L.tiles_t.defined() ? " with" :
              " without", " tiles_t", has_csc ? " and with" : " and without", " the CSC");
  TORCH_CHECK(!L.rank_pos.defined() || L.tiles_t.defined(), "dfgnn.Plan: rank_pos is the "
              "dense-tile backward's: it comes only with tiles_t");
  // Only the dense-tile dkv launch recomputes every weight; the other walks
  // read the ones the first launch saves.
  TORCH_CHECK(p.save_weights || p.dense_backward, "dfgnn.Plan: save_weights=0 needs "
              "dense_backward=1 (only the dense-tile backward recomputes the weights)");
  if (L.tiles_t.defined()) {
    check_tiles(L.tiles_t, "tiles_t", n_src, "source", L.rowptr);
    if (L.rank_pos.defined()) check_index(L.rank_pos, "rank_pos", num_edges, L.rowptr);
  }
}

}  // namespace dfgnn
