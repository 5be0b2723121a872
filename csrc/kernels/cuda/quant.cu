// The quant area's int8 kernels on CUDA: affine quantize and dequantize with a per-tensor,
// per-row or per-group scale, one grid-stride pass, fp32 arithmetic (__frcp_rn for 1/scale and
// rintf, so the result equals the CPU kernels and torch's reference bit for bit). Enqueued on the
// given stream; scale and zero_point are read on the device.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/cuda/api.cuh"
#include "kernels/cuda/numerics.cuh"

namespace torchspeed::kernels::cuda {
namespace {

__device__ __forceinline__ int64_t scale_index(int64_t i, const QuantLayout& l) {
  if (l.groups == 0) return 0;
  const int64_t r = i / l.cols, c = i - r * l.cols;
  return r * l.groups + c / (l.cols / l.groups);
}

template <typename In>
__global__ void quantize_kernel(const In* __restrict__ x, int8_t* __restrict__ q, QuantLayout l,
                                const float* __restrict__ scale,
                                const int32_t* __restrict__ zero_point, int64_t n) {
  const int64_t stride = static_cast<int64_t>(blockDim.x) * gridDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += stride) {
    const int64_t s = scale_index(i, l);
    const float inv = __frcp_rn(scale[s]);
    const float zp = zero_point ? static_cast<float>(zero_point[s]) : 0.f;
    // clamped from above first: fminf(NaN, 127) is 127, as on the CPU and in torch
    const float v = fmaxf(fminf(rintf(__fmul_rn(to_acc(x[i]), inv)) + zp, 127.f), -128.f);
    q[i] = static_cast<int8_t>(static_cast<int32_t>(v));
  }
}

__global__ void dequantize_kernel(const int8_t* __restrict__ q, float* __restrict__ out,
                                  QuantLayout l, const float* __restrict__ scale,
                                  const int32_t* __restrict__ zero_point, int64_t n) {
  const int64_t stride = static_cast<int64_t>(blockDim.x) * gridDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += stride) {
    const int64_t s = scale_index(i, l);
    const float zp = zero_point ? static_cast<float>(zero_point[s]) : 0.f;
    out[i] = __fmul_rn(static_cast<float>(q[i]) - zp, scale[s]);
  }
}

int grid_for(int64_t n, int threads) {
  const int64_t want = (n + threads - 1) / threads;
  return static_cast<int>(want < 8192 ? want : 8192);
}

}  // namespace

cudaError_t quantize_int8(DType in_dtype, const void* x, int8_t* q, QuantLayout layout,
                          const float* scale, const int32_t* zero_point, cudaStream_t stream) {
  const int64_t n = layout.rows * layout.cols;
  if (n == 0) return cudaSuccess;
  constexpr int kThreads = 256;
  const int blocks = grid_for(n, kThreads);
  switch (in_dtype) {
    case DType::kFloat:
      quantize_kernel<<<blocks, kThreads, 0, stream>>>(static_cast<const float*>(x), q, layout,
                                                       scale, zero_point, n);
      break;
    case DType::kBFloat16:
      quantize_kernel<<<blocks, kThreads, 0, stream>>>(static_cast<const __nv_bfloat16*>(x), q,
                                                       layout, scale, zero_point, n);
      break;
    case DType::kHalf:
      quantize_kernel<<<blocks, kThreads, 0, stream>>>(static_cast<const __half*>(x), q, layout,
                                                       scale, zero_point, n);
      break;
    default:
      return cudaErrorInvalidValue;
  }
  return cudaGetLastError();
}

cudaError_t dequantize_int8(const int8_t* q, float* out, QuantLayout layout, const float* scale,
                            const int32_t* zero_point, cudaStream_t stream) {
  const int64_t n = layout.rows * layout.cols;
  if (n == 0) return cudaSuccess;
  constexpr int kThreads = 256;
  dequantize_kernel<<<grid_for(n, kThreads), kThreads, 0, stream>>>(q, out, layout, scale,
                                                                    zero_point, n);
  return cudaGetLastError();
}

}  // namespace torchspeed::kernels::cuda
