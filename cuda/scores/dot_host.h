// The dot score's host entry points (scores/dot.cpp registers them; the cosine
// score's normalise-then-dot path calls them too): the forward and backward
// over the CUDA-core walks of the functor scores/dot.cuh (dot_forward.cu,
// dot_backward.cu), and the tensor-core and dense-tile kernels that only this
// score has. A plain header, so that the .cpp registration needs no nvcc.
#pragma once
#include <tuple>

#include "host/ops.h"
#include "host/params.h"
#include "host/tensor.h"

namespace dfgnn {

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
// The same call over dense tiles (dot_forward_dense.cu): blocks of 64 rows whose
// key window the layout's tile plan (L.tiles, pyg_dfgnn/ops/tiles.py) has, and
// holds at most `cells_per_edge` window cells per edge, run dense, the others
// on the sparse units (blocks without edges too). Needs L.tiles (checked by
// check_tile_plan) and cells_per_edge > 0.
void gt_forward_dense(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                      const LayoutView& L, double cells_per_edge, at::Tensor& out,
                      float* out32, at::Tensor& lse2, double scale);

// The dot score's backward (dot_backward.cu): (dq, dk, dv) with the walks `plan`
// names (bwd_one_launch, mma_backward, dense_backward, bwd_merge_in_kernel,
// vector_rows);
// out32: the forward's rows in float32 (fp16 / bf16 inputs: D comes from them,
// in the tensor-core dq walk or launch, else out_dsum in host/backward_launch.cuh;
// fp32: unused).
std::tuple<at::Tensor, at::Tensor, at::Tensor> gt_backward_cuda(
    const at::Tensor& grad_out, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
    const at::Tensor& out, const at::Tensor& lse2, const at::Tensor& out32, const LayoutView& L,
    double scale, double dropout, int64_t seed, const KernelPlan& plan,
    const GradsOut* into = nullptr);

// The backward's dq walk on tensor cores (dot_backward_mma.cu): dq [N_dst, H, C]
// and each edge's (P, dS) into pds [E, H, 2] (CSR order) for the CSC walk, from
// the half inputs, lse2 and out32 (the forward's fp32 rows [N_dst, H, C]: each
// unit computes D = dO . O of its rows). Needs
// fp16 / bf16, C in {32, 64, 128}, 16-byte aligned rows and no dropout (a warp
// walks 8 whole rows, whatever L's work items; gt_backward_cuda checks the plan).
bool gt_backward_mma_supports(at::ScalarType st, int64_t C, bool aligned16);
void gt_backward_dq_mma(const at::Tensor& grad_out, const at::Tensor& q, const at::Tensor& k,
                        const at::Tensor& v, const at::Tensor& lse2, const float* out32,
                        const LayoutView& L, at::Tensor& dq, float* pds, double scale);
// The CSC walk on tensor cores (dot_backward_mma.cu): dk, dv [N_src, H, C] from the
// dq walk's pds, dO and q; walks whole columns (L's CSC work items unused).
void gt_backward_dkv_mma(const at::Tensor& grad_out, const at::Tensor& q, const float* pds,
                         const LayoutView& L, at::Tensor& dk, at::Tensor& dv, double scale);
// The same two launches over dense tiles (dot_backward_dense.cu; the plan's
// dense_backward): the dq launch over the layout's tile plan (L.tiles), writing
// pds for every edge (through L.rank_pos where defined), the dkv launch over the
// transposed graph's (L.tiles_t), recomputing P and dS in its dense blocks; a
// block whose window holds more than `cells_per_edge` cells per edge runs the
// sparse units of the two walks above. pds null (the plan's save_weights off):
// the dq launch writes no weights and every dkv block with a window runs dense.
// The dq launch writes each row's D into dsum [N_dst, H] (fp32), which the dkv
// launch reads. Needs what those need, both tile plans and the CSC.
void gt_backward_dq_dense(const at::Tensor& grad_out, const at::Tensor& q, const at::Tensor& k,
                          const at::Tensor& v, const at::Tensor& lse2, const float* out32,
                          float* dsum, const LayoutView& L, double cells_per_edge,
                          at::Tensor& dq, float* pds, double scale);
void gt_backward_dkv_dense(const at::Tensor& grad_out, const at::Tensor& q, const at::Tensor& k,
                           const at::Tensor& v, const at::Tensor& lse2, const float* dsum,
                           const float* pds, const LayoutView& L, double cells_per_edge,
                           at::Tensor& dk, at::Tensor& dv, double scale);

}  // namespace dfgnn
