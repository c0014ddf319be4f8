// Split rows on the host side (split_merge.h): the per-stream arrival counters
// of the in-kernel merge, and the merge launches for split rows that their
// kernels do not merge themselves, shared by every kernel family.
#include <map>
#include <mutex>
#include <utility>

#include "device/numerics.cuh"
#include "host/dispatch.cuh"
#include "host/split_merge.h"

namespace dfgnn {
namespace {

// The merge launch for split rows that their kernels do not merge themselves
// (merge_split_row, device/split_merge.cuh: half-precision backward kernels, PMF, CUDA-graph
// captures).
// Sums (plain: combine) or softmax-merges (SOFTMAX) the fp32 partials of split
// rows. A unit is one (split row, head); its W * P threads form P slot groups of
// W threads, and the W threads of a group cover the head's C elements, V at a
// time. Group sg reads slots sg, sg + P, ...: a row of n slots is a chain of
// n / P independent loads per thread instead of n (one thread per element
// walking all n slots took 18.6 us of GitHub's 94 us GAT forward).
// The P group results are merged in a fixed order (deterministic).
// SOFTMAX: each group keeps (m, l, acc) over its slots; then M = max m,
// L = sum l 2^(m - M), out = sum acc 2^(m - M) / L, lse2 = M + log2(L).
// out32 (nullable): the rows in fp32 too, H * C apart (the forward's O32).
template <typename T, int V, bool SOFTMAX>
__global__ void __launch_bounds__(256)
reduce_slots_kernel(const float* __restrict__ partial, const float* __restrict__ partial_ml,
                    const int* __restrict__ combine, T* __restrict__ out,
                    float* __restrict__ out32, float* __restrict__ lse2, int64_t n_units, int H,
                    int C, int64_t ld, int W, int P) {
  __shared__ float red[256 * V];
  __shared__ float red_m[256], red_l[256];
  const int span = W * P, t = threadIdx.x;
  const int64_t unit = (int64_t)blockIdx.x * (blockDim.x / span) + t / span;
  const int tu = t % span, sg = tu / W, cv = tu - sg * W;
  const int base = t - tu;  // the unit's first thread
  const bool active = unit < n_units;
  int row = 0, first = 0, n = 0, h = 0;
  if (active) {
    const int64_t r = unit / H;
    h = (int)(unit - r * H);
    row = combine[r * 3];
    first = combine[r * 3 + 1];
    n = combine[r * 3 + 2];
  }
  const int64_t HC = (int64_t)H * C;
  auto ml = [&](int s, int k) {
    return __ldg(partial_ml + (((int64_t)first + s) * H + h) * 2 + k);
  };

  // This group's max first (independent loads, no data-dependent branch in the
  // loop that gathers the rows).
  float m = SOFTMAX ? kNegInf : 0.f;
  if constexpr (SOFTMAX) {
#pragma unroll 4
    for (int s = sg; s < n; s += P) m = fmaxf(m, ml(s, 0));
  }
  for (int f0 = 0; f0 < C; f0 += W * V) {
    const int f = f0 + cv * V;
    float acc[V], l = 0.f;
#pragma unroll
    for (int k = 0; k < V; ++k) acc[k] = 0.f;
    if (active && f < C && (!SOFTMAX || m != kNegInf)) {
#pragma unroll 4
      for (int s = sg; s < n; s += P) {
        float w = 1.f;
        if constexpr (SOFTMAX) {
          w = exp2f(ml(s, 0) - m);  // empty item: m_s = -inf -> 0
          l += ml(s, 1) * w;
        }
        const float* src = partial + ((int64_t)first + s) * HC + (int64_t)h * C + f;
        if constexpr (V == 4) {
          const float4 x = __ldg(reinterpret_cast<const float4*>(src));
          acc[0] += w * x.x; acc[1] += w * x.y; acc[2] += w * x.z; acc[3] += w * x.w;
        } else {
          acc[0] += w * __ldg(src);
        }
      }
    }
    if (f0 > 0) __syncthreads();  // the previous element block's results have been read
#pragma unroll
    for (int k = 0; k < V; ++k) red[t * V + k] = acc[k];
    red_m[t] = m;
    red_l[t] = l;
    __syncthreads();
    if (active && sg == 0 && f < C) {
      float M = m;
      if constexpr (SOFTMAX)
        for (int q = 1; q < P; ++q) M = fmaxf(M, red_m[base + q * W + cv]);
      auto scale_of = [&](float mq) {
        return !SOFTMAX ? 1.f : (mq == kNegInf ? 0.f : exp2f(mq - M));
      };
      const float c0 = scale_of(m);
      l *= c0;
#pragma unroll
      for (int k = 0; k < V; ++k) acc[k] *= c0;
      for (int q = 1; q < P; ++q) {
        const int idx = base + q * W + cv;
        const float cq = scale_of(red_m[idx]);
        l += cq * red_l[idx];
#pragma unroll
        for (int k = 0; k < V; ++k) acc[k] += cq * red[idx * V + k];
      }
      T* dst = out + (int64_t)row * ld + (int64_t)h * C + f;
      const float inv = SOFTMAX ? (l > 0.f ? 1.f / l : 0.f) : 1.f;
#pragma unroll
      for (int k = 0; k < V; ++k)
        if (f + k < C) dst[k] = from_float<T>(acc[k] * inv);
      if (out32 != nullptr) {
        float* dst32 = out32 + (int64_t)row * HC + (int64_t)h * C + f;
        for (int k = 0; k < V; ++k)
          if (f + k < C) dst32[k] = acc[k] * inv;
      }
      if (SOFTMAX && f == 0) lse2[(int64_t)row * H + h] = l > 0.f ? M + log2f(l) : kNegInf;
    }
  }
}

// Threads per element group of reduce_slots_kernel for C elements, V at a time:
// the next power of two >= C / V, at most 256.
inline int slot_group_width(int64_t C, int V) {
  int w = 1;
  while (w < 256 && (int64_t)w * V < C) w <<= 1;
  return w;
}

// Slot groups per unit: as many as a block holds (the longest split row is the
// kernel's chain), fewer while the launch would exceed 2^21 threads and the
// rows average at most half as many slots (many split rows with few slots
// each: one block per unit there measured 14-26 % slower on Reddit-like 4 x 32).
// out: rows of H * C elements, ld apart (a column slice of a joined gradient has
// ld > H * C).
template <bool SOFTMAX>
void reduce_slots(const float* partial, int64_t num_slots, const float* partial_ml,
                  const at::Tensor& combine, at::Tensor& out, float* out32, float* lse2,
                  int64_t H, int64_t C, int64_t ld) {
  const int64_t n_rows = combine.size(0);
  if (n_rows == 0) return;
  const int V = C % 4 == 0 ? 4 : 1;
  const int W = slot_group_width(C, V);
  const int64_t n_units = n_rows * H;
  const double avg_slots = (double)num_slots / (double)n_rows;
  int P = 256 / W;
  while (P > 1 && n_units * W * P > (int64_t(1) << 21) && P / 2 >= avg_slots) P >>= 1;
  const int per_block = 256 / (W * P);
  auto stream = c10::cuda::getCurrentCUDAStream();
  DFGNN_DISPATCH_FLOAT_TYPES(out.scalar_type(), "reduce_slots", [&] {
    using T = typename cuda_type<scalar_t>::type;
    auto kern = V == 4 ? reduce_slots_kernel<T, 4, SOFTMAX> : reduce_slots_kernel<T, 1, SOFTMAX>;
    kern<<<ceil_div(n_units, per_block), 256, 0, stream>>>(
        partial, partial_ml, combine.data_ptr<int>(),
        reinterpret_cast<T*>(out.data_ptr<scalar_t>()), out32, lse2, n_units, (int)H, (int)C, ld,
        W, P);
  });
  check_launch();
}

// Attention weights of split rows: raw base-2 scores -> softmax, once lse2 is final.
__global__ void normalize_attn_kernel(const int* __restrict__ combine,
                                      const int* __restrict__ rowptr,
                                      const float* __restrict__ lse2, float* __restrict__ attn,
                                      int64_t n_rows, int H) {
  const int64_t unit = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) / 32;
  if (unit >= n_rows * H) return;
  const int lane = threadIdx.x & 31;
  const int64_t r = unit / H;
  const int h = (int)(unit - r * H);
  const int row = combine[r * 3];
  const float L = lse2[(int64_t)row * H + h];
  for (int e = rowptr[row] + lane; e < rowptr[row + 1]; e += 32) {
    const int64_t a = (int64_t)e * H + h;
    attn[a] = exp2f(attn[a] - L);
  }
}

}  // namespace

