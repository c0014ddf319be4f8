// Forward pass of the additive score (scores/additive.cuh; GAT / GATConv):
//   e_ij = LeakyReLU(a_dst_i + a_src_j [+ a_edge_ij]),
//   out_i = sum_{j -> i} softmax_j(e_ij) x_j
// with a_dst = a_dst^T W x_i and a_src = a_src^T W x_j computed densely ([N, H]);
// the kernels are templates over the score functor (Score: AdditiveScore, or
// AdditiveEdgeScore with the per-edge term, read at the edge's CSR position).
//
// SMMF (paper Fig. 12: the per-edge score is one add, so there is nothing to
// balance): one lane group per (dst, head) work item; each lane scores one edge
// of a tile of G (the paper's redundancy-free softmax, §4.2 and Fig. 7b, in
// registers instead of shared memory), the softmax is online per tile and the
// row of x_j is the only vector load per edge. Split rows are merged like the GT
// kernel's.
// PMF: an edge-parallel kernel writes the scores [E, H], then softmax_spmm.
// With the tiles SMMF measured as fast or faster on every graph, so "auto" picks
// SMMF, as the paper does (docs/design.md, "SMMF or PMF").
// The plan's row_walk runs the SMMF forward on the shared row walk instead
// (scores/additive_row.cuh; the score without its per-edge term).
#include "device/dropout.cuh"
#include "device/edge_walk.cuh"
#include "device/lane_group.cuh"
#include "device/numerics.cuh"
#include "device/online_softmax.cuh"
#include "device/work_items.cuh"
#include "host/dispatch.cuh"
#include "host/forward_call.h"
#include "host/forward_launch.cuh"
#include "scores/additive.cuh"
#include "scores/additive_host.h"
#include "scores/additive_row.cuh"

