// Backward pass of dot-product attention on tensor cores (fp16 / bf16), the two
// walks of the two-launch backward (dot_backward.cu) with mma.m16n8k16:
//   dq walk (CSR):  dQ_i = scale * sum_{j -> i} dS_ij k_j,
//                   dS_ij = P_ij (dO_i . v_j - D_i),  P_ij = 2^(scale2 q_i . k_j - lse2_i),
//                   and each edge's (P_ij, dS_ij) in fp32 into pds [E, H] (CSR order);
//   dkv walk (CSC): dV_j = sum_i P_ij dO_i,  dK_j = scale * sum_i dS_ij q_i,
//                   the weights read back from pds through the CSC permutation.
//
// Why: the CUDA-core walks spend per edge and channel widening converts and FMAs
// (q . k, dO . v, dS k; P dO, dS q) and a shuffle reduction per edge for each
// dot product; bf16 forward+backward was only 0.96-1.28x fp32 on batch and
// power-law graphs. Both walks are the forward's sparse unit (scores/dot_mma.cuh,
// gt_mma_unit) rearranged: one warp owns 8 consecutive rows (dq: destinations,
// dkv: sources) of one head and walks their edges, contiguous in CSR / CSC, 16
// at a time:
//   dq:  S [16 edges x 8 rows] = K . Q^T,  dP = V . dO^T,
//        dS = P (dP - D) where the edge belongs to the column's row, else 0,
//        dQ^T [C x 8] += K^T [C x 16] . dS;
//   dkv: dV^T [C x 8] += dO^T [C x 16] . P,  dK^T [C x 8] += Q^T [C x 16] . dS,
// the SpMM weights rounded to T (fp32 accumulation, as flash attention's
// backward). No online softmax: lse2 (forward) and D (out_dsum, fp32)
// are known. The dq walk loads k twice per tile: as 16-byte row slices for the
// SDDMM (A operand, rows = edges) and by whole 128-byte lines for the SpMM (A
// operand, rows = channels; load_v_words), the second from L1.
// Rows and columns are walked whole, whatever the work items: each output row is
// written once, no partials, no atomics (deterministic); a split row or column
// is one warp's, slow but not wrong. A non-finite gathered row makes the output
// of all 8 rows of its block non-finite (masked edges multiply it by 0), as in
// the forward.
// Runs where the kernel plan's mma_backward says so (pyg_dfgnn/ops/plan.py: by
// default where no row is split, as a warp waits for its longest of 8 rows):
// fp16 / bf16, C in {32, 64, 128}, no dropout.
#include "device/mma.cuh"
#include "host/dispatch.cuh"
#include "scores/dot_host.h"

namespace dfgnn {
namespace {

constexpr int kMmaBwdBlock = 32;  // one warp per block, as the forward (dot_forward_mma.cu)

// Where unit `unit` (8 rows, one head) of a walk over the index pointer `ptr`
// (rowptr or colptr, n + 1 entries) lies, as lane (g, t) of its warp sees it.
struct Unit {
  const int* ptr;
  int64_t n, r0, HC, head_off;  // r0: the first of the unit's rows
  int h, lane, g, t, beg, end;  // beg, end: the edges of the 8 rows

