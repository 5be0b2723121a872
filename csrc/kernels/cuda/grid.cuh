// Launch geometry shared by the element-wise CUDA kernels over masks (mask.cu, prune.cu): a fixed
// block size, a capped grid and grid-stride loops.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace torchspeed::kernels::cuda::grid {

constexpr int kThreads = 256;

inline int blocks_for(int64_t work) {
  const int64_t b = (work + kThreads - 1) / kThreads;
  return static_cast<int>(b < 65535 ? (b > 0 ? b : 1) : 65535);
}

__device__ __forceinline__ int64_t first_index() {
  return static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
}
__device__ __forceinline__ int64_t grid_stride() {
  return static_cast<int64_t>(blockDim.x) * gridDim.x;
}

}  // namespace torchspeed::kernels::cuda::grid
