// Forward pass of dot-product attention on tensor cores (fp16 / bf16, v10):
//   out_i = sum_{j -> i} softmax_j(scale * q_i . k_j) * v_j      (paper eq. 1-2)
//
// Why: the CUDA-core SMMF kernel (gt_forward.cu) spends per edge and channel a
// widening convert and an FMA for q . k, another pair for p v, and a shuffle
// reduction per edge; in bf16 that, not the bytes, bounded the batch graphs (bf16
// only 1.1-1.2x faster than fp32 there; benchmarks/NOTES.md, v10).
// Here one warp owns 8 consecutive destination rows (one head) and walks their
// edges, which are contiguous in CSR, 16 at a time, with mma.m16n8k16:
//   SDDMM  S[16 edges x 8 rows] = K[16 x C] . Q^T[C x 8], a score is kept where
//          the edge belongs to the column's row (the others are masked);
//   SpMM   O^T[C x 8 rows] += V^T[C x 16] . P[16 x 8], P the masked softmax
//          numerators of the tile, rounded to T (fp32 accumulation, as in
//          flash attention).
// The order of the channels inside a dot product is free, so the K fragments
// come straight from 16-byte row slices; V is loaded by whole 128-byte lines and
// shuffled to its fragments (load_v_words), whose channel order the store
// follows. P goes from the SDDMM's accumulator layout to the SpMM's operand
// layout with two movmatrix transposes. The softmax is online per row (running
// max and sum, base 2), so rows of any length are one pass; a tile may hold edges
// of up to 8 rows, so a row's maximum is the column maximum. The kernel is bound
// by L1 wavefronts and load latency, not by its arithmetic (NOTES.md, v10).
// Because a tile's product runs over all its edges for each of the 8 rows (the
// masked ones with weight 0), a non-finite v row makes all 8 rows of its block
// non-finite, not only the rows it is a neighbour of.
// Used for calls without split rows, dropout or returned attention weights and
// C in {32, 64, 128} (gt_forward_cuda); the rest runs on the CUDA-core kernel.
#include "common.cuh"
#include "ops.h"

