// The online softmax + SpMM of the SMMF forwards and the write (or split-row
// merge) of a finished row.
#pragma once

#include <cstdint>
#include "device/dropout.cuh"
#include "device/fragments.cuh"
#include "device/split_merge.cuh"
#include "device/work_items.cuh"

namespace dfgnn {

// A finished softmax row: out = acc / l (and in fp32 to out32, if set),
// lse2 = m + log2(l), and the raw base-2 scores of its edges [beg, end) in attn
// (if any) turned into weights; `merged`: some were written by other groups
// (read from L2).
template <typename T, int VEC, int G, int NV>
__device__ __forceinline__ void write_softmax_row(const GroupItem& g, int H, int C, int beg,
                                                  int end, const float (&acc)[NV][VEC], float m,
                                                  float l, T* __restrict__ out,
                                                  float* __restrict__ out32,
                                                  float* __restrict__ lse2,
                                                  float* __restrict__ attn, bool merged) {
  const int64_t HC = (int64_t)H * C, head_off = (int64_t)g.h * C;
  const float inv = l > 0.f ? 1.f / l : 0.f;
  store_row<T, VEC, G, NV>(out + g.row * HC + head_off, g.gl, C / VEC, acc, inv);
  store_row_f32<VEC, G, NV>(out32 == nullptr ? nullptr : out32 + g.row * HC + head_off, g.gl,
                            C / VEC, acc, inv);
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
                                                    float* out32, float* lse2, float* attn,
                                                    float* partial, float* partial_ml,
                                                    int* __restrict__ counters) {
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
  if (done)
    write_softmax_row<T, VEC, G, NV>(g, H, C, beg, end, acc, M, L, out, out32, lse2, attn, true);
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
    step<FULL, false>(j, s, x, x, e0, H, h, p, seed, attn, gl);
  }

  // As above with edge u's row x[u] + y[u], each weighed into the fp32
  // accumulator apart (the edge rows beside the value rows, scores/score.cuh,
  // kEdgeBeside). TWO = false: y is not read.
  template <bool FULL = false, bool TWO = true>
  __device__ __forceinline__ void step(const int (&j)[U], const float (&s)[U],
                                       const P (&x)[U][NV], const P (&y)[U][NV], int e0, int H,
                                       int h, float p, uint64_t seed, float* __restrict__ attn,
                                       int gl) {
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
        if constexpr (TWO) axpy_packed<T, VEC, NV>(w, y[u], acc);
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

  // A whole row: out = acc / l (and out32 in fp32, if set), lse2 = m + log2(l),
  // attention weights from the raw scores. Part of a split row (g.slot >= 0):
  // the unnormalised partial and (m, l) go to its slot, and merge_split_softmax
  // writes the row when this group completes its merge tree (counters nullptr:
  // merge_softmax_partials merges later). MERGE = false compiles the merge out: the two-rows-per-warp shapes
  // (they only run on calls without split rows, check_two_rows) and the
  // half-precision variants for calls without counters (with_merge_variant).
  template <bool MERGE = true>
  __device__ __forceinline__ void finish(const GroupItem& g, int H, int C, int chunk,
                                         const int* __restrict__ ptr, T* __restrict__ out,
                                         float* __restrict__ out32, float* __restrict__ lse2,
                                         float* __restrict__ attn,
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
          merge_split_softmax<T, VEC, G, NV>(g, H, C, chunk, ptr, out, out32, lse2, attn,
                                             partial, partial_ml, counters);
      }
      return;
    }
    write_softmax_row<T, VEC, G, NV>(g, H, C, g.beg, g.end, acc, m, l, out, out32, lse2, attn,
                                     false);
  }
};

}  // namespace dfgnn
