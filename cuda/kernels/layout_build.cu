// The GraphLayout build on the GPU: CSR by destination, CSC by source and the
// node-parallel work items of both, from a [2, E0] edge_index, bit for bit what
// the torch build (_build in pyg_dfgnn/layout.py) makes, with one host
// synchronisation and a handful of launches.
//
// Phase 1 (sizes unknown):
//   memset         degrees, statistics and the CSC column counters to zero;
//   count_edges    one pass over the edges: index bounds, self-loops kept, whether
//                  the input is grouped by destination, in- and out-degrees
//                  (warp-aggregated integer atomics: the counts do not depend on
//                  their order);
//   tile_totals    per tile of kTile rows (destinations, then sources): sums of
//                  the per-row quantities the work items need and a histogram of
//                  the rows' last-item lengths; the last block to finish then
//                  runs segment_scan per pointer: exclusive scans of the tile
//                  sums and the pointer's totals;
//   one 192-byte copy to pinned memory and the synchronisation.
// Memory: one scratch allocation for both phases (sized before the
// synchronisation from E0) and one for every output (each output a tensor over
// its region, see carve).
// Phase 2 (sizes known):
//   [prepare + scan + sort] only for input not grouped by destination (a stable
//                  cub radix sort by destination) or with self-loops to remove
//                  (an exclusive scan of the kept flags numbers the kept edges);
//   build_csr      tiles: rowptr / colptr, the appended self-loops and the work
//                  items (closed-form positions, see tile_task); other blocks:
//                  the CSR edges (their positions follow from their rank, no sort
//                  where the input is grouped);
//   CSC            the stable order by column is each column's CSR positions in
//                  ascending order: csc_scatter puts them in their column's
//                  region (atomic order; a one-edge column is final there), then
//                  csc_order sorts each column (warp shuffles up to kSmallCol
//                  edges, else a block) and gathers row = csr_row[perm]. With a
//                  column beyond kBigCol edges: a stable cub radix sort of
//                  (col, CSR position) over the bits of N_src - 1, then
//                  gather_rows.
// Every output element has exactly one writer; no output depends on the order of
// atomics (csc_scatter's order is sorted away: CSR positions are distinct).
// Indices are clamped before any scatter, so out-of-range input is reported from
// the one read of the statistics, never as a fault.
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAGuard.h>
#include <cuda_runtime.h>

#include <cub/block/block_radix_sort.cuh>
#include <cub/device/device_radix_sort.cuh>
#include <cub/device/device_scan.cuh>

#include <climits>
#include <cstdint>

#include "host/dispatch.cuh"
#include "kernels/layout_build.h"

