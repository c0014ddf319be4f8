// Host entry points of the CUDA kernels; bindings.cpp checks inputs and
// registers them under TORCH_LIBRARY(dfgnn).
#pragma once
#include <ATen/ATen.h>
#include <initializer_list>
#include <tuple>

namespace dfgnn {

at::Tensor csr_rowptr_cuda(const at::Tensor& index, int64_t num_rows);

// Arrival counters for split rows merged by their last item (arrive_last,
// common.cuh): int32 zeros, at least n of them, for the current device and
// stream, zero again after every kernel that uses them. nullptr when n is 0 or
// while the stream is captured into a CUDA graph: the caller then merges with
// the separate kernels below.
int* split_row_counters(int64_t n);

// Sums the fp32 partial rows of split rows into `out` (dtype of out):
// combine[r] = (row, first_slot, n_slots); out[row] = sum of partial[first_slot ...]
// (partial: [num_slots, out.size(1) * ...] floats).
void combine_partials(const float* partial, int64_t num_slots, const at::Tensor& combine,
                      at::Tensor& out);

// Split rows of an online-softmax kernel: merges each item's (max, sum,
// unnormalised acc) partial ([num_slots, H, C] and [num_slots, H, 2] floats) into
// out [N, H, C] and lse2 [N, H].
void merge_softmax_partials(const float* partial, const float* partial_ml, int64_t num_slots,
                            const at::Tensor& combine, at::Tensor& out, at::Tensor& lse2);

// Attention weights of split rows: raw base-2 scores -> softmax once lse2 is final.
void normalize_split_attn(const at::Tensor& combine, const at::Tensor& rowptr,
                          const at::Tensor& lse2, at::Tensor& attn);

// The float32 scratch of one call (split-row partials, row sums, PMF scores):
// regions of the given numbers of floats, an empty region nullptr, each on a
// 256-byte boundary (the kernels store 16-byte vectors). Each at::empty costs a
// few µs of host time and a small graph's call is host-bound, so small scratch
// (at most kSharedBytes) shares the allocation of one of the call's outputs,
// after its elements; larger scratch (a super-node graph's partial rows, PMF scores) gets
// one of its own, freed when the call returns. The outputs themselves keep
// storages of their own: the ops' schemas promise outputs that do not alias one
// another (torch.library.opcheck checks it).
class Scratch {
 public:
  // 2 MiB: PubMed's two-launch backward scratch (split-row partials and the
  // per-edge (P', dS), 1.5 MB) fits, one allocation fewer per backward.
  static constexpr int64_t kSharedBytes = int64_t(2) << 20;
  explicit Scratch(std::initializer_list<int64_t> floats);
  // An uninitialised contiguous tensor of `sizes` and `opts` (the call's output,
  // at storage offset 0) and, in the same allocation or one of their own, the
  // scratch regions.
  at::Tensor empty_with(at::IntArrayRef sizes, const at::TensorOptions& opts);
  float* operator[](size_t i) const { return ptr_[i]; }

