// Host entry points of the CUDA kernels. Each obeys the kernel plan it is given
// or raises (TORCH_CHECK, naming the op and the plan's field) where the call
// cannot run it; the callers (the scores' files, cuda/scores/, and the ops in
// glue/) check inputs first.
#pragma once
#include "host/tensor.h"
#include <tuple>

#include "host/params.h"

namespace dfgnn {

// PMF step 2 (softmax_spmm.cu): out [N_dst, H, C] and lse2 [N_dst, H] from base-2
// scores [E, H] in CSR order and rows x [N_src, H, C]; attn (nullable) [E, H]
// receives the softmax weights; out32 (nullable) [N_dst, H, C] float32 the rows
// before their rounding (ForwardCall::out32).
// `partial`: [L.rw.num_slots, H, C] floats of scratch for the split rows, merged
// by separate launches; `vector_rows`: the plan's (the caller checked x and out).
void softmax_spmm(const at::Tensor& x, const float* score, float* partial, const LayoutView& L,
                  bool vector_rows, at::Tensor& out, float* out32, at::Tensor& lse2,
                  float* attn, double dropout, int64_t seed);

// The dot score's forward (dot_forward.cu): (out, lse2, attn, out32) of
// dot-product attention over L's CSR, with the kernels `plan` names (pmf,
// vector_rows, two_rows, mma, dense_cells, merge_in_kernel); out32: out in
// float32 where keep_out32 and q is fp16 / bf16, else undefined (ForwardCall).
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> gt_forward_cuda(
    const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const LayoutView& L,
    double scale, double dropout, int64_t seed, bool need_attn, const KernelPlan& plan,
    bool keep_out32);

// The tensor-core SMMF forward (dot_forward_mma.cu) for fp16 / bf16 and C in
// {32, 64, 128} on 16-byte aligned rows: writes out [N_dst, H, C] and lse2
// [N_dst, H] whatever the work items (a warp owns 8 whole rows of any length),
// without dropout and attention weights; out32 (nullable) receives the rows in
// float32 too. The dense-tile variant of the same call is gt_forward_dense; the
// plan's dense_cells picks between them.
bool gt_forward_mma_supports(at::ScalarType st, int64_t C, bool aligned16);
void gt_forward_mma(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                    const LayoutView& L, at::Tensor& out, float* out32, at::Tensor& lse2,
                    double scale);
// The tile plan's layout (pyg_dfgnn/ops/tiles.py): kTileRows destination rows per
// tile, kTileMetaInts ints per tile before the edge masks.
constexpr int kTileRows = 64;
constexpr int kTileMetaInts = 8;
// The same call over dense tiles (dot_forward_dense.cu): blocks of 64 rows whose
// key window the layout's tile plan (L.tiles, pyg_dfgnn/ops/tiles.py) has, and
// holds at most `cells_per_edge` window cells per edge, run dense, the others
// on the sparse units (blocks without edges too). Needs L.tiles (checked by
// check_tile_plan) and cells_per_edge > 0.
void gt_forward_dense(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                      const LayoutView& L, double cells_per_edge, at::Tensor& out,
                      float* out32, at::Tensor& lse2, double scale);

// Outputs a GT backward writes into instead of allocating them: dq [N_dst, H, C],
// dk and dv [N_src, H, C] with unit stride in C, C apart per head, their rows
// stride(0) >= H * C elements apart (dk's and dv's equal): column slices of one
// joined gradient (glue/projections.cpp). An undefined entry is allocated (one of dk
// and dv given: the other with its strides). With the plan's vector_rows every
// given row must be 16-byte aligned (else the call raises: pass it undefined).
struct GradsOut {
  at::Tensor dq, dk, dv;
};

// The dot score's backward (dot_backward.cu): (dq, dk, dv) with the walks `plan`
// names (bwd_one_launch, mma_backward, bwd_merge_in_kernel, vector_rows);
// out32: the forward's rows in float32 (fp16 / bf16 inputs: D comes from them,
// out_dsum in host/backward_launch.cuh; fp32: unused).
std::tuple<at::Tensor, at::Tensor, at::Tensor> gt_backward_cuda(
    const at::Tensor& grad_out, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
    const at::Tensor& out, const at::Tensor& lse2, const at::Tensor& out32, const LayoutView& L,
    double scale, double dropout, int64_t seed, const KernelPlan& plan,
    const GradsOut* into = nullptr);

// The GT backward's dq walk on tensor cores (dot_backward_mma.cu): dq [N_dst, H, C]
// and each edge's (P, dS) into pds [E, H, 2] (CSR order) for the CSC walk, from
// the half inputs, lse2 and dsum (D [N_dst, H] in fp32, out_dsum). Needs
// fp16 / bf16, C in {32, 64, 128}, 16-byte aligned rows and no dropout (a warp
// walks 8 whole rows, whatever L's work items; gt_backward_cuda checks the plan).
bool gt_backward_mma_supports(at::ScalarType st, int64_t C, bool aligned16);
void gt_backward_dq_mma(const at::Tensor& grad_out, const at::Tensor& q, const at::Tensor& k,
                        const at::Tensor& v, const at::Tensor& lse2, const float* dsum,
                        const LayoutView& L, at::Tensor& dq, float* pds, double scale);
// The CSC walk on tensor cores (dot_backward_mma.cu): dk, dv [N_src, H, C] from the
// dq walk's pds, dO and q; walks whole columns (L's CSC work items unused).
void gt_backward_dkv_mma(const at::Tensor& grad_out, const at::Tensor& q, const float* pds,
                         const LayoutView& L, at::Tensor& dk, at::Tensor& dv, double scale);

// The additive score (GAT; additive_forward.cu, additive_backward.cu): the plan's pmf,
// vector_rows, two_rows, merge_in_kernel (forward) and bwd_merge_in_kernel. A
// defined a_edge [E, H] (CSR order) adds the per-edge term (the additive_edge
// score); the backward then returns its gradient fourth: (d a_dst, d a_src, dx
// [, d a_edge]).
std::tuple<at::Tensor, at::Tensor, at::Tensor> gat_forward_cuda(
    const at::Tensor& a_dst, const at::Tensor& a_src, const at::Tensor& x, const LayoutView& L,
    double negative_slope, double dropout, int64_t seed, bool need_attn,
    const KernelPlan& plan, const at::Tensor& a_edge);

std::vector<at::Tensor> gat_backward_cuda(
    const at::Tensor& grad_out, const at::Tensor& a_dst, const at::Tensor& a_src,
    const at::Tensor& x, const at::Tensor& out, const at::Tensor& lse2, const LayoutView& L,
    double negative_slope, double dropout, int64_t seed, const KernelPlan& plan,
    const at::Tensor& a_edge);

// AGNN's row normalisation (normalize.cu): k = x / max(||x||, eps), q = beta k,
// rnorm [N, H] = +-1 / max(||x||, eps) (negative: clamped); beta is a 1-element
// float32 tensor. The backward returns dx and the per-row terms of dbeta.
// `vector_rows`: 16-byte row accesses (x's rows must be 16-byte aligned) or
// scalar ones, as the calling plan says. `op` names the op in errors (the cosine
// score's forward, or its backward, which recomputes k and q).
std::tuple<at::Tensor, at::Tensor, at::Tensor> l2norm_forward_cuda(const char* op,
                                                                   const at::Tensor& x,
                                                                   const at::Tensor& beta,
                                                                   double eps, bool vector_rows);
// rnorm [N, H] of l2norm_forward_cuda alone (no k, q written).
at::Tensor l2norm_rnorm_cuda(const at::Tensor& x, double eps, bool vector_rows);

// AGNN's attention over x (scores/cosine.cu): softmax of beta cos(x_i, x_j) over
// the in-edges, aggregating the unnormalised x_j; SMMF, no dropout, fp32. Returns
// (out, lse2, attn, rnorm), lse2 as gt_forward_cuda's for q = beta k,
// k = x / max(||x||, eps), scale 1. The plan's vector_rows, two_rows and
// merge_in_kernel; pmf raises.
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> cosine_forward_cuda(
    const at::Tensor& x, const at::Tensor& beta, double eps, const LayoutView& L,
    bool need_attn, const KernelPlan& plan);

std::tuple<at::Tensor, at::Tensor> l2norm_backward_cuda(const at::Tensor& dk, const at::Tensor& dq,
                                                        const at::Tensor& k,
                                                        const at::Tensor& rnorm,
                                                        const at::Tensor& beta,
                                                        bool vector_rows);

}  // namespace dfgnn
