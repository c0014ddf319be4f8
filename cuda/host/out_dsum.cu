// D = dO . O for the fp16 / bf16 backward (out_dsum.h): one launch that reads
// dO and the forward's float32 rows once, where ATen's mul and sum write and
// reread a float32 [N, H, C] product (two launches, 95 us at 1 x 128 and 171 us
// at 4 x 32 on a 120K-node batch on the H200, the 4 x 32 reduction alone 110 us).
#include <cstdint>

#include "device/fragments.cuh"
#include "host/dispatch.cuh"
#include "host/out_dsum.h"

namespace dfgnn {
namespace {

// G lanes per (row, head) unit, each taking V elements per step (V = 8: one
// 16-byte load of dO and two of O32), a shuffle sum over the G lanes. Every lane
// of a warp reaches the shuffles (units past the end add 0), so the full mask holds.
template <typename T, int V, int G>
__global__ void __launch_bounds__(256)
out_dsum_kernel(const T* __restrict__ dout, const float* __restrict__ out32,
                float* __restrict__ dsum, int64_t n_units, int C) {
  const int64_t t = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  const int64_t u = t / G;
  const int lane = (int)(t % G);
  float acc = 0.f;
  if (u < n_units) {
    const int64_t base = u * C;
    for (int c = lane * V; c < C; c += G * V) {
      float g[V], o[V];
      Vec<T, V>::load(dout + base + c, g);
      if constexpr (V == 1) {
        o[0] = __ldg(out32 + base + c);
      } else {
        float lo[4], hi[4];
        Vec<float, 4>::load(out32 + base + c, lo);
        Vec<float, 4>::load(out32 + base + c + 4, hi);
#pragma unroll
        for (int k = 0; k < 4; ++k) o[k] = lo[k], o[k + 4] = hi[k];
      }
#pragma unroll
      for (int k = 0; k < V; ++k) acc = fmaf(g[k], o[k], acc);
    }
  }
#pragma unroll
  for (int s = G / 2; s > 0; s >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, s, G);
  if (u < n_units && lane == 0) dsum[u] = acc;
}

template <typename T, int V>
void launch_out_dsum(const T* dout, const float* out32, float* dsum, int64_t n_units, int C,
            cudaStream_t stream) {
  // Lanes per unit: enough for one step over the row, at most a warp.
  const int steps = (C + V - 1) / V;
  auto kern = out_dsum_kernel<T, V, 32>;
  int G = 32;
  if (steps <= 1) kern = out_dsum_kernel<T, V, 1>, G = 1;
  else if (steps <= 2) kern = out_dsum_kernel<T, V, 2>, G = 2;
  else if (steps <= 4) kern = out_dsum_kernel<T, V, 4>, G = 4;
  else if (steps <= 8) kern = out_dsum_kernel<T, V, 8>, G = 8;
  else if (steps <= 16) kern = out_dsum_kernel<T, V, 16>, G = 16;
  kern<<<ceil_div(n_units * G, 256), 256, 0, stream>>>(dout, out32, dsum, n_units, C);
}

}  // namespace

at::Tensor out_dsum_cuda(const at::Tensor& grad_out, const at::Tensor& out32) {
  TORCH_INTERNAL_ASSERT(grad_out.is_contiguous() && out32.is_contiguous() &&
                        grad_out.dim() == 3 && out32.sizes() == grad_out.sizes() &&
                        out32.scalar_type() == at::kFloat);
  const int64_t N = grad_out.size(0), H = grad_out.size(1);
  const int C = (int)grad_out.size(2);
  at::Tensor dsum = at::empty({N, H}, out32.options());
  const int64_t n_units = N * H;
  if (n_units == 0) return dsum;
  // 16-byte loads where every row starts on a 16-byte boundary of both tensors.
  const bool vec = C % 8 == 0 && reinterpret_cast<uintptr_t>(grad_out.data_ptr()) % 16 == 0 &&
                   reinterpret_cast<uintptr_t>(out32.data_ptr()) % 16 == 0;
  const auto stream = c10::cuda::getCurrentCUDAStream();
  const float* o = out32.data_ptr<float>();
  float* d = dsum.data_ptr<float>();
  switch (grad_out.scalar_type()) {
    case at::kHalf: {
      const auto* g = reinterpret_cast<const __half*>(grad_out.data_ptr());
      vec ? launch_out_dsum<__half, 8>(g, o, d, n_units, C, stream)
          : launch_out_dsum<__half, 1>(g, o, d, n_units, C, stream);
      break;
    }
    case at::kBFloat16: {
      const auto* g = reinterpret_cast<const __nv_bfloat16*>(grad_out.data_ptr());
      vec ? launch_out_dsum<__nv_bfloat16, 8>(g, o, d, n_units, C, stream)
          : launch_out_dsum<__nv_bfloat16, 1>(g, o, d, n_units, C, stream);
      break;
    }
    default:
      TORCH_INTERNAL_ASSERT(false, "out_dsum_cuda: fp16 / bf16 only");
  }
  check_launch();
  return dsum;
}

}  // namespace dfgnn
