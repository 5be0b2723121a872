// The CUDA kernels of lowbit_encode / lowbit_decode (int8 optimizer state): one thread block per
// state block for encode (the block's absmax by a shared-memory max, then the codes), one thread
// per element for decode. The element math is kernels/common/lowbit_codes.h, the CPU kernels'
// twin (compared bit for bit on the host by ctest). Enqueued on the given stream, no host sync.
#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/common/lowbit_codes.h"
#include "kernels/cuda/api.cuh"
#include "kernels/cuda/grid.cuh"

namespace torchspeed::kernels::cuda {
namespace {

using namespace grid;  // NOLINT(google-build-using-namespace)

__global__ void encode_kernel(const float* __restrict__ x, int64_t n, int64_t block, bool is_signed,
                              void* __restrict__ codes, float* __restrict__ absmax) {
  __shared__ float partial[kThreads];
  const int64_t b0 = static_cast<int64_t>(blockIdx.x) * block;
  const int64_t len = n - b0 < block ? n - b0 : block;
  float m = 0.f;
  for (int64_t j = threadIdx.x; j < len; j += blockDim.x) {
    const float v = x[b0 + j];
    const float t = is_signed ? fabsf(v) : v;
    m = t > m ? t : m;  // NaN skipped, as the CPU kernels' max
  }
  partial[threadIdx.x] = m;
  __syncthreads();
  for (int s = blockDim.x / 2; s > 0; s /= 2) {
    if (threadIdx.x < s) {
      const float o = partial[threadIdx.x + s];
      partial[threadIdx.x] = o > partial[threadIdx.x] ? o : partial[threadIdx.x];
    }
    __syncthreads();
  }
  const float amax = partial[0];
  if (threadIdx.x == 0) absmax[blockIdx.x] = amax;
  const float inv = lowbit_inverse(amax);
  for (int64_t j = threadIdx.x; j < len; j += blockDim.x) {
    if (is_signed) {
      static_cast<int8_t*>(codes)[b0 + j] = lowbit_encode_m(x[b0 + j], inv);
    } else {
      static_cast<uint8_t*>(codes)[b0 + j] = lowbit_encode_v(x[b0 + j], inv);
    }
  }
}

__global__ void decode_kernel(const void* __restrict__ codes, bool is_signed,
                              const float* __restrict__ absmax, int64_t n, int64_t block,
                              float* __restrict__ out) {
  for (int64_t i = first_index(); i < n; i += grid_stride()) {
    const float a = absmax[i / block];
    out[i] = is_signed ? lowbit_decode_m(static_cast<const int8_t*>(codes)[i], a)
                       : lowbit_decode_v(static_cast<const uint8_t*>(codes)[i], a);
  }
}

}  // namespace

cudaError_t lowbit_encode(const float* x, int64_t n, int64_t block, bool is_signed, void* codes,
                          float* absmax, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  const int64_t blocks = (n + block - 1) / block;
  encode_kernel<<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(x, n, block, is_signed,
                                                                        codes, absmax);
  return cudaGetLastError();
}

cudaError_t lowbit_decode(const void* codes, bool is_signed, const float* absmax, int64_t n,
                          int64_t block, float* out, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  decode_kernel<<<blocks_for(n), kThreads, 0, stream>>>(codes, is_signed, absmax, n, block, out);
  return cudaGetLastError();
}

}  // namespace torchspeed::kernels::cuda
