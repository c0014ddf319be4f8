// Host entry points of the CUDA kernels; bindings.cpp checks inputs and
// registers them under TORCH_LIBRARY(dfgnn).
#pragma once
#include <ATen/ATen.h>
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
// combine[r] = (row, first_slot, n_slots); out[row] = sum of partial[first_slot ...].
void combine_partials(const at::Tensor& partial, const at::Tensor& combine, at::Tensor& out);

// Split rows of an online-softmax kernel: merges each item's (max, sum,
// unnormalised acc) partial into out [N, H, C] and lse2 [N, H].
void merge_softmax_partials(const at::Tensor& partial, const at::Tensor& partial_ml,
                            const at::Tensor& combine, at::Tensor& out, at::Tensor& lse2);

// Attention weights of split rows: raw base-2 scores -> softmax once lse2 is final.
void normalize_split_attn(const at::Tensor& combine, const at::Tensor& rowptr,
                          const at::Tensor& lse2, at::Tensor& attn);

// Node-parallel work items over a CSR / CSC pointer (pyg_dfgnn.ops.schedule.split_work):
// items [I, 3] = (row, first edge, partial slot or -1), at most `chunk` edges each;
// combine [R, 3] = (row, first slot, n slots) for the R rows split over several items.
struct Work {
  at::Tensor items;
  at::Tensor combine;
  int64_t num_slots;
};

// PMF step 2 (softmax_spmm.cu): out [N_dst, H, C] and lse2 [N_dst, H] from base-2
// scores [E, H] in CSR order and rows x [N_src, H, C]; attn (nullable) [E, H]
// receives the softmax weights.
void softmax_spmm(const at::Tensor& x, const at::Tensor& score, const at::Tensor& rowptr,
                  const at::Tensor& col, const Work& rw, int64_t chunk, at::Tensor& out,
                  at::Tensor& lse2, float* attn, double dropout, int64_t seed);

// Outputs and scratch of one forward call, SMMF or PMF (softmax_spmm.cu):
// out [N_dst, H, C] (dtype of x), lse2 [N_dst, H] and attn [E, H] (or [0]);
// SMMF's split-row partials (merged in the kernel when `counters` is set), or
// PMF's base-2 scores [E, H].
struct ForwardCall {
  bool pmf, need_attn;
  at::Tensor out, lse2, attn, partial, partial_ml, score;
  int* counters = nullptr;
  ForwardCall(const at::Tensor& x, int64_t n_dst, int64_t n_edges, const Work& rw, bool pmf,
              bool need_attn);
  float* attn_ptr() { return need_attn ? attn.data_ptr<float>() : nullptr; }
  // After the score / SMMF kernel: PMF runs softmax_spmm over `score` and rows
  // x; SMMF merges the split rows' partials unless the kernel did.
  void finish(const at::Tensor& x, const at::Tensor& rowptr, const at::Tensor& col,
              const Work& rw, int64_t chunk, double dropout, int64_t seed);
};

std::tuple<at::Tensor, at::Tensor, at::Tensor> gt_forward_cuda(
    const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& rowptr,
    const at::Tensor& col, const Work& rw, const c10::optional<at::Tensor>& csr_row,
    int64_t chunk, double scale, double dropout, int64_t seed, bool pmf, bool need_attn);

// The tensor-core SMMF forward (gt_forward_mma.cu) for fp16 / bf16 and C in
// {32, 64, 128} on 16-byte aligned rows: writes out [N_dst, H, C] and lse2
// [N_dst, H] for graphs without split rows (any in-degree works, but a warp owns
// 8 whole rows), no dropout and no attention weights.
bool gt_forward_mma_supports(at::ScalarType st, int64_t C, bool aligned16);
void gt_forward_mma(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                    const at::Tensor& rowptr, const at::Tensor& col, at::Tensor& out,
                    at::Tensor& lse2, double scale);

std::tuple<at::Tensor, at::Tensor, at::Tensor> gt_backward_cuda(
    const at::Tensor& grad_out, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
    const at::Tensor& out, const at::Tensor& lse2, const at::Tensor& rowptr, const at::Tensor& col,
    const Work& rw, const at::Tensor& colptr, const at::Tensor& row, const at::Tensor& perm,
    const Work& cw, int64_t chunk, double scale, double dropout, int64_t seed);

std::tuple<at::Tensor, at::Tensor, at::Tensor> gat_forward_cuda(
    const at::Tensor& a_dst, const at::Tensor& a_src, const at::Tensor& x, const at::Tensor& rowptr,
    const at::Tensor& col, const Work& rw, const c10::optional<at::Tensor>& csr_row,
    int64_t chunk, double negative_slope, double dropout, int64_t seed, bool pmf,
    bool need_attn);

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
    const at::Tensor& col, const Work& rw, int64_t chunk, bool need_attn);

std::tuple<at::Tensor, at::Tensor> l2norm_backward_cuda(const at::Tensor& dk, const at::Tensor& dq,
                                                        const at::Tensor& k,
                                                        const at::Tensor& rnorm,
                                                        const at::Tensor& beta);

}  // namespace dfgnn