namespace dfgnn {
namespace {

constexpr int kMmaRows = 8;  // destination rows per warp (the mma's N)
// One warp per block. A block holds its SM slot until its slowest warp is done
// (kNodeBlock, common.cuh); this kernel's warps are independent, so single-warp
// blocks free each slot as soon as its warp ends: 1.5-3 % faster than 64 threads
// on the sparse batches (MNIST, CIFAR10, COCO-SP), the same on PATTERN / CLUSTER
// (benchmarks/NOTES.md, v12).
constexpr int kMmaBlock = 32;

template <typename T>
__device__ __forceinline__ void mma_16816(float (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2,
                                          uint32_t a3, uint32_t b0, uint32_t b1) {
  if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
        "{%8,%9}, {%0,%1,%2,%3};"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
  } else {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
        "{%8,%9}, {%0,%1,%2,%3};"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
  }
}

// Two floats rounded to T, `lo` in the low half.
template <typename T> __device__ __forceinline__ uint32_t pack2(float lo, float hi) {
  uint32_t r;
  if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    __nv_bfloat162 x = __floats2bfloat162_rn(lo, hi);
    r = *reinterpret_cast<uint32_t*>(&x);
  } else {
    __half2 x = __floats2half2_rn(lo, hi);
    r = *reinterpret_cast<uint32_t*>(&x);
  }
  return r;
}


// The transpose of an 8 x 8 matrix of 16-bit values held one row pair per lane
// (lane l: row l / 4, columns 2 (l % 4) and 2 (l % 4) + 1).
__device__ __forceinline__ uint32_t transpose8x8(uint32_t x) {
  uint32_t y;
  asm("movmatrix.sync.aligned.m8n8.trans.b16 %0, %1;" : "=r"(y) : "r"(x));
  return y;
}

// The SpMM's V fragments need lane (g, t) to hold C / 8 channels (slices g and
// g + 8 of 16 bytes for C = 128, slice g for C = 64, 8-byte slice g for C = 32) of
// 4 edges, 2t, 2t + 1, 2t + 8, 2t + 9: loaded directly, every quarter-warp
// instruction would touch 4 rows, i.e. 4 L1 wavefronts of 32 bytes each, and the
// kernel was bound by L1 wavefronts (benchmarks/NOTES.md, v10). So lane
// L = 8q + r loads slice r of the row of the q-th lane group's edge (a quarter-warp
// reads one whole 128-byte line), and the SpMM takes each word from lane 8t + g
// by shuffle when it needs it (4 shuffles per 16 bytes, for half the wavefronts;
// shuffled all at once, the words took the kernel from 128 to 167 registers).
// `j`: this loader lane's neighbour; w: C / 16 words of two channels each, word
// 4c + i of slice r + 8c (store_words writes the output rows the same way).
template <int C, typename T>
__device__ __forceinline__ void load_v_words(const T* __restrict__ v, int j, int64_t HC,
                                             int64_t head_off, int r, uint32_t (&w)[C / 16]) {
  if constexpr (C / 16 >= 4) {
    const uint4* row = reinterpret_cast<const uint4*>(v + j * HC + head_off) + r;
#pragma unroll
    for (int c = 0; c < C / 64; ++c) {
      const uint4 x = __ldg(row + 8 * c);
      w[4 * c] = x.x; w[4 * c + 1] = x.y; w[4 * c + 2] = x.z; w[4 * c + 3] = x.w;
    }
  } else {
    static_assert(C / 16 == 2, "C in {32, 64, 128}");
    const uint2 x = __ldg(reinterpret_cast<const uint2*>(v + j * HC + head_off) + r);
    w[0] = x.x; w[1] = x.y;
  }
}

template <int C>
__device__ __forceinline__ void store_words(uint32_t* __restrict__ row, int g,
                                            const uint32_t (&w)[C / 16]) {
  if constexpr (C / 16 >= 4) {
#pragma unroll
    for (int c = 0; c < C / 64; ++c)
      reinterpret_cast<uint4*>(row)[g + 8 * c] = make_uint4(w[4 * c], w[4 * c + 1], w[4 * c + 2],
                                                            w[4 * c + 3]);
  } else {
    reinterpret_cast<uint2*>(row)[g] = make_uint2(w[0], w[1]);
  }
}

template <typename T, int C>
__global__ void __launch_bounds__(kMmaBlock)
gt_fwd_mma_kernel(const T* __restrict__ q, const T* __restrict__ k, const T* __restrict__ v,
                  const int* __restrict__ rowptr, const int* __restrict__ col, T* __restrict__ out,
                  float* __restrict__ lse2, int64_t n_rows, int64_t n_units, int H, float scale2) {
  constexpr int KC = C / 32;  // 16-byte slices of a k / q row per lane
  constexpr int NK = C / 16;  // k-steps of the SDDMM = channel blocks of the SpMM
  const int64_t unit = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
  if (unit >= n_units) return;  // whole warps
  const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  const int64_t blk = unit / H;
  const int h = (int)(unit - blk * H);
  const int64_t i0 = blk * kMmaRows;
  const int64_t HC = (int64_t)H * C, head_off = (int64_t)h * C;
  auto ptr = [&](int n) { return __ldg(rowptr + min(i0 + n, n_rows)); };
  const int beg = ptr(0), end = ptr(kMmaRows);
  // Edge ranges of this lane's rows 2t and 2t + 1.
  const int rb0 = ptr(2 * t), rb1 = ptr(2 * t + 1), rb2 = ptr(2 * t + 2);

  // q of row g as the SDDMM's B fragments: k-step s uses words 2 (s % 2) and
  // 2 (s % 2) + 1 of slice s / 2 (the same channels as the K fragments).
  uint32_t qb[NK][2];
  {
    const bool ok = i0 + g < n_rows;
    const T* qrow = q + (i0 + g) * HC + head_off;
#pragma unroll
    for (int c = 0; c < KC; ++c) {
      const uint4 x = ok ? __ldg(reinterpret_cast<const uint4*>(qrow) + t + 4 * c)
                         : make_uint4(0, 0, 0, 0);
      qb[2 * c][0] = x.x; qb[2 * c][1] = x.y; qb[2 * c + 1][0] = x.z; qb[2 * c + 1][1] = x.w;
    }
  }

  float acc[NK][4];
#pragma unroll
  for (int b = 0; b < NK; ++b) acc[b][0] = acc[b][1] = acc[b][2] = acc[b][3] = 0.f;
  float m0 = kNegInf, m1 = kNegInf, l0 = 0.f, l1 = 0.f;  // rows 2t, 2t + 1 (l: lane partial)
  // Neighbours of edges g and g + 8 of the next tile (loaded a tile ahead).
  // Past the block's end a lane takes its last edge instead: every load is then
  // unconditional (no zeroing, no predicates), and those edges' scores are masked.
  auto nbr = [&](int e) { return __ldg(col + min(e, end - 1)); };
  int na = beg < end ? nbr(beg + g) : 0;
  int nb = beg < end ? nbr(beg + g + 8) : 0;
  for (int e0 = beg; e0 < end; e0 += 16) {
    const int ja = na, jb = nb;
    uint4 ka[KC], kb[KC];
    const uint4* krow_a = reinterpret_cast<const uint4*>(k + ja * HC + head_off) + t;
    const uint4* krow_b = reinterpret_cast<const uint4*>(k + jb * HC + head_off) + t;
#pragma unroll
    for (int c = 0; c < KC; ++c) {
      ka[c] = __ldg(krow_a + 4 * c);
      kb[c] = __ldg(krow_b + 4 * c);
    }
    // v rows (load_v_words): this lane loads for the lane group q = lane / 8, whose
    // edges 2q, 2q + 1, 2q + 8, 2q + 9 come from the lanes that hold them.
    const int q8 = lane >> 3;
    const int jv0 = __shfl_sync(0xffffffffu, ja, 8 * q8);
    const int jv1 = __shfl_sync(0xffffffffu, ja, 8 * q8 + 4);
    const int jv2 = __shfl_sync(0xffffffffu, jb, 8 * q8);
    const int jv3 = __shfl_sync(0xffffffffu, jb, 8 * q8 + 4);
    uint32_t vw[4][NK];  // as loaded, for the lanes 8t + g of group t = lane / 8
    load_v_words<C>(v, jv0, HC, head_off, lane & 7, vw[0]);
    load_v_words<C>(v, jv1, HC, head_off, lane & 7, vw[1]);
    load_v_words<C>(v, jv2, HC, head_off, lane & 7, vw[2]);
    load_v_words<C>(v, jv3, HC, head_off, lane & 7, vw[3]);
    na = nbr(e0 + 16 + g);
    nb = nbr(e0 + 24 + g);

    // SDDMM: s[0], s[1] = edge g with rows 2t, 2t + 1; s[2], s[3] = edge g + 8.
    float s[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
    for (int c = 0; c < KC; ++c) {
      mma_16816<T>(s, ka[c].x, kb[c].x, ka[c].y, kb[c].y, qb[2 * c][0], qb[2 * c][1]);
      mma_16816<T>(s, ka[c].z, kb[c].z, ka[c].w, kb[c].w, qb[2 * c + 1][0], qb[2 * c + 1][1]);
    }
    const int ea = e0 + g, eb = e0 + g + 8;
    s[0] = rb0 <= ea && ea < rb1 ? s[0] * scale2 : kNegInf;
    s[1] = rb1 <= ea && ea < rb2 ? s[1] * scale2 : kNegInf;
    s[2] = rb0 <= eb && eb < rb1 ? s[2] * scale2 : kNegInf;
    s[3] = rb1 <= eb && eb < rb2 ? s[3] * scale2 : kNegInf;

    // Online softmax of rows 2t, 2t + 1: the tile's maximum over the 8 lanes
    // g = 0..7 that hold the column.
    float t0 = fmaxf(s[0], s[2]), t1 = fmaxf(s[1], s[3]);
#pragma unroll
    for (int o = 4; o < 32; o <<= 1) {
      t0 = fmaxf(t0, __shfl_xor_sync(0xffffffffu, t0, o));
      t1 = fmaxf(t1, __shfl_xor_sync(0xffffffffu, t1, o));
    }
    const float n0 = fmaxf(m0, t0), n1 = fmaxf(m1, t1);
    const float base0 = n0 == kNegInf ? 0.f : n0, base1 = n1 == kNegInf ? 0.f : n1;
    // The accumulator of a row needs rescaling only when its running max rose
    // from a finite value (while m = -inf the row's accumulator is still zero).
    const bool rescale = (m0 != kNegInf && n0 > m0) || (m1 != kNegInf && n1 > m1);
    const float c0 = fast_exp2(m0 - base0), c1 = fast_exp2(m1 - base1);
    const float p0 = fast_exp2(s[0] - base0), p1 = fast_exp2(s[1] - base1);
    const float p2 = fast_exp2(s[2] - base0), p3 = fast_exp2(s[3] - base1);
    l0 = l0 * c0 + p0 + p2;
    l1 = l1 * c1 + p1 + p3;
    m0 = n0;
    m1 = n1;
    if (__any_sync(0xffffffffu, rescale)) {
#pragma unroll
      for (int b = 0; b < NK; ++b) {
        acc[b][0] *= c0; acc[b][2] *= c0;
        acc[b][1] *= c1; acc[b][3] *= c1;
      }
    }

    // P as the SpMM's B fragments (edges 2t, 2t + 1 | 2t + 8, 2t + 9 of row g).
    const uint32_t pb0 = transpose8x8(pack2<T>(p0, p1));
    const uint32_t pb1 = transpose8x8(pack2<T>(p2, p3));
    // SpMM: channel block b is word b of this lane's channels, held by lane
    // 8t + g (load_v_words): its low channel is fragment row g, its high one g + 8.
    const int src = 8 * t + g;
#pragma unroll
    for (int b = 0; b < NK; ++b) {
      uint32_t w[4];
#pragma unroll
      for (int u = 0; u < 4; ++u) w[u] = __shfl_sync(0xffffffffu, vw[u][b], src);
      mma_16816<T>(acc[b], __byte_perm(w[0], w[1], 0x5410), __byte_perm(w[0], w[1], 0x7632),
                   __byte_perm(w[2], w[3], 0x5410), __byte_perm(w[2], w[3], 0x7632), pb0, pb1);
    }
  }

  // Row sums over the 8 lanes of each column, then out = acc / l and lse2.
#pragma unroll
  for (int o = 4; o < 32; o <<= 1) {
    l0 += __shfl_xor_sync(0xffffffffu, l0, o);
    l1 += __shfl_xor_sync(0xffffffffu, l1, o);
  }
  const float inv0 = l0 > 0.f ? 1.f / l0 : 0.f, inv1 = l1 > 0.f ? 1.f / l1 : 0.f;
  uint32_t w0[NK], w1[NK];
#pragma unroll
  for (int b = 0; b < NK; ++b) {
    w0[b] = pack2<T>(acc[b][0] * inv0, acc[b][2] * inv0);
    w1[b] = pack2<T>(acc[b][1] * inv1, acc[b][3] * inv1);
  }
  auto store = [&](int64_t row, const uint32_t (&w)[NK], float m, float l) {
    if (row >= n_rows) return;
    store_words<C>(reinterpret_cast<uint32_t*>(out + row * HC + head_off), g, w);
    if (g == 0) lse2[row * H + h] = l > 0.f ? m + log2f(l) : kNegInf;
  };
  store(i0 + 2 * t, w0, m0, l0);
  store(i0 + 2 * t + 1, w1, m1, l1);
}

}  // namespace

bool gt_forward_mma_supports(at::ScalarType st, int64_t C, bool aligned16) {
  return (st == at::kHalf || st == at::kBFloat16) && aligned16 &&
         (C == 32 || C == 64 || C == 128);
}

void gt_forward_mma(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                    const at::Tensor& rowptr, const at::Tensor& col, at::Tensor& out,
                    at::Tensor& lse2, double scale) {
  const int64_t N = q.size(0), H = q.size(1), C = q.size(2);
  const int64_t n_units = (N + kMmaRows - 1) / kMmaRows * H;
  if (n_units == 0) return;
  const float scale2 = (float)(scale * kLog2e);
  auto stream = at::cuda::getCurrentCUDAStream();
  auto launch = [&](auto T_, auto C_) {
    using T = typename decltype(T_)::type;
    constexpr int CC = decltype(C_)::value;
    gt_fwd_mma_kernel<T, CC><<<ceil_div(n_units * 32, kMmaBlock), kMmaBlock, 0, stream>>>(
        cptr<T>(q), cptr<T>(k), cptr<T>(v), rowptr.data_ptr<int>(), col.data_ptr<int>(),
        mptr<T>(out), lse2.data_ptr<float>(), N, n_units, (int)H, scale2);
    check_launch();
  };
  auto by_c = [&](auto T_) {
    if (C == 32) launch(T_, IntC<32>{});
    else if (C == 64) launch(T_, IntC<64>{});
    else launch(T_, IntC<128>{});
  };
  if (q.scalar_type() == at::kBFloat16) by_c(TypeTag<__nv_bfloat16>{});
  else by_c(TypeTag<__half>{});
}

}  // namespace dfgnn
