// The quant area's fake-quant kernel on CUDA: y and the straight-through mask in one grid-stride
// pass over x, per tensor / per row / per group (the element math is quant_math.cuh's
// fake_quant_element, compared bit for bit with the CPU kernel on the host by ctest). Enqueued on
// the given stream; scale and zero_point are read on the device.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/cuda/api.cuh"
#include "kernels/cuda/numerics.cuh"
#include "kernels/cuda/quant_math.cuh"

namespace torchspeed::kernels::cuda {
namespace {

/// The element's scale index. Index arithmetic is the cost of a memory-bound kernel: per tensor
/// needs none, and tensors below 2^31 elements divide in 32 bits (Idx = uint32_t).
template <typename Idx>
__device__ __forceinline__ Idx fq_scale_index(Idx i, Idx cols, Idx group_size, Idx groups) {
  const Idx r = i / cols, c = i - r * cols;
  return r * groups + c / group_size;
}

template <typename T, typename Idx>
__global__ void fake_quantize_kernel(const T* __restrict__ x, T* __restrict__ y,
                                     uint8_t* __restrict__ mask, QuantLayout l,
                                     const float* __restrict__ scale,
                                     const int32_t* __restrict__ zero_point, float qmin, float qmax,
                                     int64_t n) {
  const bool per_tensor = l.groups == 0;
  const Idx cols = static_cast<Idx>(l.cols), groups = static_cast<Idx>(l.groups);
  const Idx group_size = per_tensor ? Idx{1} : static_cast<Idx>(l.cols / l.groups);
  const int64_t stride = static_cast<int64_t>(blockDim.x) * gridDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += stride) {
    const Idx s =
        per_tensor ? Idx{0} : fq_scale_index<Idx>(static_cast<Idx>(i), cols, group_size, groups);
    const float sc = scale[s];
    const float zp = zero_point ? static_cast<float>(zero_point[s]) : 0.f;
    bool in_range = false;
    const float v = fake_quant_element(to_acc(x[i]), sc, __frcp_rn(sc), zp, qmin, qmax, in_range);
    y[i] = from_acc<T>(v);
    mask[i] = in_range ? 1 : 0;
  }
}

template <typename T>
void launch_fake_quantize(const T* x, T* y, uint8_t* mask, QuantLayout l, const float* scale,
                          const int32_t* zero_point, float qmin, float qmax, int64_t n, int blocks,
                          int threads, cudaStream_t stream) {
  if (n <= 0x7fffffffLL) {
    fake_quantize_kernel<T, uint32_t>
        <<<blocks, threads, 0, stream>>>(x, y, mask, l, scale, zero_point, qmin, qmax, n);
  } else {
    fake_quantize_kernel<T, int64_t>
        <<<blocks, threads, 0, stream>>>(x, y, mask, l, scale, zero_point, qmin, qmax, n);
  }
}

template <typename T>
__global__ void fake_quantize_backward_kernel(const T* __restrict__ grad,
                                              const uint8_t* __restrict__ mask, T* __restrict__ out,
                                              int64_t n) {
  const int64_t stride = static_cast<int64_t>(blockDim.x) * gridDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += stride) {
    out[i] = from_acc<T>(__fmul_rn(to_acc(grad[i]), mask[i] ? 1.f : 0.f));
  }
}

int fq_grid(int64_t n, int threads) {
  const int64_t want = (n + threads - 1) / threads;
  return static_cast<int>(want < 8192 ? want : 8192);
}

}  // namespace

cudaError_t fake_quantize_backward(DType dtype, const void* grad, const uint8_t* mask, void* out,
                                   int64_t n, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  constexpr int kThreads = 256;
  const int blocks = fq_grid(n, kThreads);
  switch (dtype) {
    case DType::kFloat:
      fake_quantize_backward_kernel<<<blocks, kThreads, 0, stream>>>(
          static_cast<const float*>(grad), mask, static_cast<float*>(out), n);
      break;
    case DType::kBFloat16:
      fake_quantize_backward_kernel<<<blocks, kThreads, 0, stream>>>(
          static_cast<const __nv_bfloat16*>(grad), mask, static_cast<__nv_bfloat16*>(out), n);
      break;
    case DType::kHalf:
      fake_quantize_backward_kernel<<<blocks, kThreads, 0, stream>>>(
          static_cast<const __half*>(grad), mask, static_cast<__half*>(out), n);
      break;
    default:
      return cudaErrorInvalidValue;
  }
  return cudaGetLastError();
}

cudaError_t fake_quantize(DType dtype, const void* x, void* y, uint8_t* mask, QuantLayout layout,
                          const float* scale, const int32_t* zero_point, float quant_min,
                          float quant_max, cudaStream_t stream) {
  const int64_t n = layout.rows * layout.cols;
  if (n == 0) return cudaSuccess;
  constexpr int kThreads = 256;
  const int blocks = fq_grid(n, kThreads);
  switch (dtype) {
    case DType::kFloat:
      launch_fake_quantize(static_cast<const float*>(x), static_cast<float*>(y), mask, layout,
                           scale, zero_point, quant_min, quant_max, n, blocks, kThreads, stream);
      break;
    case DType::kBFloat16:
      launch_fake_quantize(static_cast<const __nv_bfloat16*>(x), static_cast<__nv_bfloat16*>(y),
                           mask, layout, scale, zero_point, quant_min, quant_max, n, blocks,
                           kThreads, stream);
      break;
    case DType::kHalf:
      launch_fake_quantize(static_cast<const __half*>(x), static_cast<__half*>(y), mask, layout,
                           scale, zero_point, quant_min, quant_max, n, blocks, kThreads, stream);
      break;
    default:
      return cudaErrorInvalidValue;
  }
  return cudaGetLastError();
}

}  // namespace torchspeed::kernels::cuda