 private:
  void place(float* base);
  static constexpr size_t kMaxRegions = 4;
  int64_t offset_[kMaxRegions] = {-1, -1, -1, -1};  // floats from the scratch's start
  int64_t floats_ = 0;
  at::Tensor own_;
  float* ptr_[kMaxRegions] = {nullptr, nullptr, nullptr, nullptr};
};

// Node-parallel work items over a CSR / CSC pointer (pyg_dfgnn.work_items.split_work):
// items [I, 3] = (row, first edge, partial slot or -1), at most `chunk` edges each;
// combine [R, 3] = (row, first slot, n slots) for the R rows split over several items.
struct Work {
  at::Tensor items;
  at::Tensor combine;
  int64_t num_slots;
};

// The counters of a backward call's CSR (`csr`) and CSC (`csc`) walks (layout.cu).
// Walks in two launches merge their split rows one after the other and share one
// buffer; walks in one launch (`concurrent`) merge at the same time and get
// disjoint regions of it. Only the fp32 backward kernels carry the merge
// (kMergeInBackward, common.cuh), so other dtypes get nullptr and the separate
// combine launches.
struct BackwardCounters {
  int* csr;
  int* csc;
};
BackwardCounters backward_split_counters(at::ScalarType st, const Work& rw, const Work& cw,
                                         int64_t heads, bool concurrent = false);

// PMF step 2 (softmax_spmm.cu): out [N_dst, H, C] and lse2 [N_dst, H] from base-2
// scores [E, H] in CSR order and rows x [N_src, H, C]; attn (nullable) [E, H]
// receives the softmax weights.
// `partial`: [rw.num_slots, H, C] floats of scratch for the split rows.
void softmax_spmm(const at::Tensor& x, const float* score, float* partial,
                  const at::Tensor& rowptr, const at::Tensor& col, const Work& rw, int64_t chunk,
                  at::Tensor& out, at::Tensor& lse2, float* attn, double dropout, int64_t seed);

// Outputs and scratch of one forward call, SMMF or PMF (softmax_spmm.cu):
// out [N_dst, H, C] (dtype of x), lse2 [N_dst, H] and attn [E, H] (or [0]);
// scratch: the split rows' partial rows [slots, H, C] (merged in the kernel
// when `counters` is set), SMMF's partial (max, sum) [slots, H, 2] and PMF's
// base-2 scores [E, H].
struct ForwardCall {
  bool pmf, need_attn;
  at::Tensor out, lse2, attn;  // lse2 holds small scratch after its elements
  Scratch scratch;
  int* counters = nullptr;
  ForwardCall(const at::Tensor& x, int64_t n_dst, int64_t n_edges, const Work& rw, bool pmf,
              bool need_attn);
  float* attn_ptr() { return need_attn ? attn.data_ptr<float>() : nullptr; }
  float* partial() const { return scratch[0]; }
  float* partial_ml() const { return scratch[1]; }
  float* score() const { return scratch[2]; }
  // After the score / SMMF kernel: PMF runs softmax_spmm over `score` and rows
  // x; SMMF merges the split rows' partials unless the kernel did.
  void finish(const at::Tensor& x, const at::Tensor& rowptr, const at::Tensor& col,
              const Work& rw, int64_t chunk, double dropout, int64_t seed);
};

std::tuple<at::Tensor, at::Tensor, at::Tensor> gt_forward_cuda(
    const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& rowptr,
    const at::Tensor& col, const Work& rw, const c10::optional<at::Tensor>& csr_row,
    int64_t chunk, double scale, double dropout, int64_t seed, bool pmf, bool need_attn,
    const c10::optional<at::Tensor>& dense_tiles, double dense_cells, bool mma, bool two_rows);

// The tensor-core SMMF forward (gt_forward_mma.cu) for fp16 / bf16 and C in
// {32, 64, 128} on 16-byte aligned rows: writes out [N_dst, H, C] and lse2
// [N_dst, H] whatever the work items (a warp owns 8 whole rows of any length),
// without dropout and attention weights. With a tile plan and dense_cells > 0 it
// runs over dense tiles (gt_forward_dense).
bool gt_forward_mma_supports(at::ScalarType st, int64_t C, bool aligned16);
void gt_forward_mma(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                    const at::Tensor& rowptr, const at::Tensor& col,
                    const c10::optional<at::Tensor>& dense_tiles, double dense_cells,
                    at::Tensor& out, at::Tensor& lse2, double scale);
// The tile plan's layout (pyg_dfgnn/ops/tiles.py): kTileRows destination rows per
// tile, kTileMetaInts ints per tile before the edge masks.
constexpr int kTileRows = 64;
constexpr int kTileMetaInts = 8;
// The same call over dense tiles (gt_forward_dense.cu): blocks of 64 rows whose
// key window the layout's tile plan (`plan`, pyg_dfgnn/ops/tiles.py) has, and
// holds at most `cells_per_edge` window cells per edge, run dense, the others
// on the sparse units; false (nothing launched) without a plan, with
// cells_per_edge <= 0 or when the graph has no edges.
bool gt_forward_dense(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                      const at::Tensor& rowptr, const at::Tensor& col,
                      const c10::optional<at::Tensor>& plan, double cells_per_edge,
                      at::Tensor& out, at::Tensor& lse2, double scale);

std::tuple<at::Tensor, at::Tensor, at::Tensor> gt_backward_cuda(
    const at::Tensor& grad_out, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
    const at::Tensor& out, const at::Tensor& lse2, const at::Tensor& rowptr, const at::Tensor& col,
    const Work& rw, const at::Tensor& colptr, const at::Tensor& row, const at::Tensor& perm,
    const Work& cw, int64_t chunk, double scale, double dropout, int64_t seed, bool one_launch);

std::tuple<at::Tensor, at::Tensor, at::Tensor> gat_forward_cuda(
    const at::Tensor& a_dst, const at::Tensor& a_src, const at::Tensor& x, const at::Tensor& rowptr,
    const at::Tensor& col, const Work& rw, const c10::optional<at::Tensor>& csr_row,
    int64_t chunk, double negative_slope, double dropout, int64_t seed, bool pmf,
    bool need_attn, bool two_rows);

std::tuple<at::Tensor, at::Tensor, at::Tensor> gat_backward_cuda(
    const at::Tensor& grad_out, const at::Tensor& a_dst, const at::Tensor& a_src,
    const at::Tensor& x, const at::Tensor& out, const at::Tensor& lse2, const at::Tensor& rowptr,
    const at::Tensor& col, const Work& rw, const at::Tensor& colptr, const at::Tensor& row,
    const at::Tensor& perm, const Work& cw, int64_t chunk, double negative_slope, double dropout,
    int64_t seed);

// AGNN's row normalisation (normalize.cu): k = x / max(||x||, eps), q = beta k,
// rnorm [N, H] = +-1 / max(||x||, eps) (negative: clamped); beta is a 1-element
// float32 tensor. The backward returns dx and the per-row terms of dbeta.
std::tuple<at::Tensor, at::Tensor, at::Tensor> l2norm_forward_cuda(const at::Tensor& x,
                                                                   const at::Tensor& beta,
                                                                   double eps);
// rnorm [N, H] of l2norm_forward_cuda alone (no k, q written).
at::Tensor l2norm_rnorm_cuda(const at::Tensor& x, double eps);

// AGNN's attention over x (gt_forward.cu): softmax of beta cos(x_i, x_j) over the
// in-edges, aggregating the unnormalised x_j; SMMF, no dropout, fp32. Returns
// (out, lse2, attn, rnorm), lse2 as gt_forward_cuda's for q = beta k,
// k = x / max(||x||, eps), scale 1.
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> cosine_forward_cuda(
    const at::Tensor& x, const at::Tensor& beta, double eps, const at::Tensor& rowptr,
    const at::Tensor& col, const Work& rw, int64_t chunk, bool need_attn, bool two_rows);

std::tuple<at::Tensor, at::Tensor> l2norm_backward_cuda(const at::Tensor& dk, const at::Tensor& dq,
                                                        const at::Tensor& k,
                                                        const at::Tensor& rnorm,
                                                        const at::Tensor& beta);

}  // namespace dfgnn