  __device__ __forceinline__ Unit(const int* __restrict__ ptr_, int64_t n_, int H, int C,
                                  int64_t unit)
      : ptr(ptr_), n(n_) {
    const int64_t blk = unit / H;
    h = (int)(unit - blk * H);
    r0 = blk * kMmaRows;
    HC = (int64_t)H * C;
    head_off = (int64_t)h * C;
    lane = threadIdx.x & 31;
    g = lane >> 2;
    t = lane & 3;
    beg = bound(0);
    end = bound(kMmaRows);
  }
  // The first edge of row r0 + i (the end of the last row past it).
  __device__ __forceinline__ int bound(int i) const { return __ldg(ptr + min(r0 + i, n)); }
};

// A row's 16-byte slices t + 4c as B fragments: k-step s uses words 2 (s % 2)
// and 2 (s % 2) + 1 of slice s / 2 (the channels of the SDDMM's A fragments).
template <typename T, int C>
__device__ __forceinline__ void load_b_frags(const T* __restrict__ rowp, bool ok, int t,
                                             uint32_t (&b)[C / 16][2]) {
#pragma unroll
  for (int c = 0; c < C / 32; ++c) {
    const uint4 x = ok ? __ldg(reinterpret_cast<const uint4*>(rowp) + t + 4 * c)
                       : make_uint4(0, 0, 0, 0);
    b[2 * c][0] = x.x; b[2 * c][1] = x.y; b[2 * c + 1][0] = x.z; b[2 * c + 1][1] = x.w;
  }
}

// s[0], s[1] = row a of the A operand (edge g) with columns 2t, 2t + 1; s[2],
// s[3] = row b (edge g + 8): the SDDMM of 16 gathered rows against 8 B rows.
template <typename T, int C>
__device__ __forceinline__ void sddmm16(const uint4 (&ra)[C / 32], const uint4 (&rb)[C / 32],
                                        const uint32_t (&b)[C / 16][2], float (&s)[4]) {
  s[0] = s[1] = s[2] = s[3] = 0.f;
#pragma unroll
  for (int c = 0; c < C / 32; ++c) {
    mma_16816<T>(s, ra[c].x, rb[c].x, ra[c].y, rb[c].y, b[2 * c][0], b[2 * c][1]);
    mma_16816<T>(s, ra[c].z, rb[c].z, ra[c].w, rb[c].w, b[2 * c + 1][0], b[2 * c + 1][1]);
  }
}

// Stores columns 2t and 2t + 1 of acc (times `mul`) as rows c0 + 2t, c0 + 2t + 1
// of x [n, H, C] (rows ld elements apart), in load_v_words' channel order
// (store_words).
template <typename T, int C>
__device__ __forceinline__ void store_cols(T* __restrict__ x, const float (&acc)[C / 16][4],
                                           float mul, int64_t c0, int64_t n, int64_t ld,
                                           int64_t head_off, int g, int t) {
  uint32_t w0[C / 16], w1[C / 16];
#pragma unroll
  for (int b = 0; b < C / 16; ++b) {
    w0[b] = pack2<T>(acc[b][0] * mul, acc[b][2] * mul);
    w1[b] = pack2<T>(acc[b][1] * mul, acc[b][3] * mul);
  }
  if (c0 + 2 * t < n)
    store_words<C>(reinterpret_cast<uint32_t*>(x + (c0 + 2 * t) * ld + head_off), g, w0);
  if (c0 + 2 * t + 1 < n)
    store_words<C>(reinterpret_cast<uint32_t*>(x + (c0 + 2 * t + 1) * ld + head_off), g, w1);
}

// The CSR walk (see the top of the file): rows [8 blk, 8 blk + 8) of head h.
template <typename T, int C>
__global__ void __launch_bounds__(kMmaBwdBlock)
gt_bwd_dq_mma_kernel(const T* __restrict__ dout, const T* __restrict__ q,
                     const T* __restrict__ k, const T* __restrict__ v,
                     const float* __restrict__ lse2, const float* __restrict__ dsum,
                     const int* __restrict__ rowptr, const int* __restrict__ col,
                     T* __restrict__ dq, int64_t ld_q, float2* __restrict__ pds, int64_t n_rows,
                     int64_t n_units, int H, float scale, float scale2) {
  constexpr int KC = C / 32;  // 16-byte slices of a row per lane
  constexpr int NK = C / 16;  // k-steps of the SDDMMs = channel blocks of the SpMM
  const int64_t unit = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
  if (unit >= n_units) return;  // whole warps
  const Unit u(rowptr, n_rows, H, C, unit);
  const int h = u.h, lane = u.lane, g = u.g, t = u.t, beg = u.beg, end = u.end;
  const int64_t i0 = u.r0, HC = u.HC, head_off = u.head_off;
  // Edge ranges of this lane's rows 2t and 2t + 1.
  const int rb0 = u.bound(2 * t), rb1 = u.bound(2 * t + 1), rb2 = u.bound(2 * t + 2);

  uint32_t qb[NK][2], gb[NK][2];  // q and dO of row g (B fragments)
  {
    const bool ok = i0 + g < n_rows;
    load_b_frags<T, C>(q + (i0 + g) * HC + head_off, ok, t, qb);
    load_b_frags<T, C>(dout + (i0 + g) * HC + head_off, ok, t, gb);
  }
  // lse2 and D of rows 2t, 2t + 1 (clamped to the last row: used only where the
  // row has an edge).
  const int64_t r0 = min(i0 + 2 * t, n_rows - 1), r1 = min(i0 + 2 * t + 1, n_rows - 1);
  const float L0 = __ldg(lse2 + r0 * H + h), L1 = __ldg(lse2 + r1 * H + h);
  const float D0 = __ldg(dsum + r0 * H + h), D1 = __ldg(dsum + r1 * H + h);

  float acc[NK][4];
#pragma unroll
  for (int b = 0; b < NK; ++b) acc[b][0] = acc[b][1] = acc[b][2] = acc[b][3] = 0.f;
  // Neighbours of edges g and g + 8 of the next tile (loaded a tile ahead); past
  // the block's end a lane takes its last edge (unconditional loads, masked).
  auto nbr = [&](int e) { return __ldg(col + min(e, end - 1)); };
  int na = beg < end ? nbr(beg + g) : 0;
  int nb = beg < end ? nbr(beg + g + 8) : 0;
  for (int e0 = beg; e0 < end; e0 += 16) {
    const int ja = na, jb = nb;
    uint4 ka[KC], kb[KC], va[KC], vb[KC];
    load_slices<C>(k, ja, HC, head_off, t, ka);
    load_slices<C>(k, jb, HC, head_off, t, kb);
    load_slices<C>(v, ja, HC, head_off, t, va);
    load_slices<C>(v, jb, HC, head_off, t, vb);
    int jw[4];
    loader_rows(ja, jb, lane, jw);
    uint32_t kw[4][NK];
    load_tile_words<C>(k, jw, HC, head_off, lane, kw);
    na = nbr(e0 + 16 + g);
    nb = nbr(e0 + 24 + g);

    float s[4], dp[4];
    sddmm16<T, C>(ka, kb, qb, s);
    sddmm16<T, C>(va, vb, gb, dp);
    const int ea = e0 + g, eb = e0 + g + 8;
    const bool m0 = rb0 <= ea && ea < rb1, m1 = rb1 <= ea && ea < rb2;
    const bool m2 = rb0 <= eb && eb < rb1, m3 = rb1 <= eb && eb < rb2;
    const float p0 = m0 ? exp2f(s[0] * scale2 - L0) : 0.f;
    const float p1 = m1 ? exp2f(s[1] * scale2 - L1) : 0.f;
    const float p2 = m2 ? exp2f(s[2] * scale2 - L0) : 0.f;
    const float p3 = m3 ? exp2f(s[3] * scale2 - L1) : 0.f;
    const float d0 = p0 * (dp[0] - D0), d1 = p1 * (dp[1] - D1);
    const float d2 = p2 * (dp[2] - D0), d3 = p3 * (dp[3] - D1);
    // Each edge of the tile belongs to one row, so one lane of its fragment row
    // holds it: that lane stores its (P, dS) (no dropout: P' = P).
    if (m0 || m1) pds[(int64_t)ea * H + h] = m0 ? make_float2(p0, d0) : make_float2(p1, d1);
    if (m2 || m3) pds[(int64_t)eb * H + h] = m2 ? make_float2(p2, d2) : make_float2(p3, d3);

    // dS as the SpMM's B fragments (edges 2t, 2t + 1 | 2t + 8, 2t + 9 of row g).
    const uint32_t db0 = transpose8x8(pack2<T>(d0, d1));
    const uint32_t db1 = transpose8x8(pack2<T>(d2, d3));
    spmm16<T, NK>(acc, kw, db0, db1, 8 * t + g);
  }
  store_cols<T, C>(dq, acc, scale, i0, n_rows, ld_q, head_off, g, t);
}

// The CSC walk on tensor cores: dV_j = sum_i P_ij dO_i and dK_j = scale * sum_i
// dS_ij q_i, with (P, dS) the dq walk saved (pds, CSR order, read through the
// CSC permutation). One warp owns 8 consecutive sources (one head) and walks
// their in-edges 16 at a time; per tile two SpMMs,
//   dV^T [C x 8] += dO^T [C x 16] . P [16 x 8],  dK^T [C x 8] += Q^T [C x 16] . dS [16 x 8],
// the dO and q rows gathered as the forward gathers v (load_v_words), the
// weights rounded to T (fp32 accumulation). Lane (g, t) loads the weights of its
// B fragments itself: edges 2t, 2t + 1, 2t + 8, 2t + 9 of the tile where they
// belong to source g (each edge is loaded by one lane, the others are 0).
// Columns are walked whole, whatever the CSC work items (no partials).
template <typename T, int C>
__global__ void __launch_bounds__(kMmaBwdBlock)
gt_bwd_dkv_mma_kernel(const T* __restrict__ dout, const T* __restrict__ q,
                      const float2* __restrict__ pds, const int* __restrict__ colptr,
                      const int* __restrict__ row, const int* __restrict__ perm,
                      T* __restrict__ dk, T* __restrict__ dv, int64_t ld_kv, int64_t n_cols,
                      int64_t n_units,
                      int H, float scale) {
  constexpr int NK = C / 16;
  const int64_t unit = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
  if (unit >= n_units) return;  // whole warps
  const Unit u(colptr, n_cols, H, C, unit);
  const int h = u.h, lane = u.lane, g = u.g, t = u.t, beg = u.beg, end = u.end;
  const int64_t j0 = u.r0, HC = u.HC, head_off = u.head_off;
  const int cb = u.bound(g), ce = u.bound(g + 1);  // in-edges of this lane's source g

  float acc_v[NK][4], acc_k[NK][4];
#pragma unroll
  for (int b = 0; b < NK; ++b)
#pragma unroll
    for (int x = 0; x < 4; ++x) acc_v[b][x] = acc_k[b][x] = 0.f;
  auto nbr = [&](int e) { return __ldg(row + min(e, end - 1)); };
  // The CSR position of edge e where it is one of source g's, else -1; its
  // weights then come one trip later, so positions are loaded a tile ahead.
  auto csr_pos = [&](int e) { return cb <= e && e < ce ? __ldg(perm + e) : -1; };
  auto weights = [&](int pos) {
    return pos >= 0 ? __ldg(pds + (int64_t)pos * H + h) : make_float2(0.f, 0.f);
  };
  int na = beg < end ? nbr(beg + g) : 0;
  int nb = beg < end ? nbr(beg + g + 8) : 0;
  int pos[4];  // edges 2t, 2t + 1, 2t + 8, 2t + 9 of the next tile
#pragma unroll
  for (int x = 0; x < 4; ++x) pos[x] = csr_pos(beg + 2 * t + (x & 1) + 8 * (x >> 1));
  const int src = 8 * t + g;
  for (int e0 = beg; e0 < end; e0 += 16) {
    int iw[4];
    loader_rows(na, nb, lane, iw);
    uint32_t gw[4][NK], qw[4][NK];
    load_tile_words<C>(dout, iw, HC, head_off, lane, gw);
    load_tile_words<C>(q, iw, HC, head_off, lane, qw);
    const float2 w0 = weights(pos[0]), w1 = weights(pos[1]);
    const float2 w2 = weights(pos[2]), w3 = weights(pos[3]);
    na = nbr(e0 + 16 + g);
    nb = nbr(e0 + 24 + g);
#pragma unroll
    for (int x = 0; x < 4; ++x) pos[x] = csr_pos(e0 + 16 + 2 * t + (x & 1) + 8 * (x >> 1));
    spmm16<T, NK>(acc_v, gw, pack2<T>(w0.x, w1.x), pack2<T>(w2.x, w3.x), src);
    spmm16<T, NK>(acc_k, qw, pack2<T>(w0.y, w1.y), pack2<T>(w2.y, w3.y), src);
  }
  store_cols<T, C>(dv, acc_v, 1.f, j0, n_cols, ld_kv, head_off, g, t);
  store_cols<T, C>(dk, acc_k, scale, j0, n_cols, ld_kv, head_off, g, t);
}

// launch(TypeTag<T>, IntC<C>, blocks, n_units) for a half dtype and C in {32, 64,
// 128}, over the 8-row units of n rows and H heads (one warp, one block each);
// nothing where there are none.
template <typename F>
void launch_units(at::ScalarType st, int64_t C, int64_t n, int64_t H, F&& launch) {
  const int64_t n_units = (n + kMmaRows - 1) / kMmaRows * H;
  if (n_units == 0) return;
  const int64_t blocks = ceil_div(n_units * 32, kMmaBwdBlock);
  auto by_c = [&](auto T_) {
    if (C == 32) launch(T_, IntC<32>{}, blocks, n_units);
    else if (C == 64) launch(T_, IntC<64>{}, blocks, n_units);
    else launch(T_, IntC<128>{}, blocks, n_units);
  };
  if (st == at::kBFloat16) by_c(TypeTag<__nv_bfloat16>{});
  else by_c(TypeTag<__half>{});
}

}  // namespace

bool gt_backward_mma_supports(at::ScalarType st, int64_t C, bool aligned16) {
  return gt_forward_mma_supports(st, C, aligned16);
}

void gt_backward_dq_mma(const at::Tensor& grad_out, const at::Tensor& q, const at::Tensor& k,
                        const at::Tensor& v, const at::Tensor& lse2, const float* dsum,
                        const LayoutView& L, at::Tensor& dq, float* pds, double scale) {
  TORCH_CHECK(dsum != nullptr || q.size(0) == 0,
              "dfgnn::attention_bwd (dot): the tensor-core dq walk needs D in fp32");
  const float sc = (float)scale, scale2 = (float)(scale * kLog2e);
  auto stream = c10::cuda::getCurrentCUDAStream();
  launch_units(q.scalar_type(), q.size(2), q.size(0), q.size(1),
               [&](auto T_, auto C_, int64_t blocks, int64_t n_units) {
    using T = typename decltype(T_)::type;
    gt_bwd_dq_mma_kernel<T, decltype(C_)::value><<<blocks, kMmaBwdBlock, 0, stream>>>(
        cptr<T>(grad_out), cptr<T>(q), cptr<T>(k), cptr<T>(v), lse2.data_ptr<float>(), dsum,
        L.rowptr.data_ptr<int>(), L.col.data_ptr<int>(), mptr<T>(dq), dq.stride(0),
        reinterpret_cast<float2*>(pds), q.size(0), n_units, (int)q.size(1), sc, scale2);
    check_launch();
  });
}

void gt_backward_dkv_mma(const at::Tensor& grad_out, const at::Tensor& q, const float* pds,
                         const LayoutView& L, at::Tensor& dk, at::Tensor& dv, double scale) {
  auto stream = c10::cuda::getCurrentCUDAStream();
  launch_units(q.scalar_type(), q.size(2), dk.size(0), q.size(1),
               [&](auto T_, auto C_, int64_t blocks, int64_t n_units) {
    using T = typename decltype(T_)::type;
    gt_bwd_dkv_mma_kernel<T, decltype(C_)::value><<<blocks, kMmaBwdBlock, 0, stream>>>(
        cptr<T>(grad_out), cptr<T>(q), reinterpret_cast<const float2*>(pds),
        L.colptr.data_ptr<int>(), L.row.data_ptr<int>(), L.perm.data_ptr<int>(), mptr<T>(dk),
        mptr<T>(dv), dk.stride(0), dk.size(0), n_units, (int)q.size(1), (float)scale);
    check_launch();
  });
}

}  // namespace dfgnn