namespace dfgnn {
namespace {

constexpr int kBlock = 256;
constexpr int kWarps = kBlock / 32;
constexpr int kIters = 8;                    // rows per lane and tile
constexpr int kWarpRows = 32 * kIters;       // consecutive rows of one warp
constexpr int kTile = kWarps * kWarpRows;    // rows per tile (2048)
constexpr int kSums = 5;                     // deg, items, split, slots, full
constexpr int kMaxCol = kSums;               // column of the tile's largest degree
constexpr int kHist = kSums + 1;             // first histogram column
constexpr int kMaxChunk = (int)kLayoutBuildMaxChunk;
constexpr unsigned kFull = 0xffffffffu;

// Statistics read by the host: edge statistics (count_edges, order-preserving
// unsigned encodings so that zero is the identity of every atomic), then the
// totals of each pointer (segment_scan).
enum EdgeStat : int {
  kNotLoSrc = 0, kNotLoDst, kHiSrc, kHiDst, kKept, kUnsorted,
  kDone,            // tile_totals blocks finished (not read by the host)
  kBigCols,         // source columns of more than kSmallCol edges (with_csc)
  kEdgeStats = 8
};
constexpr int kSegStats = 8;                 // per pointer: kSums totals, max degree
constexpr int kStatWords = kEdgeStats + 2 * kSegStats;

// The CSC order by columns (csc_order_kernel): a warp ranks a column of up to
// kSmallCol edges with shuffles; a block takes a larger one, by rank counting in
// shared memory up to kBlock edges, else by a block radix sort of kBlock x 4
// keys or, up to kBigCol, kBlock x 16 (the sort's time follows its key count).
// Columns beyond that go to a device-wide cub radix sort.
constexpr int kSmallCol = 32;
constexpr int kBigCol = kBlock * 16;

__device__ __forceinline__ unsigned long long order_key(long long v) {
  return static_cast<unsigned long long>(v) ^ (1ull << 63);
}
inline long long from_order_key(unsigned long long u) {
  return static_cast<long long>(u ^ (1ull << 63));
}

// What a row of `deg` edges needs (pyg_dfgnn.work_items.work_items): `items`
// = max(1, ceil(deg / chunk)) work items, of which `full` = deg / chunk hold
// `chunk` edges; the last one holds deg % chunk edges otherwise (`partial`, also
// the single empty item of an empty row), sorted by `bucket` = chunk - 1 -
// its length in the longest-first order.
struct RowWork {
  int deg, items, split, slots, full, partial, bucket;
};

__device__ __forceinline__ RowWork row_work(int deg, int chunk) {
  RowWork w;
  w.deg = deg;
  w.items = deg > 0 ? (deg - 1) / chunk + 1 : 1;
  w.split = w.items > 1;
  w.slots = w.split ? w.items : 0;
  w.full = deg / chunk;
  const int rem = deg - w.full * chunk;
  w.partial = rem != 0 || deg == 0;
  w.bucket = chunk - 1 - rem;
  return w;
}

// ------------------------------------------------------------------ phase 1
template <typename I>
__global__ void __launch_bounds__(kBlock)
count_edges_kernel(const I* __restrict__ src, const I* __restrict__ dst, int64_t E0, int ns,
                   int nd, bool loops, int* __restrict__ din, int* __restrict__ dout,
                   unsigned long long* __restrict__ stats) {
  long long lo_s = LLONG_MAX, lo_d = LLONG_MAX, hi_s = LLONG_MIN, hi_d = LLONG_MIN;
  unsigned long long kept = 0;
  int unsorted = 0;
  const int lane = threadIdx.x & 31;
  const int64_t warp = ((int64_t)blockIdx.x * kBlock + threadIdx.x) >> 5;
  const int64_t stride = (int64_t)gridDim.x * kBlock;
  // `base` is warp-uniform: every lane reaches the __match_any_sync calls.
  for (int64_t base = warp * 32; base < E0; base += stride) {
    const int64_t i = base + lane;
    int sc = -1, dc = -1;
    bool keep = false;
    if (i < E0) {
      const long long s = (long long)src[i], d = (long long)dst[i];
      lo_s = min(lo_s, s);
      hi_s = max(hi_s, s);
      lo_d = min(lo_d, d);
      hi_d = max(hi_d, d);
      if (i > 0 && d < (long long)dst[i - 1]) unsorted = 1;
      keep = !(loops && s == d);
      kept += keep;
      // Clamped: an out-of-range index is reported by the host, not a fault here.
      sc = (int)min(max(s, 0ll), (long long)ns - 1);
      dc = (int)min(max(d, 0ll), (long long)nd - 1);
    }
    // Lanes with the same destination (grouped input: neighbours of one node)
    // add their count once.
    const int kd = keep ? dc : -1;
    const unsigned peers_d = __match_any_sync(kFull, kd);
    if (keep && __ffs(peers_d) - 1 == lane) atomicAdd(din + dc, __popc(peers_d));
    if (dout != nullptr) {
      const int ks = keep ? sc : -1;
      const unsigned peers_s = __match_any_sync(kFull, ks);
      if (keep && __ffs(peers_s) - 1 == lane) atomicAdd(dout + sc, __popc(peers_s));
    }
  }
  // Block reduction, then one atomic per statistic and block.
  for (int o = 16; o > 0; o >>= 1) {
    lo_s = min(lo_s, __shfl_xor_sync(kFull, lo_s, o));
    hi_s = max(hi_s, __shfl_xor_sync(kFull, hi_s, o));
    lo_d = min(lo_d, __shfl_xor_sync(kFull, lo_d, o));
    hi_d = max(hi_d, __shfl_xor_sync(kFull, hi_d, o));
    kept += __shfl_xor_sync(kFull, kept, o);
    unsorted |= __shfl_xor_sync(kFull, unsorted, o);
  }
  __shared__ long long s_red[kWarps][4];
  __shared__ unsigned long long s_kept[kWarps];
  __shared__ int s_unsorted[kWarps];
  const int w = threadIdx.x >> 5;
  if (lane == 0) {
    s_red[w][0] = lo_s;
    s_red[w][1] = lo_d;
    s_red[w][2] = hi_s;
    s_red[w][3] = hi_d;
    s_kept[w] = kept;
    s_unsorted[w] = unsorted;
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    for (int q = 1; q < kWarps; ++q) {
      lo_s = min(lo_s, s_red[q][0]);
      lo_d = min(lo_d, s_red[q][1]);
      hi_s = max(hi_s, s_red[q][2]);
      hi_d = max(hi_d, s_red[q][3]);
      kept += s_kept[q];
      unsorted |= s_unsorted[q];
    }
    atomicMax(stats + kNotLoSrc, ~order_key(lo_s));
    atomicMax(stats + kNotLoDst, ~order_key(lo_d));
    atomicMax(stats + kHiSrc, order_key(hi_s));
    atomicMax(stats + kHiDst, order_key(hi_d));
    if (kept) atomicAdd(stats + kKept, kept);
    if (unsorted) atomicMax(stats + kUnsorted, 1ull);
  }
}

// The rows of tile t: destinations (segment 0) for t < tiles_d, else sources.
struct TileRows {
  int seg, row0, n;
  const int* deg;
};

__device__ __forceinline__ TileRows tile_rows(int t, int tiles_d, int nd, int ns,
                                              const int* din, const int* dout) {
  TileRows tr;
  tr.seg = t >= tiles_d;
  tr.row0 = (t - (tr.seg ? tiles_d : 0)) * kTile;
  tr.n = tr.seg ? ns : nd;
  tr.deg = tr.seg ? dout : din;
  return tr;
}

// Segment `seg`: tile_off[t][j] = sum of tile_vals[t'][j] over the segment's tiles
// t' < t (the max column: their max), bucket_base[seg][b] = partial items of
// buckets below b, and the segment's totals into seg_stats. tile_vals come from
// other blocks: read past L1.
__device__ void segment_scan(int seg, const int* tile_vals, int* tile_off, int tiles_d,
                             int tiles, int V, int chunk, int* bucket_base,
                             long long* seg_stats) {
  __shared__ int s_tot[kHist + kMaxChunk];
  const int t0 = seg ? tiles_d : 0, t1 = seg ? tiles : tiles_d;
  for (int j = threadIdx.x; j < V; j += kBlock) {
    int run = 0;
#pragma unroll 4
    for (int t = t0; t < t1; ++t) {
      const int v = __ldcg(tile_vals + (int64_t)t * V + j);
      tile_off[(int64_t)t * V + j] = run;
      run = j == kMaxCol ? max(run, v) : run + v;
    }
    s_tot[j] = run;
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    int acc = 0;
    for (int b = 0; b < chunk; ++b) {
      bucket_base[seg * chunk + b] = acc;
      acc += s_tot[kHist + b];
    }
  }
  if (threadIdx.x <= kMaxCol) seg_stats[seg * kSegStats + threadIdx.x] = s_tot[threadIdx.x];
  __syncthreads();  // s_tot is reused by the next segment
}

// tile_vals[t] = [sum deg, sum items, split rows, slots, full items, max deg,
// histogram of partial items by bucket (chunk entries)]; the last block to finish
// (counted in *done, zeroed with the degrees) then scans them (segment_scan), which
// saves a launch. The scan reads only finished tiles, so its result does not depend
// on which block runs it.
__global__ void __launch_bounds__(kBlock)
tile_totals_kernel(const int* __restrict__ din, const int* __restrict__ dout, int nd, int ns,
                   int n_loops, int chunk, int tiles_d, int V, int* __restrict__ tile_vals,
                   int* __restrict__ tile_off, int* __restrict__ bucket_base,
                   long long* __restrict__ seg_stats, unsigned* __restrict__ done,
                   unsigned long long* __restrict__ big_cols) {
  __shared__ int s_hist[kMaxChunk];
  __shared__ int s_red[kWarps][kSums + 1];
  __shared__ int s_big;
  __shared__ bool s_last;
  const TileRows tr = tile_rows(blockIdx.x, tiles_d, nd, ns, din, dout);
  for (int b = threadIdx.x; b < chunk; b += kBlock) s_hist[b] = 0;
  if (threadIdx.x == 0) s_big = 0;
  __syncthreads();
  int sum[kSums] = {0, 0, 0, 0, 0};
  int mx = 0;
  for (int j = 0; j < kTile / kBlock; ++j) {
    const int r = tr.row0 + j * kBlock + threadIdx.x;
    if (r < tr.n) {
      const RowWork w = row_work(tr.deg[r] + (r < n_loops), chunk);
      sum[0] += w.deg;
      sum[1] += w.items;
      sum[2] += w.split;
      sum[3] += w.slots;
      sum[4] += w.full;
      mx = max(mx, w.deg);
      if (w.partial) atomicAdd(s_hist + w.bucket, 1);  // shared, integer: order-free
      if (tr.seg && w.deg > kSmallCol) atomicAdd(&s_big, 1);
    }
  }
  for (int o = 16; o > 0; o >>= 1) {
#pragma unroll
    for (int k = 0; k < kSums; ++k) sum[k] += __shfl_xor_sync(kFull, sum[k], o);
    mx = max(mx, __shfl_xor_sync(kFull, mx, o));
  }
  const int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
  if (lane == 0) {
#pragma unroll
    for (int k = 0; k < kSums; ++k) s_red[w][k] = sum[k];
    s_red[w][kMaxCol] = mx;
  }
  __syncthreads();
  int* out = tile_vals + (int64_t)blockIdx.x * V;
  if (threadIdx.x <= kMaxCol) {
    int acc = 0;
    for (int q = 0; q < kWarps; ++q)
      acc = threadIdx.x == kMaxCol ? max(acc, s_red[q][threadIdx.x]) : acc + s_red[q][threadIdx.x];
    out[threadIdx.x] = acc;
  }
  for (int b = threadIdx.x; b < chunk; b += kBlock) out[kHist + b] = s_hist[b];
  if (threadIdx.x == 0 && s_big) atomicAdd(big_cols, (unsigned long long)s_big);
  // Each writer's fence orders its tile_vals before the block's arrival.
  __threadfence();
  __syncthreads();
  if (threadIdx.x == 0) s_last = atomicAdd(done, 1u) == gridDim.x - 1;
  __syncthreads();
  if (!s_last) return;
  __threadfence();
  segment_scan(0, tile_vals, tile_off, tiles_d, gridDim.x, V, chunk, bucket_base, seg_stats);
  if (tiles_d < (int)gridDim.x)
    segment_scan(1, tile_vals, tile_off, tiles_d, gridDim.x, V, chunk, bucket_base, seg_stats);
}

// ------------------------------------------------------------------ phase 2
// Keys and ids of the stable sort by destination (removed self-loops sort past
// every destination) and the kept flags whose exclusive scan numbers the kept
// edges.
template <typename I>
__global__ void __launch_bounds__(kBlock)
prepare_kernel(const I* __restrict__ src, const I* __restrict__ dst, int64_t E0, int nd,
               bool loops, int* __restrict__ key, int* __restrict__ id, int* __restrict__ kept) {
  const int64_t stride = (int64_t)gridDim.x * kBlock;
  for (int64_t i = (int64_t)blockIdx.x * kBlock + threadIdx.x; i < E0; i += stride) {
    const int d = (int)dst[i];
    const bool keep = !(loops && (int)src[i] == d);
    if (key != nullptr) {
      key[i] = keep ? d : nd;
      id[i] = (int)i;
    }
    if (kept != nullptr) kept[i] = keep;
  }
}

// How build_csr places the input edges.
enum EdgeMode : int {
  kCopy = 0,     // grouped by destination, no self-loops: col / csr_row are copies
  kGrouped = 1,  // grouped, self-loops: position = kept id + loops of the rows before
  kSorted = 2,   // not grouped: position = sorted position + loops of the rows before
};

template <typename I>
struct BuildParams {
  // input
  const I* src;
  const I* dst;
  int64_t E0;
  int ns, nd, n_loops, chunk, tiles_d, tiles, V, mode;
  int kept;                  // edges kept; the loops' ids follow them
  int E;                     // CSR edges (kept + n_loops)
  bool long_first;
  const int* din;
  const int* dout;
  const int* tile_off;       // [tiles][V]
  const int* bucket_base;    // [2][chunk]
  int full_total[2], split_total[2];
  const int* rank;           // [E0] id of each kept input edge, or nullptr: the identity
  const int* sorted_key;     // kSorted: destinations in stable sorted order
  const int* sorted_id;      // kSorted: their input edge ids
  // output
  int* rowptr;
  int* colptr;
  int* col;
  int* csr_row;
  int64_t* edge_perm;        // nullptr in kCopy
  int* csc_id;               // [E] 0 .. E - 1, the values of the CSC radix sort, or nullptr
  int* big_list;             // columns of more than kSmallCol edges (csc_order_kernel), or nullptr
  int* big_count;            // their number (zeroed)
  int* items[2];
  int* combine[2];
};

// One tile of rows: the pointer, the self-loops of its destinations and its rows'
// work items. Warp w takes the tile's rows [w * kWarpRows, (w + 1) * kWarpRows),
// 32 at a time, so every row's exclusive prefix of (deg, items, split, slots,
// full) within the segment is tile_off + the warps before + the lanes before.
//
// Work item l of row r (pyg_dfgnn.work_items.work_items) goes to
//   row order (no split row, or long_first off): first_item(r) + l;
//   longest first: full items (chunk edges) in row order first,
//     full_before(r) + l, then the rows' partial items by decreasing length,
//     stable: full_total + bucket_base[b] + (partial items of bucket b in
//     earlier tiles, earlier warps, earlier lanes and iterations).
// Ranks among equal buckets within a warp come from __match_any_sync and a
// per-warp counter per bucket that each group's lowest lane advances.
template <typename I>
__device__ void tile_task(const BuildParams<I>& p) {
  __shared__ int s_cnt[kWarps][kMaxChunk];
  __shared__ int s_wtot[kWarps][kSums];
  const int t = blockIdx.x;
  const TileRows tr = tile_rows(t, p.tiles_d, p.nd, p.ns, p.din, p.dout);
  const int seg = tr.seg, chunk = p.chunk;
  const bool lf = p.long_first && p.split_total[seg] > 0;
  const int* off = p.tile_off + (int64_t)t * p.V;
  int* ptr = seg ? p.colptr : p.rowptr;
  int* items = p.items[seg];
  int* combine = p.combine[seg];
  const int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
  const unsigned lanes_below = (1u << lane) - 1u;
  for (int b = threadIdx.x; b < kWarps * kMaxChunk; b += kBlock) (&s_cnt[0][0])[b] = 0;
  __syncthreads();

  const int row0 = tr.row0 + w * kWarpRows;
  int deg[kIters], ex[kIters][kSums], prank[kIters];
  int carry[kSums] = {0, 0, 0, 0, 0};
#pragma unroll
  for (int it = 0; it < kIters; ++it) {
    const int r = row0 + it * 32 + lane;
    const bool valid = r < tr.n;
    deg[it] = valid ? tr.deg[r] + (r < p.n_loops) : 0;
    const RowWork rw = row_work(deg[it], chunk);
    const int val[kSums] = {rw.deg, valid ? rw.items : 0, rw.split, rw.slots, rw.full};
#pragma unroll
    for (int k = 0; k < kSums; ++k) {
      int x = val[k];
#pragma unroll
      for (int o = 1; o < 32; o <<= 1) {
        const int y = __shfl_up_sync(kFull, x, o);
        if (lane >= o) x += y;
      }
      ex[it][k] = carry[k] + x - val[k];
      carry[k] += __shfl_sync(kFull, x, 31);
    }
    prank[it] = 0;
    if (lf) {  // block-uniform
      const int key = valid && rw.partial ? rw.bucket : -1;
      const unsigned peers = __match_any_sync(kFull, key);
      const unsigned before = peers & lanes_below;
      if (key >= 0) prank[it] = s_cnt[w][key] + __popc(before);
      __syncwarp();
      if (key >= 0 && before == 0) s_cnt[w][key] += __popc(peers);
      __syncwarp();
    }
  }
  if (lane == 0) {
#pragma unroll
    for (int k = 0; k < kSums; ++k) s_wtot[w][k] = carry[k];
  }
  __syncthreads();
  if (lf) {  // per bucket: partial items of the warps before
    for (int b = threadIdx.x; b < chunk; b += kBlock) {
      int run = 0;
      for (int q = 0; q < kWarps; ++q) {
        const int c = s_cnt[q][b];
        s_cnt[q][b] = run;
        run += c;
      }
    }
  }
  int base[kSums];
#pragma unroll
  for (int k = 0; k < kSums; ++k) {
    base[k] = off[k];
    for (int q = 0; q < w; ++q) base[k] += s_wtot[q][k];
  }
  __syncthreads();

  // Unrolled: ex[it] and deg[it] stay in registers.
#pragma unroll
  for (int it = 0; it < kIters; ++it) {
    const int r = row0 + it * 32 + lane;
    if (r >= tr.n) continue;
    const RowWork rw = row_work(deg[it], chunk);
    const int start = base[0] + ex[it][0];
    const int first = base[1] + ex[it][1];
    const int split_id = base[2] + ex[it][2];
    const int slot = base[3] + ex[it][3];
    const int full_before = base[4] + ex[it][4];
    ptr[r] = start;
    if (r == tr.n - 1) ptr[tr.n] = start + rw.deg;
    if (seg == 1 && rw.deg > kSmallCol && p.big_list != nullptr)
      p.big_list[atomicAdd(p.big_count, 1)] = r;  // a work list: its order does not matter
    if (seg == 0 && r < p.n_loops) {  // the row's self-loop closes the row
      const int e = start + rw.deg - 1;
      p.col[e] = r;
      p.csr_row[e] = r;
      p.edge_perm[e] = (int64_t)p.kept + r;
    }
    int partial_pos = 0;
    if (lf && rw.partial)
      partial_pos = p.full_total[seg] + p.bucket_base[seg * chunk + rw.bucket] +
                    off[kHist + rw.bucket] + s_cnt[w][rw.bucket] + prank[it];
    for (int l = 0; l < rw.items; ++l) {
      const int pos = !lf ? first + l : l < rw.full ? full_before + l : partial_pos;
      int* item = items + 3 * (int64_t)pos;
      item[0] = r;
      item[1] = start + l * chunk;
      item[2] = rw.split ? slot + l : -1;
    }
    if (rw.split) {
      int* c = combine + 3 * (int64_t)split_id;
      c[0] = r;
      c[1] = slot;
      c[2] = rw.items;
    }
  }
}

// The input edges' CSR entries (and the CSC sort's values), grid-stride over the
// blocks after the tiles.
template <typename I>
__device__ void edge_task(const BuildParams<I>& p) {
  const int64_t n_blocks = gridDim.x - p.tiles;
  const int64_t stride = n_blocks * kBlock;
  const int64_t total = max(p.E0, (int64_t)p.E);
  for (int64_t i = (int64_t)(blockIdx.x - p.tiles) * kBlock + threadIdx.x; i < total;
       i += stride) {
    if (p.csc_id != nullptr && i < p.E) p.csc_id[i] = (int)i;
    if (p.mode == kCopy) {
      if (i < p.E0) {
        p.col[i] = (int)p.src[i];
        p.csr_row[i] = (int)p.dst[i];
      }
    } else if (p.mode == kGrouped) {
      if (i < p.E0) {
        const int s = (int)p.src[i], d = (int)p.dst[i];
        if (s != d) {
          const int id = p.rank != nullptr ? p.rank[i] : (int)i;
          const int e = id + min(d, p.n_loops);
          p.col[e] = s;
          p.csr_row[e] = d;
          p.edge_perm[e] = id;
        }
      }
    } else if (i < p.kept) {  // kSorted: the kept edges lead the sorted order
      const int j = p.sorted_id[i], d = p.sorted_key[i];
      const int e = (int)i + min(d, p.n_loops);
      p.col[e] = (int)p.src[j];
      p.csr_row[e] = d;
      p.edge_perm[e] = p.rank != nullptr ? p.rank[j] : j;
    }
  }
}

template <typename I>
__global__ void __launch_bounds__(kBlock) build_csr_kernel(const BuildParams<I> p) {
  if ((int)blockIdx.x < p.tiles) tile_task(p);
  else edge_task(p);
}

__global__ void __launch_bounds__(kBlock)
gather_rows_kernel(const int* __restrict__ csr_row, const int* __restrict__ perm, int E,
                   int* __restrict__ row) {
  const int stride = gridDim.x * kBlock;
  for (int i = blockIdx.x * kBlock + threadIdx.x; i < E; i += stride) row[i] = csr_row[perm[i]];
}

// The CSC without a device-wide sort: CSR position e goes to its column's region
// of perm; a column of one edge is done here (row included), a longer one gets
// its CSR positions in atomic order in tmp, which csc_order_kernel sorts. The
// stable order by column is the ascending order of CSR positions within each
// column, unique, so the result does not depend on the atomics' order.
__global__ void __launch_bounds__(kBlock)
csc_scatter_kernel(const int* __restrict__ col, const int* __restrict__ csr_row,
                   const int* __restrict__ colptr, int E, int* __restrict__ fill,
                   int* __restrict__ tmp, int* __restrict__ perm, int* __restrict__ row) {
  const int64_t stride = (int64_t)gridDim.x * kBlock;
  for (int64_t e = (int64_t)blockIdx.x * kBlock + threadIdx.x; e < E; e += stride) {
    const int c = col[e];
    const int start = colptr[c];
    if (colptr[c + 1] - start == 1) {
      perm[start] = (int)e;
      row[start] = csr_row[e];
    } else {
      tmp[start + atomicAdd(fill + c, 1)] = (int)e;
    }
  }
}

// One column of d CSR positions (tmp[start ..]) sorted by a block radix sort of
// kBlock x ITEMS keys (padded with `pad`, above every position) into perm, and
// row gathered.
template <typename BlockSort, int ITEMS>
__device__ __forceinline__ void sort_column(typename BlockSort::TempStorage& storage,
                                            const int* tmp, const int* csr_row, int start,
                                            int d, int bits, unsigned pad, int* perm,
                                            int* row) {
  unsigned keys[ITEMS];
#pragma unroll
  for (int k = 0; k < ITEMS; ++k) {
    const int at = threadIdx.x * ITEMS + k;
    keys[k] = at < d ? (unsigned)tmp[start + at] : pad;
  }
  BlockSort(storage).Sort(keys, 0, bits);  // blocked: thread t holds ranks t * ITEMS + k
#pragma unroll
  for (int k = 0; k < ITEMS; ++k) {
    const int at = threadIdx.x * ITEMS + k;
    if (at < d) {
      perm[start + at] = (int)keys[k];
      row[start + at] = csr_row[keys[k]];
    }
  }
}

// Sorts each column's CSR positions in tmp into perm and gathers row. Blocks
// below big_blocks take the listed columns of more than kSmallCol (at most
// kBigCol) edges, one at a time; the others walk all columns a warp of 32 at a
// time and sort those of 2 .. kSmallCol edges, one column per step of the warp.
__global__ void __launch_bounds__(kBlock)
csc_order_kernel(const int* __restrict__ tmp, const int* __restrict__ csr_row,
                 const int* __restrict__ colptr, int ns, const int* __restrict__ big_list,
                 int n_big, int big_blocks, int bits, int* __restrict__ perm,
                 int* __restrict__ row) {
  using Sort4 = cub::BlockRadixSort<unsigned, kBlock, 4>;
  using Sort16 = cub::BlockRadixSort<unsigned, kBlock, kBigCol / kBlock>;
  __shared__ union {
    typename Sort4::TempStorage small;
    typename Sort16::TempStorage big;
  } s_sort;
  __shared__ int s_v[kBlock];
  if ((int)blockIdx.x < big_blocks) {
    const unsigned pad = (1u << bits) - 1u;  // above every CSR position (key_bits(E))
    for (int i = blockIdx.x; i < n_big; i += big_blocks) {
      const int c = big_list[i];
      const int start = colptr[c], d = colptr[c + 1] - start;  // block-uniform
      if (d <= kBlock) {
        const int v = (int)threadIdx.x < d ? tmp[start + threadIdx.x] : INT_MAX;
        s_v[threadIdx.x] = v;
        __syncthreads();
        if ((int)threadIdx.x < d) {
          int rank = 0;
          for (int j = 0; j < d; ++j) rank += s_v[j] < v;
          perm[start + rank] = v;
          row[start + rank] = csr_row[v];
        }
      } else if (d <= 4 * kBlock) {
        sort_column<Sort4, 4>(s_sort.small, tmp, csr_row, start, d, bits, pad, perm, row);
      } else {
        sort_column<Sort16, kBigCol / kBlock>(s_sort.big, tmp, csr_row, start, d, bits, pad,
                                              perm, row);
      }
      __syncthreads();  // s_v / s_sort are reused by the next column
    }
    return;
  }
  const int lane = threadIdx.x & 31;
  const int64_t stride = (int64_t)(gridDim.x - big_blocks) * kBlock;
  // `base` is warp-uniform: every lane reaches the shuffles.
  for (int64_t base = (int64_t)(blockIdx.x - big_blocks) * kBlock + (threadIdx.x & ~31);
       base < ns; base += stride) {
    const int64_t c = base + lane;
    int start = 0, d = 0;
    if (c < ns) {
      start = colptr[c];
      d = colptr[c + 1] - start;
    }
    unsigned todo = __ballot_sync(kFull, d >= 2 && d <= kSmallCol);
    while (todo) {
      const int l = __ffs(todo) - 1;
      todo &= todo - 1;
      const int s = __shfl_sync(kFull, start, l), n = __shfl_sync(kFull, d, l);
      const int v = lane < n ? tmp[s + lane] : INT_MAX;
      int rank = 0;
      for (int j = 0; j < n; ++j) rank += __shfl_sync(kFull, v, j) < v;
      if (lane < n) {
        perm[s + rank] = v;
        row[s + rank] = csr_row[v];
      }
    }
  }
}

// ------------------------------------------------------------------ host
int64_t ceil_div64(int64_t a, int64_t b) { return (a + b - 1) / b; }

// Bits of the keys 0 .. max_key (at least one: cub sorts on [0, end_bit)).
int key_bits(int64_t max_key) {
  int bits = 1;
  while (bits < 31 && (int64_t(1) << bits) <= max_key) ++bits;
  return bits;
}

// Regions of one device allocation, each on a 256-byte boundary (no less than
// the caching allocator gives a tensor of its own, so kernels that read an output
// with vector loads see the alignment they would see otherwise).
struct Arena {
  int64_t bytes = 0;
  int64_t take(int64_t n) {
    const int64_t at = bytes;
    bytes += (n + 255) / 256 * 256;
    return at;
  }
};

// A pinned host buffer per thread for the statistics (allocated once, kept).
long long* host_stats() {
  thread_local long long* buf = nullptr;
  if (buf == nullptr) {
    void* p = nullptr;
    C10_CUDA_CHECK(cudaHostAlloc(&p, kStatWords * sizeof(long long), cudaHostAllocPortable));
    buf = static_cast<long long*>(p);
  }
  return buf;
}

int grid_for(int64_t n, int max_blocks) {
  return (int)std::max<int64_t>(1, std::min<int64_t>(ceil_div64(n, kBlock), max_blocks));
}

// A contiguous tensor of `sizes` and type `dt` at byte `offset` of buf's storage.
// The outputs share one allocation this way, each still a tensor of its own (its
// own version counter, not a view of buf), with no dispatcher call per output.
// All of one dtype: torch.save refuses a storage seen as two.
at::Tensor carve(const at::Tensor& buf, at::ScalarType dt, int64_t offset,
                 at::IntArrayRef sizes) {
  at::Tensor t = at::detail::make_tensor<c10::TensorImpl>(
      c10::Storage(buf.storage()), buf.key_set(), c10::scalarTypeToTypeMeta(dt));
  c10::TensorImpl* impl = t.unsafeGetTensorImpl();
  impl->set_storage_offset(offset / (int64_t)c10::elementSize(dt));
  impl->set_sizes_contiguous(sizes);
  return t;
}

// cub's temporary storage for a stable radix sort of n (int key, int value) pairs
// on [0, bits) (0 bytes for n == 0).
size_t sort_bytes_for(int64_t n, int bits, cudaStream_t stream) {
  size_t bytes = 0;
  if (n > 0)
    C10_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(
        nullptr, bytes, (const int*)nullptr, (int*)nullptr, (const int*)nullptr, (int*)nullptr,
        (int)n, 0, bits, stream));
  return bytes;
}

template <typename I>
std::vector<at::Tensor> build(const at::Tensor& ei, int64_t ns64, int64_t nd64, bool loops,
                              bool with_csc, int64_t chunk64, bool long_first) {
  const int ns = (int)ns64, nd = (int)nd64, chunk = (int)chunk64;
  const int64_t E0 = ei.size(1);
  const int n_loops = loops ? std::min(ns, nd) : 0;
  const int64_t E_max = E0 + n_loops;  // E before removed self-loops are counted
  const I* src = ei.data_ptr<I>();
  const I* dst = src + ei.stride(0);
  auto stream = c10::cuda::getCurrentCUDAStream();
  int sms = 0;
  C10_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount,
                                        c10::cuda::current_device()));
  const auto u8 = ei.options().dtype(at::kByte);

  // ---- scratch of both phases: one allocation, sized before the synchronisation
  // for what phase 2 may need (whether the input is grouped or has self-loops to
  // remove, and E, are known only after it); it lives until the build returns.
  // Only the CSC's radix sort (a column beyond kBigCol edges) may need more
  // temporary storage, allocated then.
  const int tiles_d = (int)ceil_div64(nd, kTile);
  const int tiles_s = with_csc ? (int)ceil_div64(ns, kTile) : 0;
  const int tiles = tiles_d + tiles_s;
  const int V = kHist + chunk;
  const int nd_bits = key_bits(nd), ns_bits = key_bits(ns - 1);
  const bool may_sort = E0 > 1, may_remove = loops && E0 > 0;
  size_t scan_bytes = 0;
  if (may_remove)
    C10_CUDA_CHECK(cub::DeviceScan::ExclusiveSum(nullptr, scan_bytes, (const int*)nullptr,
                                                 (int*)nullptr, (int)E0, stream));
  const size_t sort_bytes = may_sort ? sort_bytes_for(E0, nd_bits, stream) : 0;
  const size_t temp_bytes = std::max({scan_bytes, sort_bytes, size_t(1)});
  Arena a;
  const int64_t o_stats = a.take(kStatWords * 8);
  const int64_t o_din = a.take((int64_t)nd * 4);
  const int64_t o_dout = a.take(with_csc ? (int64_t)ns * 4 : 0);
  const int64_t o_fill = a.take(with_csc ? ((int64_t)ns + 1) * 4 : 0);  // + big_count
  const int64_t zero_bytes = a.bytes;
  const int64_t o_vals = a.take((int64_t)tiles * V * 4);
  const int64_t o_off = a.take((int64_t)tiles * V * 4);
  const int64_t o_bucket = a.take(2 * (int64_t)chunk * 4);
  const int64_t o_temp = a.take((int64_t)temp_bytes);
  const int64_t o_key = a.take(may_sort ? E0 * 4 : 0);
  const int64_t o_id = a.take(may_sort ? E0 * 4 : 0);
  const int64_t o_skey = a.take(may_sort ? E0 * 4 : 0);
  const int64_t o_sid = a.take(may_sort ? E0 * 4 : 0);
  const int64_t o_flag = a.take(may_remove ? E0 * 4 : 0);
  const int64_t o_rank = a.take(may_remove ? E0 * 4 : 0);
  // The CSC radix sort's values and keys, or csc_scatter's tmp and the big-column
  // list (fewer than E / kSmallCol entries).
  const int64_t o_cscid = a.take(with_csc ? E_max * 4 : 0);
  const int64_t o_csckey = a.take(with_csc ? E_max * 4 : 0);
  at::Tensor scratch = at::empty({a.bytes}, u8);
  char* sb = static_cast<char*>(scratch.data_ptr());
  auto region = [&](int64_t o) { return reinterpret_cast<int*>(sb + o); };
  auto* stats = reinterpret_cast<unsigned long long*>(sb + o_stats);
  int* din = region(o_din);
  int* dout = with_csc ? region(o_dout) : nullptr;
  int* fill = with_csc ? region(o_fill) : nullptr;
  int* tile_vals = region(o_vals);
  int* tile_off = region(o_off);
  int* bucket_base = region(o_bucket);
  void* temp = sb + o_temp;

  // ---- phase 1
  C10_CUDA_CHECK(cudaMemsetAsync(sb, 0, zero_bytes, stream));
  if (E0 > 0) {
    count_edges_kernel<I><<<grid_for(E0, 4 * sms), kBlock, 0, stream>>>(
        src, dst, E0, ns, nd, loops, din, dout, stats);
    check_launch();
  }
  tile_totals_kernel<<<tiles, kBlock, 0, stream>>>(
      din, dout, nd, ns, n_loops, chunk, tiles_d, V, tile_vals, tile_off, bucket_base,
      reinterpret_cast<long long*>(stats + kEdgeStats),
      reinterpret_cast<unsigned*>(stats + kDone), stats + kBigCols);
  check_launch();
  long long* hs = host_stats();
  c10::cuda::memcpy_and_sync(hs, stats, kStatWords * sizeof(long long), cudaMemcpyDeviceToHost,
                             stream);  // the build's one synchronisation

  // ---- host: checks and sizes
  at::Tensor info = at::empty({kInfoSize}, at::TensorOptions().dtype(at::kLong));
  int64_t* inf = info.data_ptr<int64_t>();
  for (int k = 0; k < kInfoSize; ++k) inf[k] = 0;
  const long long* seg_d = hs + kEdgeStats;
  const long long* seg_s = hs + kEdgeStats + kSegStats;
  if (E0 > 0) {
    inf[kInfoLoSrc] = from_order_key(~static_cast<unsigned long long>(hs[kNotLoSrc]));
    inf[kInfoLoDst] = from_order_key(~static_cast<unsigned long long>(hs[kNotLoDst]));
    inf[kInfoHiSrc] = from_order_key(static_cast<unsigned long long>(hs[kHiSrc]));
    inf[kInfoHiDst] = from_order_key(static_cast<unsigned long long>(hs[kHiDst]));
    if (std::min(inf[kInfoLoSrc], inf[kInfoLoDst]) < 0 || inf[kInfoHiSrc] >= ns ||
        inf[kInfoHiDst] >= nd) {
      inf[kInfoStatus] = 1;
      // Empty, not undefined, tensors: a Tensor[] with undefined entries cannot
      // pass through Python dispatch (a TorchDispatchMode, the profiler's modes).
      std::vector<at::Tensor> out(11, carve(scratch, at::kInt, 0, {0}));
      out.push_back(info);
      return out;
    }
  }
  const int kept = (int)hs[kKept];
  const bool unsorted = hs[kUnsorted] != 0;
  const int E = kept + n_loops;
  TORCH_CHECK(seg_d[0] == E && (!with_csc || seg_s[0] == E),
              "dfgnn::layout_build: inconsistent degree totals (internal error)");
  inf[kInfoKept] = kept;
  inf[kInfoUnsorted] = unsorted;
  inf[kInfoMaxInDegree] = seg_d[kMaxCol];
  inf[kInfoRowSlots] = seg_d[3];
  inf[kInfoColSlots] = with_csc ? seg_s[3] : 0;
  inf[kInfoNumEdges] = E;
  inf[kInfoMaxOutDegree] = with_csc ? seg_s[kMaxCol] : 0;

  // ---- phase 2: the int32 outputs in one allocation, edge_perm in its own
  const bool removed = loops && kept < E0;
  const int mode = unsorted ? kSorted : loops ? kGrouped : kCopy;
  const bool radix_csc = with_csc && E > 0 && seg_s[kMaxCol] > kBigCol;
  const int64_t n_ritems = seg_d[1], n_rcomb = seg_d[2];
  const int64_t n_citems = with_csc ? seg_s[1] : 0, n_ccomb = with_csc ? seg_s[2] : 0;
  const int64_t csc_e = with_csc ? (int64_t)E * 4 : 0;
  Arena ao;
  const int64_t o_rowptr = ao.take(((int64_t)nd + 1) * 4);
  const int64_t o_col = ao.take((int64_t)E * 4);
  const int64_t o_csr_row = ao.take((int64_t)E * 4);
  const int64_t o_ritems = ao.take(n_ritems * 12);
  const int64_t o_rcomb = ao.take(n_rcomb * 12);
  const int64_t o_colptr = ao.take(with_csc ? ((int64_t)ns + 1) * 4 : 0);
  const int64_t o_row = ao.take(csc_e);
  const int64_t o_perm = ao.take(csc_e);
  const int64_t o_citems = ao.take(n_citems * 12);
  const int64_t o_ccomb = ao.take(n_ccomb * 12);
  at::Tensor buf = at::empty({ao.bytes}, u8);
  char* ob = static_cast<char*>(buf.data_ptr());
  auto out_at = [&](int64_t o) { return reinterpret_cast<int*>(ob + o); };
  // Outputs not built are empty (see the error path above): edge_perm where it
  // is the identity, the CSC without with_csc.
  const at::Tensor none = carve(buf, at::kInt, 0, {0});
  auto csc_out = [&](int64_t o, at::IntArrayRef sizes) {
    return with_csc ? carve(buf, at::kInt, o, sizes) : none;
  };
  std::vector<at::Tensor> outs = {
      carve(buf, at::kInt, o_rowptr, {(int64_t)nd + 1}),
      carve(buf, at::kInt, o_col, {E}),
      carve(buf, at::kInt, o_csr_row, {E}),
      // int64 in an allocation of its own: torch.save refuses one storage seen
      // as two dtypes.
      mode == kCopy ? none : at::empty({E}, ei.options().dtype(at::kLong)),
      csc_out(o_colptr, {(int64_t)ns + 1}),
      csc_out(o_row, {E}),
      csc_out(o_perm, {E}),
      carve(buf, at::kInt, o_ritems, {n_ritems, 3}),
      carve(buf, at::kInt, o_rcomb, {n_rcomb, 3}),
      csc_out(o_citems, {n_citems, 3}),
      csc_out(o_ccomb, {n_ccomb, 3}),
      info};

  if (unsorted || removed) {
    prepare_kernel<I><<<grid_for(E0, 4 * sms), kBlock, 0, stream>>>(
        src, dst, E0, nd, loops, unsorted ? region(o_key) : nullptr, region(o_id),
        removed ? region(o_flag) : nullptr);
    check_launch();
  }
  if (removed) {
    size_t bytes = scan_bytes;
    C10_CUDA_CHECK(cub::DeviceScan::ExclusiveSum(temp, bytes, (const int*)region(o_flag),
                                                 region(o_rank), (int)E0, stream));
  }
  if (unsorted) {
    size_t bytes = sort_bytes;
    C10_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(
        temp, bytes, (const int*)region(o_key), region(o_skey), (const int*)region(o_id),
        region(o_sid), (int)E0, 0, nd_bits, stream));
  }

  BuildParams<I> p{};
  p.src = src;
  p.dst = dst;
  p.E0 = E0;
  p.ns = ns;
  p.nd = nd;
  p.n_loops = n_loops;
  p.chunk = chunk;
  p.tiles_d = tiles_d;
  p.tiles = tiles;
  p.V = V;
  p.mode = mode;
  p.kept = kept;
  p.E = E;
  p.long_first = long_first;
  p.din = din;
  p.dout = dout;
  p.tile_off = tile_off;
  p.bucket_base = bucket_base;
  p.full_total[0] = (int)seg_d[4];
  p.full_total[1] = with_csc ? (int)seg_s[4] : 0;
  p.split_total[0] = (int)seg_d[2];
  p.split_total[1] = with_csc ? (int)seg_s[2] : 0;
  p.rank = removed ? region(o_rank) : nullptr;
  p.sorted_key = unsorted ? region(o_skey) : nullptr;
  p.sorted_id = unsorted ? region(o_sid) : nullptr;
  p.rowptr = out_at(o_rowptr);
  p.colptr = with_csc ? out_at(o_colptr) : nullptr;
  p.col = out_at(o_col);
  p.csr_row = out_at(o_csr_row);
  p.edge_perm = mode == kCopy ? nullptr : outs[3].data_ptr<int64_t>();
  p.csc_id = radix_csc ? region(o_cscid) : nullptr;
  p.big_list = with_csc && !radix_csc ? region(o_csckey) : nullptr;
  p.big_count = with_csc ? fill + ns : nullptr;
  p.items[0] = out_at(o_ritems);
  p.items[1] = with_csc ? out_at(o_citems) : nullptr;
  p.combine[0] = out_at(o_rcomb);
  p.combine[1] = with_csc ? out_at(o_ccomb) : nullptr;
  const int64_t edge_work = std::max<int64_t>(E0, E);
  const int edge_blocks = edge_work > 0 ? grid_for(edge_work, 4 * sms) : 0;
  build_csr_kernel<I><<<tiles + edge_blocks, kBlock, 0, stream>>>(p);
  check_launch();

  if (radix_csc) {
    size_t bytes = sort_bytes_for(E, ns_bits, stream);
    at::Tensor more;
    void* csc_temp = temp;
    if (bytes > temp_bytes) {
      more = at::empty({(int64_t)bytes}, u8);
      csc_temp = more.data_ptr();
    }
    C10_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(
        csc_temp, bytes, (const int*)p.col, region(o_csckey), (const int*)region(o_cscid),
        out_at(o_perm), E, 0, ns_bits, stream));
    gather_rows_kernel<<<grid_for(E, 4 * sms), kBlock, 0, stream>>>(
        p.csr_row, out_at(o_perm), E, out_at(o_row));
    check_launch();
  } else if (with_csc && E > 0) {
    csc_scatter_kernel<<<grid_for(E, 4 * sms), kBlock, 0, stream>>>(
        p.col, p.csr_row, p.colptr, E, fill, region(o_cscid), out_at(o_perm), out_at(o_row));
    check_launch();
    const int n_big = (int)hs[kBigCols];
    const int big_blocks = std::min(n_big, 2 * sms);
    csc_order_kernel<<<big_blocks + grid_for(ns, 4 * sms), kBlock, 0, stream>>>(
        region(o_cscid), p.csr_row, p.colptr, ns, region(o_csckey), n_big, big_blocks,
        key_bits(E), out_at(o_perm), out_at(o_row));
    check_launch();
  }
  return outs;
}

}  // namespace

std::vector<at::Tensor> layout_build_cuda(const at::Tensor& edge_index, int64_t num_src,
                                          int64_t num_dst, bool self_loops, bool with_csc,
                                          int64_t chunk, bool long_first) {
  const c10::cuda::CUDAGuard guard(edge_index.device());
  if (edge_index.scalar_type() == at::kInt)
    return build<int>(edge_index, num_src, num_dst, self_loops, with_csc, chunk, long_first);
  return build<int64_t>(edge_index, num_src, num_dst, self_loops, with_csc, chunk, long_first);
}

}  // namespace dfgnn
