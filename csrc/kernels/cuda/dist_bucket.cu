// The dist area's bucket kernel on CUDA: out = in * scale with a dtype conversion, one grid-stride
// pass (the reducer's 1/world_size division fused with the bf16/fp16 compression cast, and the
// widening back after the all-reduce). Enqueued on the given stream, no host synchronisation.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

#include "kernels/cuda/api.cuh"
#include "kernels/cuda/numerics.cuh"

namespace torchspeed::kernels::cuda {
namespace {

template <typename In, typename Out, typename Acc>
__global__ void scale_cast_kernel(const In* __restrict__ in, Out* out, Acc scale, int64_t n) {
  const int64_t stride = static_cast<int64_t>(blockDim.x) * gridDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += stride) {
    if constexpr (std::is_same_v<Out, double>) {
      out[i] = in[i] * scale;
    } else {
      out[i] = from_acc<Out>(to_acc(in[i]) * scale);
    }
  }
}

template <typename In, typename Out, typename Acc>
cudaError_t launch(const void* in, void* out, double scale, int64_t n, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  constexpr int kThreads = 256;
  const int64_t want = (n + kThreads - 1) / kThreads;
  const int blocks = static_cast<int>(want < 8192 ? want : 8192);
  scale_cast_kernel<In, Out, Acc><<<blocks, kThreads, 0, stream>>>(
      static_cast<const In*>(in), static_cast<Out*>(out), static_cast<Acc>(scale), n);
  return cudaGetLastError();
}

template <typename In>
cudaError_t launch_to(DType out_dtype, const void* in, void* out, double scale, int64_t n,
                      cudaStream_t stream) {
  switch (out_dtype) {
    case DType::kFloat:
      return launch<In, float, float>(in, out, scale, n, stream);
    case DType::kBFloat16:
      return launch<In, __nv_bfloat16, float>(in, out, scale, n, stream);
    case DType::kHalf:
      return launch<In, __half, float>(in, out, scale, n, stream);
    default:
      return cudaErrorInvalidValue;
  }
}

}  // namespace

cudaError_t scale_cast(DType in_dtype, const void* in, DType out_dtype, void* out, double scale,
                       int64_t n, cudaStream_t stream) {
  switch (in_dtype) {
    case DType::kDouble:
      if (out_dtype != DType::kDouble) return cudaErrorInvalidValue;
      return launch<double, double, double>(in, out, scale, n, stream);
    case DType::kFloat:
      return launch_to<float>(out_dtype, in, out, scale, n, stream);
    case DType::kBFloat16:
      return launch_to<__nv_bfloat16>(out_dtype, in, out, scale, n, stream);
    case DType::kHalf:
      return launch_to<__half>(out_dtype, in, out, scale, n, stream);
  }
  return cudaErrorInvalidValue;
}

}  // namespace torchspeed::kernels::cuda
