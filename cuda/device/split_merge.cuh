// The in-kernel merge of split rows: the arrival counters, the merge tree and
// the plain sums of the backward kernels (the online-softmax merge is in
// online_softmax.cuh, the separate merge launches in host/split_merge.cu).
#pragma once

#include "device/fragments.cuh"
#include "device/work_items.cuh"

namespace dfgnn {

// Split rows merged inside the kernel that computes them, instead of by a
// separate merge launch (reduce_slots_kernel) that the stream has to wait for.
// A row of n slots is merged up a tree of fan-out kMergeFanout: a node's slot
// partials are merged by the group whose child arrives last (a counter per node
// in `counters`, set back to zero by that group, so the buffer is zero again for
// the next launch; split_row_counters, host/split_merge.cu), into the slot of its first
// child, and the group that completes the root holds the row's result. Every
// node merges its children in slot order, so the result does not depend on which
// group does it (deterministic). A tree, not one merge by the last item: a
// super node's 171 slots (Reddit-like, chunk 128) would be a chain of 171
// dependent steps for one group, and are 3 levels of at most 8 here. Fences
// order the partial stores before a count and the count before the merge's
// loads, which read L2 (__ldcg, load_partial): L1 is not coherent between SMs.
constexpr int kMergeFanout = 8;

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

// After this group stored its partials in slot g.slot: merges the split row's
// plain sums (merge_split_row) and, if this group completes the row, writes them:
// up to two [slots, H, C] partials p0 / p1 into rows of out0 / out1 ([N, H, C])
// and one [slots, H] partial ps into out_s ([N, H]); nullptr: not used. ld: the
// row stride of out0 / out1 in elements (0: H * C, contiguous rows; more where
// they are column slices of a joined gradient, glue/projections.cpp).
// UNROLL: children loads in flight (1 for the GT dQ kernel, whose registers it
// would raise from 80 to 88-91).
template <typename T, int VEC, int G, int NV, int UNROLL = 4>
__device__ __forceinline__ void merge_split_sums(const GroupItem& g, int H, int C, int chunk,
                                                 const int* __restrict__ ptr,
                                                 int* __restrict__ counters, float* p0, T* out0,
                                                 float* p1, T* out1, float* ps, float* out_s,
                                                 int64_t ld = 0) {
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
  const int64_t row_off = g.row * (ld > 0 ? ld : HC) + head_off;
  if (p0 != nullptr) store_row<T, VEC, G, NV>(out0 + row_off, g.gl, nvec, acc0, 1.f);
  if (p1 != nullptr) store_row<T, VEC, G, NV>(out1 + row_off, g.gl, nvec, acc1, 1.f);
  if (ps != nullptr && g.gl == 0) out_s[g.row * H + g.h] = a;
}

}  // namespace dfgnn