// One buffer per (device, stream): kernels on one stream run in order, so each
// finds the counters zero; kernels of two streams may overlap and get two
// buffers. A buffer is zeroed once, when it is allocated or grown, and kept (the
// map is never destroyed: tensors freed at exit could outlive the CUDA context).
int* split_row_counters(int64_t n, const char* op, const char* field) {
  TORCH_INTERNAL_ASSERT(n > 0);
  const auto stream = c10::cuda::getCurrentCUDAStream();
  TORCH_CHECK(!stream_is_capturing(), op, ": ", field, "=True (split rows "
              "merged in the kernel) while the stream is captured into a CUDA graph: the "
              "merge's arrival counters cannot be captured; the plan must say ", field,
              "=False under capture");
  static std::mutex mu;
  static auto* buffers = new std::map<std::pair<int, int64_t>, at::Tensor>();
  std::lock_guard<std::mutex> lock(mu);
  at::Tensor& buf = (*buffers)[{(int)stream.device_index(), (int64_t)stream.id()}];
  if (!buf.defined() || buf.numel() < n) {
    const int64_t size = std::max<int64_t>(n, buf.defined() ? 2 * buf.numel() : 1024);
    buf = at::zeros({size}, at::TensorOptions().dtype(at::kInt).device(at::kCUDA,
                                                                        stream.device_index()));
  }
  return buf.data_ptr<int>();
}

