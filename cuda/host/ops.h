// Host entry points of the shared CUDA kernels (kernels/), the tile plan's
// layout and the outputs a backward writes into; each score declares its own
// entry points in its header under scores/. Each obeys the kernel plan it is
// given or raises (TORCH_CHECK, naming the op and the plan's field) where the
// call cannot run it; the callers check inputs first.
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

// The tile plan's layout (pyg_dfgnn/ops/tiles.py): kTileRows destination rows per
// tile, kTileMetaInts ints per tile before the edge masks.
constexpr int kTileRows = 64;
constexpr int kTileMetaInts = 8;

// Outputs a backward writes into (row_backward, host/backward_launch.cuh) instead of allocating them: dq [N_dst, H, C],
// dk and dv [N_src, H, C] with unit stride in C, C apart per head, their rows
// stride(0) >= H * C elements apart (dk's and dv's equal): column slices of one
// joined gradient (glue/projections.cpp). An undefined entry is allocated (one of dk
// and dv given: the other with its strides). With the plan's vector_rows every
// given row must be 16-byte aligned (else the call raises: pass it undefined).
struct GradsOut {
  at::Tensor dq, dk, dv;
};

}  // namespace dfgnn
