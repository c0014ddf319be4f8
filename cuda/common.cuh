// Shared building blocks of the fused attention kernels: dtype traits, 16-byte
// vector loads that widen to fp32 registers, reductions over a lane group, and
// the counter-based dropout hash (regenerated in the backward, no mask stored).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cstdint>
#include <type_traits>

#include <ATen/ATen.h>
#include <ATen/Dispatch.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAException.h>

namespace dfgnn {

constexpr float kLog2e = 1.4426950408889634f;
constexpr float kNegInf = -__builtin_huge_valf();

// ---------------------------------------------------------------- conversions
__device__ __forceinline__ float to_float(float x) { return x; }
__device__ __forceinline__ float to_float(__half x) { return __half2float(x); }
__device__ __forceinline__ float to_float(__nv_bfloat16 x) { return __bfloat162float(x); }

template <typename T> __device__ __forceinline__ T from_float(float x);
template <> __device__ __forceinline__ float from_float<float>(float x) { return x; }
template <> __device__ __forceinline__ __half from_float<__half>(float x) { return __float2half_rn(x); }
template <> __device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float x) {
  return __float2bfloat16_rn(x);
}

// Maps ATen scalar types to the CUDA types the kernels use.
template <typename T> struct cuda_type { using type = T; };
template <> struct cuda_type<at::Half> { using type = __half; };
template <> struct cuda_type<at::BFloat16> { using type = __nv_bfloat16; };

// ---------------------------------------------------------------- vector I/O
// VEC elements of T per access: 16 bytes on the fast path (float4 / 8 halves),
// one element on the generic path (any head size C).
template <typename T, int VEC> struct Vec {
  static_assert(VEC * sizeof(T) == 16 || VEC == 1, "16-byte or scalar vectors");
  __device__ __forceinline__ static void load(const T* __restrict__ p, float (&out)[VEC]) {
    if constexpr (VEC == 1) {
      out[0] = to_float(__ldg(p));
    } else {
      uint4 raw = __ldg(reinterpret_cast<const uint4*>(p));
      const T* e = reinterpret_cast<const T*>(&raw);
#pragma unroll
      for (int i = 0; i < VEC; ++i) out[i] = to_float(e[i]);
    }
  }
  __device__ __forceinline__ static void store(T* __restrict__ p, const float (&in)[VEC]) {
    if constexpr (VEC == 1) {
      *p = from_float<T>(in[0]);
    } else {
      uint4 raw;
      T* e = reinterpret_cast<T*>(&raw);
#pragma unroll
      for (int i = 0; i < VEC; ++i) e[i] = from_float<T>(in[i]);
      *reinterpret_cast<uint4*>(p) = raw;
    }
  }
};

// ---------------------------------------------------------------- lane groups
// A group of G consecutive lanes (G a power of two <= 32) owns one (node, head)
// row. Every lane of a group runs the same trip counts, so shuffles use the
// group's own mask and groups of one warp may diverge from each other.
template <int G> __device__ __forceinline__ unsigned group_mask() {
  if constexpr (G == 32) {
    return 0xffffffffu;
  } else {
    const unsigned lane = threadIdx.x & 31u;
    return ((1u << G) - 1u) << (lane & ~(unsigned)(G - 1));
  }
}

template <int G> __device__ __forceinline__ float group_sum(float x, unsigned mask) {
#pragma unroll
  for (int o = G / 2; o > 0; o >>= 1) x += __shfl_xor_sync(mask, x, o);
  return x;
}

// Sums each of K values over the group and leaves all K sums in every lane:
// a reduce-scatter (each halving step ships half of the remaining values), the
// plain butterfly on what is left, then a broadcast of each sum from its owner.
// 2K - 1 + log2(G / K) shuffles instead of K log2(G): 10 instead of 20 for four
// scores over a warp, 17 instead of 40 for the backward's eight. Shuffles, not
// FMAs, bound the issue rate of the per-edge dot products.
template <int G, int K>
__device__ __forceinline__ void group_sum_many(float* x, unsigned mask) {
  if constexpr (K == 1) {
    x[0] = group_sum<G>(x[0], mask);
  } else if constexpr (K > G) {
    group_sum_many<G, K / 2>(x, mask);
    group_sum_many<G, K / 2>(x + K / 2, mask);
  } else {
    static_assert((K & (K - 1)) == 0, "K must be a power of two");
    const int lane = threadIdx.x & (G - 1);
#pragma unroll
    for (int m = K, o = G / 2; m > 1; m >>= 1, o >>= 1) {
      const bool hi = lane & o;  // keeps the upper half, ships the lower one
#pragma unroll
      for (int k = 0; k < m / 2; ++k) {
        const float send = hi ? x[k] : x[k + m / 2];
        const float keep = hi ? x[k + m / 2] : x[k];
        x[k] = keep + __shfl_xor_sync(mask, send, o);
      }
    }
    // x[0] is now a partial of value lane / (G / K) over the lanes that differ in
    // the upper bits; finish it over the lower bits.
#pragma unroll
    for (int o = G / (2 * K); o > 0; o >>= 1) x[0] += __shfl_xor_sync(mask, x[0], o);
    const float mine = x[0];
#pragma unroll
    for (int k = 0; k < K; ++k) x[k] = __shfl_sync(mask, mine, k * (G / K), G);
  }
}

template <int G> __device__ __forceinline__ float group_max(float x, unsigned mask) {
#pragma unroll
  for (int o = G / 2; o > 0; o >>= 1) x = fmaxf(x, __shfl_xor_sync(mask, x, o));
  return x;
}

// LeakyReLU of GAT's additive score and its derivative (at the pre-activation).
__device__ __forceinline__ float leaky_relu(float x, float slope) { return x > 0.f ? x : x * slope; }
__device__ __forceinline__ float leaky_grad(float x, float slope) { return x > 0.f ? 1.f : slope; }
// A GAT score in base 2, rounded once: __fmul_rn is never contracted into an FMA
// with the subtraction that follows, so the forward's row maximum and lse2 and the
// backward's recomputed exp2(score - lse2) see the same value, and a one-edge row
// gets P = 1 exactly (its score gradient is then exactly 0, as in PyG).
__device__ __forceinline__ float gat_score2(float pre, float slope) {
  return __fmul_rn(leaky_relu(pre, slope), kLog2e);
}