int* forward_split_counters(const char* op, const KernelPlan& plan, const LayoutView& L,
                            int64_t heads) {
  if (L.rw.num_slots == 0 || !plan.merge_in_kernel) return nullptr;
  TORCH_CHECK(!plan.pmf, op, ": merge_in_kernel=True with pmf=True: PMF's softmax + SpMM "
              "merges split rows with separate launches only; the plan must say "
              "merge_in_kernel=False where rows are split (row_slots > 0)");
  return split_row_counters(L.rw.num_slots * heads, op, "merge_in_kernel");
}

BackwardCounters backward_split_counters(const char* op, const KernelPlan& plan,
                                         at::ScalarType st, const Work& rw, const Work& cw,
                                         int64_t heads, bool concurrent) {
  if (!plan.bwd_merge_in_kernel || (rw.num_slots == 0 && cw.num_slots == 0))
    return {nullptr, nullptr};
  TORCH_CHECK(backward_merge_in_kernel_supported(st), op, ": bwd_merge_in_kernel=True, but the ",
              st, " backward kernels do not carry the in-kernel split-row merge (float32 only); "
              "the plan must say bwd_merge_in_kernel=False where rows are split");
  if (!concurrent) {
    int* c = split_row_counters(std::max(rw.num_slots, cw.num_slots) * heads, op,
                                "bwd_merge_in_kernel");
    return {c, c};
  }
  int* c = split_row_counters((rw.num_slots + cw.num_slots) * heads, op, "bwd_merge_in_kernel");
  return {c, c + rw.num_slots * heads};
}

void combine_partials(const float* partial, int64_t num_slots, const at::Tensor& combine,
                      at::Tensor& out, float* out32) {
  if (combine.size(0) == 0) return;  // also: no rows, so no division by out.size(0) = 0
  // Heads are not told apart: each row's H * C values are summed slot by slot.
  reduce_slots<false>(partial, num_slots, nullptr, combine, out, out32, nullptr, 1,
                      out.numel() / out.size(0), out.stride(0));
}

void merge_softmax_partials(const float* partial, const float* partial_ml, int64_t num_slots,
                            const at::Tensor& combine, at::Tensor& out, float* out32,
                            at::Tensor& lse2) {
  reduce_slots<true>(partial, num_slots, partial_ml, combine, out, out32, lse2.data_ptr<float>(),
                     out.size(1), out.size(2), out.size(1) * out.size(2));
}

void normalize_split_attn(const at::Tensor& combine, const at::Tensor& rowptr,
                          const at::Tensor& lse2, at::Tensor& attn) {
  const int64_t n_rows = combine.size(0), H = lse2.size(1);
  if (n_rows == 0) return;
  normalize_attn_kernel<<<ceil_div(n_rows * H * 32, 256), 256, 0, c10::cuda::getCurrentCUDAStream()>>>(
      combine.data_ptr<int>(), rowptr.data_ptr<int>(), lse2.data_ptr<float>(),
      attn.data_ptr<float>(), n_rows, H);
  check_launch();
}

}  // namespace dfgnn
