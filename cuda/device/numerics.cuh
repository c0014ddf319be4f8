// Scalar numerics of the kernels: the base-2 constants, conversions between the
// storage types and fp32 registers, the ATen -> CUDA type map and the
// one-instruction exp2 of the online softmax.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>
#include <cstdint>

namespace dfgnn {

constexpr float kLog2e = 1.4426950408889634f;
constexpr float kNegInf = -__builtin_huge_valf();

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

}  // namespace dfgnn
