// Host-side launch policy shared by the kernel families: the dtype and row-shape
// dispatch, block sizes, the SMMF forward's variants (two rows per warp, in-kernel
// split-row merge) and typed pointers for kernel arguments.
#pragma once

#include <cstdint>
#include <type_traits>
#include <ATen/Dispatch.h>
#include "host/tensor.h"
#include "device/numerics.cuh"
#include "device/row_shape.cuh"
#include "host/plan_checks.h"

namespace dfgnn {

// fp32 / fp16 / bf16 only (AT_DISPATCH_FLOATING_TYPES would also instantiate double).
#define DFGNN_DISPATCH_FLOAT_TYPES(TYPE, NAME, ...)                     \
  AT_DISPATCH_SWITCH(TYPE, NAME,                                        \
                     AT_DISPATCH_CASE(at::ScalarType::Float, __VA_ARGS__) \
                     AT_DISPATCH_CASE(at::ScalarType::Half, __VA_ARGS__)  \
                     AT_DISPATCH_CASE(at::ScalarType::BFloat16, __VA_ARGS__))

inline void check_launch() { C10_CUDA_KERNEL_LAUNCH_CHECK(); }

// Threads per block of the SMMF forward and the backward kernels (node-parallel
// lane groups, no shared memory). A block holds its SM slot until its slowest
// warp is done, and the items of one block differ in length (power-law rows,
// split-row tails), so small blocks keep the SMs fuller: 64 against 256 measured
// 10-20 % faster on GitHub and PubMed, 3-5 % on the sparse batches, within
// +-3 % on the dense batches and Reddit-like. 32 was no faster.
// The edge-parallel PMF kernels keep 256 (their warps are short-lived: 64 made
// PMF's SDDMM up to 1.7x slower).
constexpr int kNodeBlock = 64;

inline int ceil_div(int64_t a, int64_t b) { return (int)((a + b - 1) / b); }

template <int V> using IntC = std::integral_constant<int, V>;

// Picks the per-row thread mapping for head size C: VEC elements per access,
// G lanes per (node, head) row and NV accesses per lane (compile-time, so the
// row's q / accumulator fragments stay in registers). With `vector_rows`,
// 16-byte accesses (C * sizeof(T) a multiple of 16), else one element per
// access. Mirrored by pyg_dfgnn.ops.plan.kernel_supports() and vector_rows();
// returns false where C has no shape.
template <typename T, typename F>
bool dispatch_row_shape(int64_t C, bool vector_rows, F&& f) {
  constexpr int kVec = 16 / sizeof(T);
  if (vector_rows) {
    if (C % kVec != 0) return false;
    const int64_t nvec = C / kVec;
    if (nvec <= 4) { f(IntC<kVec>{}, IntC<4>{}, IntC<1>{}); return true; }
    if (nvec <= 8) { f(IntC<kVec>{}, IntC<8>{}, IntC<1>{}); return true; }
    if (nvec <= 16) { f(IntC<kVec>{}, IntC<16>{}, IntC<1>{}); return true; }
    if (nvec <= 32) { f(IntC<kVec>{}, IntC<32>{}, IntC<1>{}); return true; }
    if (nvec <= 64) { f(IntC<kVec>{}, IntC<32>{}, IntC<2>{}); return true; }
    if (nvec <= 128) { f(IntC<kVec>{}, IntC<32>{}, IntC<4>{}); return true; }
    return false;
  }
  if (C <= 32) { f(IntC<1>{}, IntC<32>{}, IntC<1>{}); return true; }
  if (C <= 64) { f(IntC<1>{}, IntC<32>{}, IntC<2>{}); return true; }
  if (C <= 128) { f(IntC<1>{}, IntC<32>{}, IntC<4>{}); return true; }
  return false;
}

template <typename T> struct TypeTag { using type = T; };

// The one dtype x row-shape dispatch of every kernel family's host code: calls
// f(RowShape<T, VEC, G, NV>{}) for `st` (fp32 / fp16 / bf16 as the kernels' CUDA
// type T), head size C and the plan's vector_rows, and raises, naming the op,
// where they have no kernel.
template <typename F>
void dispatch_rows(at::ScalarType st, int64_t C, bool vector_rows, const char* op, F&& f) {
  bool ok = false;
  DFGNN_DISPATCH_FLOAT_TYPES(st, "dfgnn", [&] {
    using T = typename cuda_type<scalar_t>::type;
    ok = dispatch_row_shape<T>(C, vector_rows, [&](auto VEC, auto G, auto NV) {
      f(RowShape<T, decltype(VEC)::value, decltype(G)::value, decltype(NV)::value>{});
    });
  });
  TORCH_CHECK(ok, op, ": head size C=", std::to_string(C), " has no fused kernel with ",
              vector_rows ? "vector_rows=True (16-byte rows: C * itemsize a multiple of 16, at "
                            "most 2048 bytes)"
                          : "vector_rows=False (scalar rows: C <= 128)",
              " (pyg_dfgnn.ops.plan.kernel_supports says which sizes are)");
}

// Typed views of a tensor's data for kernel arguments (dtypes are checked by
// the scores' check functions before any kernel is launched).
template <typename T> const T* cptr(const at::Tensor& t) {
  return static_cast<const T*>(t.const_data_ptr());
}
template <typename T> T* mptr(const at::Tensor& t) { return static_cast<T*>(t.data_ptr()); }

// Two rows per warp (the SMMF forwards of GT and GAT): fp32 heads of 5-32 vectors
// (C = 20 to 128) run G / 2 lanes x 2 vectors per row, so twice the rows are in
// flight per SM at the same registers, on large graphs whose rows all fit one work
// item (the batch graphs). Measured 6-25 % faster there (GT and GAT), but slower
// where one long chain is the kernel time: small graphs (+27 %) and split rows of
// super nodes (GT up to +16 %, GAT up to +11 %). bf16 / fp16 would spill (fp32 q
// and accumulator fragments twice as long per lane). Which calls run it is the
// kernel plan's decision (pyg_dfgnn/ops/plan.py, two_rows); these shapes compile
// the split-row merge out, so a call with split rows cannot run them
// (check_two_rows, plan_checks.h).
template <typename S>
constexpr bool kHasTwoRowsShape =
    std::is_same_v<typename S::T, float> && S::VEC == 4 && S::G >= 8 && S::NV == 1;

// Calls f(S', IntC<U'>) with an SMMF forward's row shape S': two rows per warp
// (G / 2 lanes x 2 vectors, U' = 2 edges in flight) where `two_rows` holds, else
// S with the default edges in flight (0). Raises (naming `op`) where two_rows
// asks for a variant the shape does not have.
template <typename S, typename F>
void with_smmf_shape(const char* op, bool two_rows, F&& f) {
  if constexpr (kHasTwoRowsShape<S>) {
    if (two_rows) return f(RowShape<typename S::T, S::VEC, S::G / 2, 2>{}, IntC<2>{});
  } else {
    TORCH_CHECK(!two_rows, op, ": two_rows=True, but this dtype and head shape have no "
                "two-rows-per-warp SMMF forward (float32 vector rows with C in [20, 128] only)");
  }
  f(S{}, IntC<0>{});
}

// Which kernels carry the merge code. Compiled in, it made the fp16 / bf16
// kernels' main loops slower even where it never runs (bf16 GT forward 4 %,
// forward + backward 5-6 % on the batch graphs, which have no split rows; fp32
// within 1 %). So the fp32 kernels always carry it (skipped at run
// time without counters), the half-precision forwards have a variant with it
// that is launched only when the call merges in the kernel (with_merge_variant),
// and the half-precision backward kernels keep the separate merge launch.
template <typename T> constexpr bool kMergeInBackward = std::is_same_v<T, float>;

// Calls f(std::bool_constant<MERGE>) with the SMMF forward variant for a call
// that merges split rows in the kernel (`merge`: it has counters) or not.
template <typename T, typename F>
void with_merge_variant(bool merge, F&& f) {
  if constexpr (std::is_same_v<T, float>) {
    f(std::true_type{});
  } else {
    if (merge) f(std::true_type{}); else f(std::false_type{});
  }
}

}  // namespace dfgnn