// ---------------------------------------------------------------- dropout
// Counter-based: keep(seed, e * H + h) depends only on the seed and the CSR edge
// position, so the backward (CSR or CSC walk) regenerates the forward's mask.
__device__ __forceinline__ uint64_t mix64(uint64_t z) {  // splitmix64 finaliser
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

// Uniform in [0, 1) with 24 random bits.
__device__ __forceinline__ float uniform01(uint64_t seed, uint64_t counter) {
  const uint64_t r = mix64(seed + 0x9e3779b97f4a7c15ULL * (counter + 1));
  return (float)(r >> 40) * (1.0f / 16777216.0f);
}

// Multiplier applied to a post-softmax weight: 0 (dropped) or 1 / (1 - p).
__device__ __forceinline__ float dropout_scale(float p, uint64_t seed, uint64_t counter) {
  return uniform01(seed, counter) >= p ? 1.0f / (1.0f - p) : 0.0f;
}

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

inline bool is_aligned16(const at::Tensor& t) {
  return reinterpret_cast<uintptr_t>(t.data_ptr()) % 16 == 0;
}

}  // namespace dfgnn

namespace dfgnn {

template <int V> using IntC = std::integral_constant<int, V>;

// Picks the per-row thread mapping for head size C: VEC elements per access,
// G lanes per (node, head) row and NV accesses per lane (compile-time, so the
// row's q / accumulator fragments stay in registers). Mirrored by
// pyg_dfgnn.ops.plan.kernel_supports(); returns false when C is too large.
template <typename T, typename F>
bool dispatch_row_shape(int64_t C, bool aligned16, F&& f) {
  constexpr int kVec = 16 / sizeof(T);
  if (aligned16 && C % kVec == 0) {
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
// f(TypeTag<T>, IntC<VEC>, IntC<G>, IntC<NV>) for `st` (fp32 / fp16 / bf16 as the
// kernels' CUDA type T) and head size C, and raises the same error, naming the op,
// when C has no kernel.
template <typename F>
void dispatch_rows(at::ScalarType st, int64_t C, bool aligned, const char* op, F&& f) {
  bool ok = false;
  DFGNN_DISPATCH_FLOAT_TYPES(st, "dfgnn", [&] {
    using T = typename cuda_type<scalar_t>::type;
    ok = dispatch_row_shape<T>(C, aligned,
                               [&](auto VEC, auto G, auto NV) { f(TypeTag<T>{}, VEC, G, NV); });
  });
  TORCH_CHECK(ok, op, ": head size C=", std::to_string(C), " is not supported by the fused "
              "kernels (pyg_dfgnn.ops.plan.kernel_supports says which sizes are)");
}

// Typed views of a tensor's data for kernel arguments (dtypes are checked in
// bindings.cpp before any kernel is launched).
template <typename T> const T* cptr(const at::Tensor& t) {
  return static_cast<const T*>(t.const_data_ptr());
}
template <typename T> T* mptr(const at::Tensor& t) { return static_cast<T*>(t.data_ptr()); }

// Two rows per warp (the SMMF forwards of GT and GAT): fp32 heads of 5-32 vectors
// (C = 20 to 128) run G / 2 lanes x 2 vectors per row, so twice the rows are in
// flight per SM at the same registers, on large graphs whose rows all fit one work
// item (the batch graphs). Measured 6-25 % faster there (GT and GAT), but slower
// where one long chain is the kernel time: small graphs (+27 %) and split rows of
// super nodes (GT up to +16 %, GAT up to +11 %). bf16 / fp16 would spill (fp32 q and accumulator fragments
// twice as long per lane). Which calls run it is the kernel plan's decision
// (pyg_dfgnn/ops/plan.py, the ops' `two_rows` argument); these shapes compile the
// split-row merge out, so bindings.cpp admits `two_rows` only without split rows.
template <typename T, int VEC, int G, int NV>
constexpr bool kHasTwoRowsShape = std::is_same_v<T, float> && VEC == 4 && G >= 8 && NV == 1;

// Calls f(IntC<G'>, IntC<NV'>, IntC<U'>) with an SMMF forward's row shape: two rows
// per warp (G / 2 lanes x 2 vectors, U' = 2 edges in flight) where `two_rows` holds
// and the shape has that variant, else (G, NV) with the default edges in flight (0).
template <typename T, int VEC, int G, int NV, typename F>
void with_smmf_shape(bool two_rows, F&& f) {
  if constexpr (kHasTwoRowsShape<T, VEC, G, NV>) {
    if (two_rows) return f(IntC<G / 2>{}, IntC<2>{}, IntC<2>{});
  }
  f(IntC<G>{}, IntC<NV>{}, IntC<0>{});
}

// Edges whose k / v rows a lane loads before the first use (all loads of a step
// are independent). 4 x 16 bytes per operand: 8 measured slower (more registers,
// fewer resident warps).
template <int VEC, int NV> constexpr int edges_in_flight() {
  return VEC * NV <= 8 ? 4 : (VEC * NV <= 16 ? 2 : 1);
}

// A row slice kept as loaded (16-byte packets, or one element on the scalar path)
// until the arithmetic needs it: widening to fp32 at load time doubled the
// registers of the fp16/bf16 kernels and halved their occupancy.
template <typename T, int VEC> struct Packed {
  using type = typename std::conditional<VEC == 1, T, uint4>::type;
};

template <typename T, int VEC, int G, int NV>
__device__ __forceinline__ void load_packed(const T* __restrict__ row, int gl, int nvec,
                                            typename Packed<T, VEC>::type (&x)[NV]) {
#pragma unroll
  for (int r = 0; r < NV; ++r) {
    const int t = gl + G * r;
    if constexpr (VEC == 1) {
      x[r] = t < nvec ? __ldg(row + t) : from_float<T>(0.f);
    } else {
      x[r] = t < nvec ? __ldg(reinterpret_cast<const uint4*>(row + (int64_t)t * VEC))
                      : make_uint4(0, 0, 0, 0);
    }
  }
}

// Element c of a packed slice as fp32. A bf16 is the high half of an fp32, so
// element c of a 32-bit word of two is one shift (c even) or one mask (c odd) of
// the word; the generic conversion extracted the half first and then shifted it
// (three instructions per pair instead of two, in the loops that are issue-bound
// in bf16).
template <typename T, int VEC>
__device__ __forceinline__ float packed_elem(const typename Packed<T, VEC>::type& x, int c) {
  if constexpr (VEC == 1) {
    return to_float(x);
  } else if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    const uint32_t w = reinterpret_cast<const uint32_t*>(&x)[c / 2];
    return __uint_as_float(c % 2 == 0 ? w << 16 : w & 0xffff0000u);
  } else {
    return to_float(reinterpret_cast<const T*>(&x)[c]);
  }
}

template <typename T, int VEC, int NV>
__device__ __forceinline__ float dot_packed(const float (&a)[NV][VEC],
                                            const typename Packed<T, VEC>::type (&b)[NV]) {
  float s = 0.f;
#pragma unroll
  for (int r = 0; r < NV; ++r)
#pragma unroll
    for (int c = 0; c < VEC; ++c) s = fmaf(a[r][c], packed_elem<T, VEC>(b[r], c), s);
  return s;
}

// The dot product of two packed row slices (dot_packed: fp32 and packed).
template <typename T, int VEC, int NV>
__device__ __forceinline__ float dot_packed2(const typename Packed<T, VEC>::type (&a)[NV],
                                             const typename Packed<T, VEC>::type (&b)[NV]) {
  float s = 0.f;
#pragma unroll
  for (int r = 0; r < NV; ++r)
#pragma unroll
    for (int c = 0; c < VEC; ++c)
      s = fmaf(packed_elem<T, VEC>(a[r], c), packed_elem<T, VEC>(b[r], c), s);
  return s;
}

template <typename T, int VEC, int NV>
__device__ __forceinline__ void axpy_packed(float a, const typename Packed<T, VEC>::type (&x)[NV],
                                            float (&y)[NV][VEC]) {
#pragma unroll
  for (int r = 0; r < NV; ++r)
#pragma unroll
    for (int c = 0; c < VEC; ++c) y[r][c] = fmaf(a, packed_elem<T, VEC>(x[r], c), y[r][c]);
}

// Loads lane `gl`'s slice of one C-long row: vectors gl, gl + G, ... (< nvec).
template <typename T, int VEC, int G, int NV>
__device__ __forceinline__ void load_row(const T* __restrict__ row, int gl, int nvec,
                                         float (&x)[NV][VEC]) {
#pragma unroll
  for (int r = 0; r < NV; ++r) {
    const int t = gl + G * r;
    if (t < nvec) {
      Vec<T, VEC>::load(row + (int64_t)t * VEC, x[r]);
    } else {
#pragma unroll
      for (int c = 0; c < VEC; ++c) x[r][c] = 0.f;
    }
  }
}

template <typename T, int VEC, int G, int NV>
__device__ __forceinline__ void store_row(T* __restrict__ row, int gl, int nvec,
                                          const float (&x)[NV][VEC], float mul) {
#pragma unroll
  for (int r = 0; r < NV; ++r) {
    const int t = gl + G * r;
    if (t < nvec) {
      float y[VEC];
#pragma unroll
      for (int c = 0; c < VEC; ++c) y[c] = x[r][c] * mul;
      Vec<T, VEC>::store(row + (int64_t)t * VEC, y);
    }
  }
}

template <int VEC, int NV>
__device__ __forceinline__ float dot_frag(const float (&a)[NV][VEC], const float (&b)[NV][VEC]) {
  float s = 0.f;
#pragma unroll
  for (int r = 0; r < NV; ++r)
#pragma unroll
    for (int c = 0; c < VEC; ++c) s = fmaf(a[r][c], b[r][c], s);
  return s;
}

template <int VEC, int NV>
__device__ __forceinline__ void axpy_frag(float a, const float (&x)[NV][VEC], float (&y)[NV][VEC]) {
#pragma unroll
  for (int r = 0; r < NV; ++r)
#pragma unroll
    for (int c = 0; c < VEC; ++c) y[r][c] = fmaf(a, x[r][c], y[r][c]);
}

template <int VEC, int NV>
__device__ __forceinline__ void scale_frag(float a, float (&y)[NV][VEC]) {
#pragma unroll
  for (int r = 0; r < NV; ++r)
#pragma unroll
    for (int c = 0; c < VEC; ++c) y[r][c] *= a;
}

template <int VEC, int NV>
__device__ __forceinline__ void zero_frag(float (&y)[NV][VEC]) {
#pragma unroll
  for (int r = 0; r < NV; ++r)
#pragma unroll
    for (int c = 0; c < VEC; ++c) y[r][c] = 0.f;
}

// Partial sums of split rows are kept in fp32 whatever the input dtype.
template <int VEC, int G, int NV>
__device__ __forceinline__ void store_partial(float* __restrict__ row, int gl, int nvec,
                                              const float (&x)[NV][VEC]) {
#pragma unroll
  for (int r = 0; r < NV; ++r) {
    const int t = gl + G * r;
    if (t < nvec) {
#pragma unroll
      for (int c = 0; c < VEC; ++c) row[(int64_t)t * VEC + c] = x[r][c];
    }
  }
}

// The work item a lane group owns (pyg_dfgnn/work_items.py, split_work): one (row, head) pair
// and at most `chunk` of the row's edges. Units are item * H + head, so the
// groups of one warp take the heads of the same row.
struct GroupItem {
  int gl;                  // lane within the group
  unsigned mask;           // the group's shuffle mask
  int64_t row;             // destination (CSR walk) or source (CSC walk) node
  int h;                   // head
  int slot;                // partial slot of a split row, or -1
  int beg, end;            // the item's edges
  int row_beg, row_end;    // the whole row's edges
};

// `block`: the block's index in its kernel's share of the grid (blockIdx.x unless
// two kernels share one launch, as the small-graph GT backward does).
template <int G>
__device__ __forceinline__ bool group_item(const int* __restrict__ items,
                                           const int* __restrict__ ptr, int chunk,
                                           int64_t n_units, int H, GroupItem& g,
                                           unsigned block) {
  const int64_t unit = ((int64_t)block * blockDim.x + threadIdx.x) / G;
  if (unit >= n_units) return false;
  g.gl = threadIdx.x & (G - 1);
  g.mask = group_mask<G>();
  const int64_t item = unit / H;
  g.h = (int)(unit - item * H);
  g.row = items[item * 3];
  g.beg = items[item * 3 + 1];
  g.slot = items[item * 3 + 2];
  g.row_beg = ptr[g.row];
  g.row_end = ptr[g.row + 1];
  g.end = min(g.beg + chunk, g.row_end);
  return true;
}

template <int G>
__device__ __forceinline__ bool group_item(const int* __restrict__ items,
                                           const int* __restrict__ ptr, int chunk,
                                           int64_t n_units, int H, GroupItem& g) {
  return group_item<G>(items, ptr, chunk, n_units, H, g, blockIdx.x);
}

// Split rows merged inside the kernel that computes them, instead of by a
// separate merge launch (reduce_slots_kernel) that the stream has to wait for.
// A row of n slots is merged up a tree of fan-out kMergeFanout: a node's slot
// partials are merged by the group whose child arrives last (a counter per node
// in `counters`, set back to zero by that group, so the buffer is zero again for
// the next launch; split_row_counters, layout.cu), into the slot of its first
// child, and the group that completes the root holds the row's result. Every
// node merges its children in slot order, so the result does not depend on which
// group does it (deterministic). A tree, not one merge by the last item: a
// super node's 171 slots (Reddit-like, chunk 128) would be a chain of 171
// dependent steps for one group, and are 3 levels of at most 8 here. Fences
// order the partial stores before a count and the count before the merge's
// loads, which read L2 (__ldcg, load_partial): L1 is not coherent between SMs.
constexpr int kMergeFanout = 8;
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

// Whether this group is the last of `n` to count itself in at *counter (which
// it then sets back to zero).
template <int G>
__device__ __forceinline__ bool arrive_last(const GroupItem& g, int* __restrict__ counter, int n) {
  __threadfence();
  __syncwarp(g.mask);
  int last = 0;
  if (g.gl == 0) {
    last = atomicAdd(counter, 1) == n - 1;
    if (last) atomicExch(counter, 0);
  }
  last = __shfl_sync(g.mask, last, 0, G);
  if (last) __threadfence();
  return last != 0;
}

// After this group stored its item's partial in slot g.slot: walks the row's
// merge tree up from that slot. merge(c0, stride, cnt, root) merges the cnt
// children in slots c0 + c * stride (c = 0 .. cnt - 1) into slot c0, or, when
// `root`, into the caller's registers. Returns true (and the row's edge range,
// read from `ptr`, in beg / end) when this group merged the root. The range is
// read again rather than kept in the GroupItem through the kernel's main loop:
// that cost the GAT backward kernels 6-7 registers (64 -> 71, 74 -> 80).
template <int G, typename Merge>
__device__ __forceinline__ bool merge_split_row(const GroupItem& g, int H, int chunk,
                                                const int* __restrict__ ptr,
                                                int* __restrict__ counters, int& beg, int& end,
                                                Merge&& merge) {
  beg = __ldg(ptr + g.row);
  end = __ldg(ptr + g.row + 1);
  int width = (end - beg + chunk - 1) / chunk;  // nodes of the current level
  int a = (g.beg - beg) / chunk;                // this group's node in it
  const int first = g.slot - a;                 // the row's first slot
  int stride = 1, off = 0;                      // slot step and counter offset of the level
  while (true) {
    const int parent = a / kMergeFanout, pw = (width + kMergeFanout - 1) / kMergeFanout;
    const int cnt = min(kMergeFanout, width - parent * kMergeFanout);
    // Counters of the row's nodes: [first, first + n) (fewer nodes than slots).
    if (!arrive_last<G>(g, counters + (int64_t)(first + off + parent) * H + g.h, cnt))
      return false;
    merge(first + parent * kMergeFanout * stride, stride, cnt, pw == 1);
    if (pw == 1) return true;
    a = parent;
    width = pw;
    stride *= kMergeFanout;
    off += pw;
  }
}

// Lane gl's vectors of an fp32 partial row written by other blocks (L2 loads).
template <int VEC, int G, int NV>
__device__ __forceinline__ void load_partial(const float* __restrict__ row, int gl, int nvec,
                                             float (&x)[NV][VEC]) {
#pragma unroll
  for (int r = 0; r < NV; ++r) {
    const int t = gl + G * r;
#pragma unroll
    for (int c = 0; c < VEC; c += (VEC % 4 == 0 ? 4 : 1)) {
      if constexpr (VEC % 4 == 0) {
        float4 v = make_float4(0.f, 0.f, 0.f, 0.f);
        if (t < nvec) v = __ldcg(reinterpret_cast<const float4*>(row + (int64_t)t * VEC + c));
        x[r][c] = v.x; x[r][c + 1] = v.y; x[r][c + 2] = v.z; x[r][c + 3] = v.w;
      } else {
        x[r][c] = t < nvec ? __ldcg(row + (int64_t)t * VEC + c) : 0.f;
      }
    }
  }
}

// After this group stored its partials in slot g.slot: merges the split row's
// plain sums (merge_split_row) and, if this group completes the row, writes them:
// up to two [slots, H, C] partials p0 / p1 into rows of out0 / out1 ([N, H, C])
// and one [slots, H] partial ps into out_s ([N, H]); nullptr: not used.
// UNROLL: children loads in flight (1 for the GT dQ kernel, whose registers it
// would raise from 80 to 88-91).
template <typename T, int VEC, int G, int NV, int UNROLL = 4>
__device__ __forceinline__ void merge_split_sums(const GroupItem& g, int H, int C, int chunk,
                                                 const int* __restrict__ ptr,
                                                 int* __restrict__ counters, float* p0, T* out0,
                                                 float* p1, T* out1, float* ps, float* out_s) {
  const int nvec = C / VEC;
  const int64_t HC = (int64_t)H * C, head_off = (int64_t)g.h * C;
  float acc0[NV][VEC], acc1[NV][VEC], a = 0.f;
  auto sum = [&](float* p, int c0, int stride, int cnt, bool root, float (&acc)[NV][VEC]) {
    zero_frag(acc);
#pragma unroll UNROLL
    for (int c = 0; c < cnt; ++c) {
      float x[NV][VEC];
      load_partial<VEC, G, NV>(p + (int64_t)(c0 + c * stride) * HC + head_off, g.gl, nvec, x);
      axpy_frag(1.f, x, acc);
    }
    if (!root) store_partial<VEC, G, NV>(p + (int64_t)c0 * HC + head_off, g.gl, nvec, acc);
  };
  int beg, end;
  const bool done = merge_split_row<G>(g, H, chunk, ptr, counters, beg, end,
                                       [&](int c0, int stride, int cnt, bool root) {
    if (p0 != nullptr) sum(p0, c0, stride, cnt, root, acc0);
    if (p1 != nullptr) sum(p1, c0, stride, cnt, root, acc1);
    if (ps != nullptr) {
      a = 0.f;
      for (int c = 0; c < cnt; ++c) a += __ldcg(ps + (int64_t)(c0 + c * stride) * H + g.h);
      if (!root && g.gl == 0) ps[(int64_t)c0 * H + g.h] = a;
    }
  });
  if (!done) return;
  if (p0 != nullptr) store_row<T, VEC, G, NV>(out0 + g.row * HC + head_off, g.gl, nvec, acc0, 1.f);
  if (p1 != nullptr) store_row<T, VEC, G, NV>(out1 + g.row * HC + head_off, g.gl, nvec, acc1, 1.f);
  if (ps != nullptr && g.gl == 0) out_s[g.row * H + g.h] = a;
}

// The neighbour indices (col or row) of a work item. With AHEAD they are loaded
// one step of U edges ahead of their use: the next step's index loads go out
// together with this step's row gathers, so a step waits on one dependent memory
// round trip (the rows) instead of two (the indices, then the rows). On small
// graphs the longest item's chain of steps is the kernel time. It costs U to 13
// registers: free for the fp32 GT kernels and both backward families (same
// blocks per SM; 5-11 % faster fwd+bwd), a lost 256-thread block per SM for the
// packed fp16/bf16 kernels (GT forward bf16 up to 41 % slower) and for
// softmax_spmm, and 5-7 % slower in GAT's SMMF forward. With 64-thread blocks the
// bf16 GT forward goes from 24 to 20 warps per SM with it and is 3-10 % faster; the
// GT backward's bf16 kernels moved between 2 % faster and 3 % slower. kIndexAhead<T> picks for the backward kernels,
// kForwardIndexAhead<T, NV> for the SMMF forward.
template <int U, bool AHEAD> struct NbrPipe {
  const int* __restrict__ nbr;
  int end;
  int next[U];
  __device__ __forceinline__ NbrPipe(const int* __restrict__ nbr_, int beg, int end_)
      : nbr(nbr_), end(end_) {
    if constexpr (AHEAD) fetch(beg);
  }
  __device__ __forceinline__ void fetch(int e0) {
#pragma unroll
    for (int u = 0; u < U; ++u) next[u] = (e0 + u < end) ? __ldg(nbr + e0 + u) : -1;
  }
  // j = the neighbours of edges e0 .. e0 + U - 1 (-1 past the end); with AHEAD,
  // starts the loads of the next U.
  __device__ __forceinline__ void take(int e0, int (&j)[U]) {
    if constexpr (!AHEAD) fetch(e0);
#pragma unroll
    for (int u = 0; u < U; ++u) j[u] = next[u];
    if constexpr (AHEAD) fetch(e0 + U);
  }
};

// Calls step(e0, full) for the steps of U edges of an item's edges [beg, end):
// full = std::true_type where all U edges exist, so the step compiles out its
// per-edge existence tests (the bf16 GT forward's loop: 388 -> 309
// instructions), std::false_type for the item's last, partial step. SPLIT
// false: every step is a false_type step (the old loop), for kernels where
// the second copy of the step costs registers (kFullStepsInBackward).
template <int U, bool SPLIT = true, typename F>
__device__ __forceinline__ void for_each_step(int beg, int end, F&& step) {
  if constexpr (SPLIT) {
    int e0 = beg;
    for (; e0 + U <= end; e0 += U) step(e0, std::true_type{});
    if (e0 < end) step(e0, std::false_type{});
  } else {
    for (int e0 = beg; e0 < end; e0 += U) step(e0, std::false_type{});
  }
}

// The GT backward kernels split their steps (for_each_step) in fp32 with 32-lane
// groups only (C >= 128): there their registers stayed within 2 of the old
// loop's, while bf16 dkv went from 120 to 178 and the 8- and 16-lane fp32 dq from
// 80 to 96 (fewer resident blocks; not measured).
template <typename T, int G>
constexpr bool kFullStepsInBackward = std::is_same_v<T, float> && G == 32;

template <typename T> constexpr bool kIndexAhead = sizeof(T) == 4;
// The SMMF forward looks ahead in every dtype where a lane holds one vector per
// row (C <= 256 in fp16 / bf16); wider packed rows keep kIndexAhead (it took the
// C = 512 bf16 kernel from 128 to 146 registers, not measured).
template <typename T, int NV> constexpr bool kForwardIndexAhead = kIndexAhead<T> || NV == 1;

// The neighbour indices of a work item, one tile of G edges at a time: lane gl of
// the group holds the index of edge t0 + gl (one coalesced load per G edges, the
// next tile's issued a whole tile ahead), and a step of U edges takes its indices
// from their holders by shuffle. A step then waits on one memory round trip (the
// rows), like NbrPipe's look-ahead, for two registers instead of U to 2U, and a
// per-edge scalar (weight, score, dropout multiplier) is computed once by the
// edge's holder lane instead of by every lane of the group (`share`). The forward
// kernels use it (docs/design.md, "GAT").
// DEPTH tiles of indices are in flight ahead of the current one (2 lets a kernel
// gather a per-neighbour scalar one tile ahead: GAT's a_src).
// `avail` (the number of edges of the whole graph) makes the constructor's loads
// speculative: they need only the item's first edge, not its end (which comes from
// the row pointer, one more dependent round trip), and are masked once the end is
// known; `raw` is this lane's first-tile neighbour before that mask, for a gather
// that should not wait for the row pointer either (GAT's a_src). The same in
// NbrPipe's first step measured 1 % slower in the GT forward.
template <int G, int DEPTH = 1> struct NbrTile {
  const int* __restrict__ nbr;
  int end, gl;
  unsigned mask;
  int t0;            // first edge of the current tile
  int raw;           // this lane's neighbour in the first tile, unmasked (-1 past avail)
  int cur;           // this lane's neighbour in the current tile (-1 past the end)
  int ahead[DEPTH];  // ... and in the next DEPTH tiles
  __device__ __forceinline__ NbrTile(const int* __restrict__ nbr_, int beg, int end_, int gl_,
                                     unsigned mask_, int avail)
      : nbr(nbr_), end(end_), gl(gl_), mask(mask_), t0(beg) {
    raw = speculate(beg, avail);
    cur = beg + gl < end ? raw : -1;
#pragma unroll
    for (int d = 0; d < DEPTH; ++d) {
      const int t = beg + (d + 1) * G;
      const int v = speculate(t, avail);
      ahead[d] = t + gl < end ? v : -1;
    }
  }
  __device__ __forceinline__ int speculate(int t, int avail) const {
    return t + gl < avail ? __ldg(nbr + t + gl) : -1;
  }
  __device__ __forceinline__ int load(int t) const { return speculate(t, end); }
  __device__ __forceinline__ bool valid() const { return t0 < end; }
  __device__ __forceinline__ int tile_end() const { return min(t0 + G, end); }
  // This lane's edge in the current tile.
  __device__ __forceinline__ int edge() const { return t0 + gl; }
  __device__ __forceinline__ void advance() {
    t0 += G;
    cur = ahead[0];
#pragma unroll
    for (int d = 0; d + 1 < DEPTH; ++d) ahead[d] = ahead[d + 1];
    ahead[DEPTH - 1] = load(t0 + DEPTH * G);
  }
  // Neighbours of edges e0 .. e0 + U - 1 of the current tile (-1 past the end).
  template <int U> __device__ __forceinline__ void take(int e0, int (&j)[U]) const {
#pragma unroll
    for (int u = 0; u < U; ++u) j[u] = __shfl_sync(mask, cur, e0 - t0 + u, G);
  }
  // The per-edge values v (held by each edge's lane) of edges e0 .. e0 + U - 1.
  template <int U> __device__ __forceinline__ void share(float v, int e0, float (&out)[U]) const {
#pragma unroll
    for (int u = 0; u < U; ++u) out[u] = __shfl_sync(mask, v, e0 - t0 + u, G);
  }
};

// Two rows (k and v, or q and dO) of each of U neighbours j[u] (< 0: none), every
// load issued before any is used.
// FULL: all U edges exist (j[u] >= 0 is known, not tested).
template <typename T, int VEC, int G, int NV, int U, bool FULL = false>
__device__ __forceinline__ void gather_rows(const int (&j)[U], const T* __restrict__ a,
                                            const T* __restrict__ b, int64_t HC, int64_t head_off,
                                            int gl, int nvec,
                                            typename Packed<T, VEC>::type (&ra)[U][NV],
                                            typename Packed<T, VEC>::type (&rb)[U][NV]) {
#pragma unroll
  for (int u = 0; u < U; ++u) {
    if (FULL || j[u] >= 0) {
      const int64_t off = (int64_t)j[u] * HC + head_off;
      load_packed<T, VEC, G, NV>(a + off, gl, nvec, ra[u]);
      load_packed<T, VEC, G, NV>(b + off, gl, nvec, rb[u]);
    }
  }
}

// One row of each of U neighbours j[u] (< 0: none).
template <typename T, int VEC, int G, int NV, int U>
__device__ __forceinline__ void gather_row(const int (&j)[U], const T* __restrict__ a, int64_t HC,
                                           int64_t head_off, int gl, int nvec,
                                           typename Packed<T, VEC>::type (&ra)[U][NV]) {
#pragma unroll
  for (int u = 0; u < U; ++u)
    if (j[u] >= 0) load_packed<T, VEC, G, NV>(a + (int64_t)j[u] * HC + head_off, gl, nvec, ra[u]);
}

// Neighbours of the next U edges (-1 past the item's end) and two rows of each
// (k and v, or q and dO), every load issued before any is used.
template <typename T, int VEC, int G, int NV, int U, bool AHEAD, bool FULL = false>
__device__ __forceinline__ void load_edge_rows(
    NbrPipe<U, AHEAD>& nb, int e0, const T* __restrict__ a,
    const T* __restrict__ b, int64_t HC, int64_t head_off, int gl, int nvec, int (&j)[U],
    typename Packed<T, VEC>::type (&ra)[U][NV], typename Packed<T, VEC>::type (&rb)[U][NV]) {
  nb.take(e0, j);
  gather_rows<T, VEC, G, NV, U, FULL>(j, a, b, HC, head_off, gl, nvec, ra, rb);
}

// Neighbours of the next U edges (-1 past the item's end), one row of each and a
// scalar per edge, scalar(u, j): the row loads are all issued before any is used.
template <typename T, int VEC, int G, int NV, int U, bool AHEAD, typename F>
__device__ __forceinline__ void load_edge_row(
    NbrPipe<U, AHEAD>& nb, int e0, const T* __restrict__ a, int64_t HC,
    int64_t head_off, int gl, int nvec, int (&j)[U],
    typename Packed<T, VEC>::type (&ra)[U][NV], float (&sc)[U], F scalar) {
  nb.take(e0, j);
#pragma unroll
  for (int u = 0; u < U; ++u) {
    if (j[u] >= 0) {
      load_packed<T, VEC, G, NV>(a + (int64_t)j[u] * HC + head_off, gl, nvec, ra[u]);
      sc[u] = scalar(u, j[u]);
    }
  }
}

// The SpMM steps of one tile of NbrTile with K weights per edge: acc[k] +=
// w_e[k] x_e over the tile's edges, each step's neighbours and weights (this
// lane's edge's weights are wl) taken from their lanes by shuffle. K = 1: the
// GAT SMMF and PMF forwards; K = 2: the GAT backward's CSC walk (dx and the
// LeakyReLU'-weighted sum behind d a_src).
template <typename T, int VEC, int G, int NV, int U, int DEPTH, int K>
__device__ __forceinline__ void tile_spmm_k(const NbrTile<G, DEPTH>& nt, const float (&wl)[K],
                                            const T* __restrict__ x, int64_t HC, int64_t head_off,
                                            int gl, int nvec, float (&acc)[K][NV][VEC]) {
  using P = typename Packed<T, VEC>::type;
  const int te = nt.tile_end();
  for (int e0 = nt.t0; e0 < te; e0 += U) {
    int j[U];
    float w[K][U];
    P xf[U][NV];
    nt.take(e0, j);
#pragma unroll
    for (int k = 0; k < K; ++k) nt.share(wl[k], e0, w[k]);
    gather_row<T, VEC, G, NV, U>(j, x, HC, head_off, gl, nvec, xf);
#pragma unroll
    for (int u = 0; u < U; ++u) {
      if (j[u] >= 0) {
#pragma unroll
        for (int k = 0; k < K; ++k) axpy_packed<T, VEC, NV>(w[k][u], xf[u], acc[k]);
      }
    }
  }
}

template <typename T, int VEC, int G, int NV, int U, int DEPTH>
__device__ __forceinline__ void tile_spmm(const NbrTile<G, DEPTH>& nt, float wl,
                                          const T* __restrict__ x, int64_t HC, int64_t head_off,
                                          int gl, int nvec, float (&acc)[NV][VEC]) {
  const float w[1] = {wl};
  tile_spmm_k<T, VEC, G, NV, U>(nt, w, x, HC, head_off, gl, nvec,
                                reinterpret_cast<float(&)[1][NV][VEC]>(acc));
}

// A finished softmax row: out = acc / l, lse2 = m + log2(l), and the raw
// base-2 scores of its edges [beg, end) in attn (if any) turned into weights;
// `merged`: some were written by other groups (read from L2).
template <typename T, int VEC, int G, int NV>
__device__ __forceinline__ void write_softmax_row(const GroupItem& g, int H, int C, int beg,
                                                  int end, const float (&acc)[NV][VEC], float m,
                                                  float l, T* __restrict__ out,
                                                  float* __restrict__ lse2,
                                                  float* __restrict__ attn, bool merged) {
  const int64_t HC = (int64_t)H * C, head_off = (int64_t)g.h * C;
  const float inv = l > 0.f ? 1.f / l : 0.f;
  store_row<T, VEC, G, NV>(out + g.row * HC + head_off, g.gl, C / VEC, acc, inv);
  const float L = l > 0.f ? m + log2f(l) : kNegInf;
  if (g.gl == 0) lse2[g.row * H + g.h] = L;
  if (attn != nullptr) {
    __syncwarp(g.mask);  // raw scores written by lane 0 become visible to the group
    for (int e = beg + g.gl; e < end; e += G) {
      const int64_t a = (int64_t)e * H + g.h;
      attn[a] = exp2f((merged ? __ldcg(attn + a) : attn[a]) - L);
    }
  }
}

// After this group stored its (m, l, acc) partial in slot g.slot: merges the
// split row's partials up its tree (M = max m_c, L = sum l_c 2^(m_c - M),
// acc = sum acc_c 2^(m_c - M)) and, if this group completes it, writes the row.
template <typename T, int VEC, int G, int NV>
__device__ __forceinline__ void merge_split_softmax(const GroupItem& g, int H, int C, int chunk,
                                                    const int* __restrict__ ptr, T* out,
                                                    float* lse2, float* attn, float* partial,
                                                    float* partial_ml, int* __restrict__ counters) {
  const int nvec = C / VEC;
  const int64_t HC = (int64_t)H * C, head_off = (int64_t)g.h * C;
  float acc[NV][VEC], M = kNegInf, L = 0.f;
  int beg, end;
  const bool done = merge_split_row<G>(g, H, chunk, ptr, counters, beg, end,
                                       [&](int c0, int stride, int cnt, bool root) {
    auto ml = [&](int c, int k) {
      return __ldcg(partial_ml + ((int64_t)(c0 + c * stride) * H + g.h) * 2 + k);
    };
    M = kNegInf;
    L = 0.f;
    for (int c = 0; c < cnt; ++c) M = fmaxf(M, ml(c, 0));
    zero_frag(acc);
    for (int c = 0; c < cnt; ++c) {
      const float mc = ml(c, 0);
      const float w = mc == kNegInf ? 0.f : exp2f(mc - M);
      L += w * ml(c, 1);
      float x[NV][VEC];
      load_partial<VEC, G, NV>(partial + (int64_t)(c0 + c * stride) * HC + head_off, g.gl, nvec,
                               x);
      axpy_frag(w, x, acc);
    }
    if (!root) {
      store_partial<VEC, G, NV>(partial + (int64_t)c0 * HC + head_off, g.gl, nvec, acc);
      if (g.gl == 0) {
        partial_ml[((int64_t)c0 * H + g.h) * 2] = M;
        partial_ml[((int64_t)c0 * H + g.h) * 2 + 1] = L;
      }
    }
  });
  if (done) write_softmax_row<T, VEC, G, NV>(g, H, C, beg, end, acc, M, L, out, lse2, attn, true);
}

// 2^x as one MUFU.EX2 (ex2.approx.ftz): exp2f adds a compare and two predicated
// multiplies per call to keep results below 2^-126 (subnormal) exact. Those are
// weights under 2^-126 of the row's largest (which is 1 here), far below the
// fp32 resolution of the row's sum, so flushing them to 0 changes nothing
// measurable; the online-softmax step takes U + 1 of them per step.
__device__ __forceinline__ float fast_exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

// Online softmax + SpMM of one lane group's work item (flash-attention style):
// a running max `m` and sum `l` in base 2 and an unnormalised accumulator, so a
// row of any length is one pass with the scores in registers. Used by every
// SMMF forward kernel; only the score differs between them.
// EXTRAS: step() applies attention dropout (when p > 0) and stores the raw
// scores (when attn is set); without it, step() has neither. The plain variant
// serves the common call: the per-edge check of attn and its store's address
// were about 8 of the ~100 instructions per edge of the bf16 GT forward's loop.
template <typename T, int VEC, int G, int NV, int U, bool EXTRAS>
struct OnlineSoftmax {
  using P = typename Packed<T, VEC>::type;
  float m = kNegInf, l = 0.f;
  float acc[NV][VEC];

  __device__ __forceinline__ OnlineSoftmax() { zero_frag(acc); }

  // Edges e0 .. e0 + U - 1 (j[u] < 0: past the item's end) with base-2 scores
  // s[u] and rows x[u]; with EXTRAS, lane 0 of the group stores the raw scores in
  // `attn` (finish() turns them into weights once the row's lse is known).
  // FULL: all U edges exist.
  template <bool FULL = false>
  __device__ __forceinline__ void step(const int (&j)[U], const float (&s)[U],
                                       const P (&x)[U][NV], int e0, int H, int h, float p,
                                       uint64_t seed, float* __restrict__ attn, int gl) {
    float mc = m;
#pragma unroll
    for (int u = 0; u < U; ++u)
      if (FULL || j[u] >= 0) mc = fmaxf(mc, s[u]);
    const float corr = fast_exp2(m - mc);  // 0 on the first step (m = -inf)
    l *= corr;
    scale_frag(corr, acc);
#pragma unroll
    for (int u = 0; u < U; ++u) {
      if (FULL || j[u] >= 0) {
        const float pe = fast_exp2(s[u] - mc);
        l += pe;
        float w = pe;
        if constexpr (EXTRAS) {
          if (p > 0.f) w *= dropout_scale(p, seed, (uint64_t)(e0 + u) * H + h);
          if (attn != nullptr && gl == 0) attn[(int64_t)(e0 + u) * H + h] = s[u];
        }
        axpy_packed<T, VEC, NV>(w, x[u], acc);
      }
    }
    m = mc;
  }

  // Moves the running max to max(m, mt) (mt finite) and returns it; the lane
  // partial sum l and the accumulator are rescaled to it. For kernels that know a
  // whole tile's scores at once (GAT): one rescale per tile instead of per step.
  __device__ __forceinline__ float raise_max(float mt) {
    const float mc = fmaxf(m, mt);
    const float corr = fast_exp2(m - mc);  // 0 while m = -inf
    l *= corr;
    scale_frag(corr, acc);
    m = mc;
    return mc;
  }

  // A whole row: out = acc / l, lse2 = m + log2(l), attention weights from the
  // raw scores. Part of a split row (g.slot >= 0): the unnormalised partial and
  // (m, l) go to its slot, and merge_split_softmax writes the row when this group
  // completes its merge tree (counters nullptr: merge_softmax_partials merges
  // later). MERGE = false compiles the merge out: the two-rows-per-warp shapes
  // (they only run on calls without split rows, bindings.cpp) and the
  // half-precision variants for calls without counters (with_merge_variant).
  template <bool MERGE = true>
  __device__ __forceinline__ void finish(const GroupItem& g, int H, int C, int chunk,
                                         const int* __restrict__ ptr, T* __restrict__ out,
                                         float* __restrict__ lse2, float* __restrict__ attn,
                                         float* __restrict__ partial,
                                         float* __restrict__ partial_ml,
                                         int* __restrict__ counters) {
    const int nvec = C / VEC;
    const int64_t HC = (int64_t)H * C, head_off = (int64_t)g.h * C;
    if (g.slot >= 0) {
      store_partial<VEC, G, NV>(partial + (int64_t)g.slot * HC + head_off, g.gl, nvec, acc);
      if (g.gl == 0) {
        partial_ml[((int64_t)g.slot * H + g.h) * 2] = m;
        partial_ml[((int64_t)g.slot * H + g.h) * 2 + 1] = l;
      }
      if constexpr (MERGE) {
        if (counters != nullptr)
          merge_split_softmax<T, VEC, G, NV>(g, H, C, chunk, ptr, out, lse2, attn, partial,
                                             partial_ml, counters);
      }
      return;
    }
    write_softmax_row<T, VEC, G, NV>(g, H, C, g.beg, g.end, acc, m, l, out, lse2, attn, false);
  }
};

}  // namespace dfgnn