namespace dfgnn {
namespace {

// G < 32 with NV = 2 is the two-rows-per-warp shape (host code below), held to
// 3 blocks per SM.
// MERGE: the variant that merges split rows in the kernel (with_merge_variant).
template <typename Score, typename S, bool DROPOUT, bool MERGE = true>
__global__ void __launch_bounds__(256, (S::G < 32 && S::NV == 2) ? 3 : 0)
gat_fwd_kernel(const typename S::T* __restrict__ a_dst, const typename S::T* __restrict__ a_src,
               const typename S::T* __restrict__ a_edge, const typename S::T* __restrict__ x,
               const int* __restrict__ rowptr, const int* __restrict__ col,
               const int* __restrict__ items, int chunk,
               typename S::T* __restrict__ out, float* __restrict__ lse2, float* __restrict__ attn,
               float* __restrict__ partial, float* __restrict__ partial_ml, int64_t n_units, int H,
               int C, float slope, float p, uint64_t seed, int n_edges,
               int* __restrict__ counters) {
  using T = typename S::T;
  constexpr int VEC = S::VEC, G = S::G, NV = S::NV;
  // The GT kernel's edges in flight, although GAT loads one row per edge, not
  // two: twice as many measured 10-20 % slower (registers, fewer resident warps).
  constexpr int U = edges_in_flight<VEC, NV>();
  GroupItem g;
  if (!group_item<G>(items, rowptr, chunk, n_units, H, g)) return;
  const int gl = g.gl, h = g.h, beg = g.beg, end = g.end;
  const unsigned mask = g.mask;
  const int nvec = C / VEC;
  const int64_t HC = (int64_t)H * C;
  const Score sc = Score::make(a_dst, a_src, a_edge, slope);
  const float ad = sc.own_dst_term(g.row, h, H);
  // The gathered terms of this lane's edge at CSR position pos (a valid
  // position wherever jj >= 0: NbrTile reads col there).
  auto a_of = [&](int jj, int pos) { return jj >= 0 ? sc.src_edge_term(jj, pos, h, H) : 0.f; };

  // A tile of G edges at a time: each lane scores its own edge (a_src gathered
  // one tile ahead, indices two), the tile's max rescales the accumulator once,
  // and the steps take their neighbours and weights from the lanes by shuffle, so
  // a step waits only on its x rows.
  OnlineSoftmax<T, VEC, G, NV, U, DROPOUT> os;  // os.l holds this lane's partial sum
  NbrTile<G, 2> nt(col, beg, end, gl, mask, n_edges);
  float a_cur = a_of(nt.raw, beg + gl);  // speculative: issued before the item's end is known
  for (; nt.valid(); nt.advance()) {
    const float a_next = a_of(nt.ahead[0], nt.t0 + G + gl);
    const int e = nt.edge();
    const bool mine = nt.cur >= 0;
    const float sl = mine ? sc.score2(ad + a_cur) : kNegInf;
    if (attn != nullptr && mine) attn[(int64_t)e * H + h] = sl;  // finish() normalises
    const float mc = os.raise_max(group_max<G>(sl, mask));
    float wl = mine ? exp2f(sl - mc) : 0.f;
    os.l += wl;
    if constexpr (DROPOUT) wl *= dropout_scale(p, seed, (uint64_t)e * H + h);
    tile_spmm<T, VEC, G, NV, U>(nt, wl, x, HC, (int64_t)h * C, gl, nvec, os.acc);
    a_cur = a_next;
  }
  os.l = group_sum<G>(os.l, mask);
  // No O32: the additive backward computes D with d a_dst (additive_backward.cu).
  os.template finish<MERGE && !(G < 32 && NV == 2)>(g, H, C, chunk, rowptr, out, nullptr, lse2,
                                                     attn, partial, partial_ml, counters);
}

// PMF step 1: one thread per (edge, head), CSR order, base-2 scores.
template <typename Score>
__global__ void __launch_bounds__(256)
gat_score_kernel(const typename Score::T* __restrict__ a_dst,
                 const typename Score::T* __restrict__ a_src,
                 const typename Score::T* __restrict__ a_edge, const int* __restrict__ csr_row,
                 const int* __restrict__ col, float* __restrict__ score, int64_t n_units, int H,
                 float slope) {
  const int64_t unit = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (unit >= n_units) return;
  const int64_t e = unit / H;
  const int h = (int)(unit - e * H);
  const Score sc = Score::make(a_dst, a_src, a_edge, slope);
  score[unit] = sc.score2(sc.dst_term(__ldg(csr_row + e), h, H) +
                          sc.src_edge_term(__ldg(col + e), e, h, H));
}

}  // namespace

std::tuple<at::Tensor, at::Tensor, at::Tensor> gat_forward_cuda(
    const at::Tensor& a_dst, const at::Tensor& a_src, const at::Tensor& x, const LayoutView& L,
    double negative_slope, double dropout, int64_t seed, bool need_attn,
    const KernelPlan& plan, const at::Tensor& a_edge) {
  const char* op = a_edge.defined() ? "dfgnn::attention_fwd (additive_edge)"
                                    : "dfgnn::attention_fwd (additive)";
  const at::Tensor &rowptr = L.rowptr, &col = L.col;
  const Work& rw = L.rw;
  const int64_t H = x.size(1), C = x.size(2), E = col.size(0);
  ForwardCall fc(x, a_dst.size(0), L, plan.pmf, need_attn);
  check_vector_rows(op, plan.vector_rows, {{"x", &x}, {"out", &fc.out}});
  check_two_rows(op, plan, L, x.scalar_type(), C);
  // The edge term is not a per-source scalar: the row walk has no variant with it.
  TORCH_CHECK(!plan.row_walk || !a_edge.defined(), op, ": row_walk=1 (the shared row walk) "
              "takes the node-only additive score; the additive_edge score has its own walk");
  fc.merge_in_kernel(op, plan, L);
  const float p = (float)dropout, slope = (float)negative_slope;
  const int64_t n_units = rw.items.size(0) * H;
  constexpr int kThreads = 256;  // edge-parallel PMF kernels
  auto stream = c10::cuda::getCurrentCUDAStream();
  dispatch_rows(x.scalar_type(), C, plan.vector_rows, op, [&](auto shape) {
    using S = decltype(shape);
    using T = typename S::T;
    with_additive_score<T>(a_edge.defined(), [&](auto score) {
      using Score = decltype(score);
      const T* ae = a_edge.defined() ? cptr<T>(a_edge) : nullptr;
      if (plan.pmf) {  // scores here, softmax + SpMM in fc.finish
        if (E * H == 0) return;
        gat_score_kernel<Score><<<ceil_div(E * H, kThreads), kThreads, 0, stream>>>(
            cptr<T>(a_dst), cptr<T>(a_src), ae, L.csr_row.data_ptr<int>(), col.data_ptr<int>(),
            fc.score(), E * H, H, slope);
        check_launch();
        return;
      }
      if constexpr (!Score::kEdge) {
        if (plan.row_walk) {  // the shared row walk (scores/additive_row.cuh)
          launch_row_smmf<AdditiveRowScore, S>(
              op, AdditiveRowParams<T>{cptr<T>(x), cptr<T>(a_dst), cptr<T>(a_src), slope}, L, fc,
              (int)H, (int)C, p, seed, plan.two_rows);
          return;
        }
      }
      if (n_units == 0) return;
      auto launch = [&](auto kern, int lanes) {
        kern<<<ceil_div(n_units * lanes, kNodeBlock), kNodeBlock, 0, stream>>>(
            cptr<T>(a_dst), cptr<T>(a_src), ae, cptr<T>(x), rowptr.data_ptr<int>(),
            col.data_ptr<int>(),
            rw.items.data_ptr<int>(), (int)L.chunk, mptr<T>(fc.out), fc.lse2.data_ptr<float>(),
            fc.attn_ptr(), fc.partial(), fc.partial_ml(), n_units,
            H, C, slope, p, (uint64_t)seed, (int)E, fc.counters);
        check_launch();
      };
      with_smmf_shape<S>(op, plan.two_rows, [&](auto shape2, auto) {
        using S2 = decltype(shape2);
        with_merge_variant<T>(fc.counters != nullptr, [&](auto merge) {
          constexpr bool M = decltype(merge)::value;
          launch(p > 0.f ? gat_fwd_kernel<Score, S2, true, M>
                         : gat_fwd_kernel<Score, S2, false, M>, S2::G);
        });
      });
    });
  });
  fc.finish(x, L, plan, dropout, seed);
  return {fc.out, fc.lse2, fc.attn};
}

}  // namespace dfgnn
