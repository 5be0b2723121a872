// The prune area's CUDA kernels over bit-packed masks (bit j of byte b = element 8b + j): pack,
// unpack, in-place apply, and N:M selection. One thread per mask byte (8 elements, the math in
// prune_math.cuh, checked on the host by ctest), so no two threads write one byte; grid-stride
// loops; enqueued on the given stream, no host sync.
#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/cuda/api.cuh"
#include "kernels/cuda/prune_math.cuh"

namespace torchspeed::kernels::cuda {
namespace {

constexpr int kThreads = 256;

int blocks_for(int64_t work) {
  const int64_t b = (work + kThreads - 1) / kThreads;
  return static_cast<int>(b < 65535 ? (b > 0 ? b : 1) : 65535);
}

__device__ __forceinline__ int64_t first_index() {
  return static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
}
__device__ __forceinline__ int64_t grid_stride() {
  return static_cast<int64_t>(blockDim.x) * gridDim.x;
}

__global__ void pack_kernel(const uint8_t* __restrict__ bools, uint8_t* __restrict__ bits,
                            int64_t n) {
  const int64_t bytes = (n + 7) / 8;
  for (int64_t b = first_index(); b < bytes; b += grid_stride()) {
    bits[b] = prune_pack_byte(bools, n, b);
  }
}

__global__ void unpack_kernel(const uint8_t* __restrict__ bits, uint8_t* __restrict__ bools,
                              int64_t n) {
  for (int64_t i = first_index(); i < n; i += grid_stride())
    bools[i] = (bits[i >> 3] >> (i & 7)) & 1;
}

template <typename T>
__global__ void apply_kernel(T* __restrict__ w, const uint8_t* __restrict__ bits, int64_t n) {
  const int64_t bytes = (n + 7) / 8;
  for (int64_t b = first_index(); b < bytes; b += grid_stride()) prune_apply_byte(w, bits, n, b);
}

template <typename T>
__global__ void nm_kernel(const T* __restrict__ w, int64_t numel, int n, int m,
                          uint8_t* __restrict__ bits) {
  const int64_t bytes = (numel + 7) / 8;
  for (int64_t b = first_index(); b < bytes; b += grid_stride()) {
    bits[b] = prune_nm_byte(w, numel, n, m, b);
  }
}

}  // namespace

cudaError_t prune_pack_mask(const uint8_t* bools, uint8_t* bits, int64_t n, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  pack_kernel<<<blocks_for((n + 7) / 8), kThreads, 0, stream>>>(bools, bits, n);
  return cudaGetLastError();
}

cudaError_t prune_unpack_mask(const uint8_t* bits, uint8_t* bools, int64_t n, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  unpack_kernel<<<blocks_for(n), kThreads, 0, stream>>>(bits, bools, n);
  return cudaGetLastError();
}

cudaError_t prune_apply_mask(void* w, int elem_size, const uint8_t* bits, int64_t n,
                             cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  const int blocks = blocks_for((n + 7) / 8);
  switch (elem_size) {
    case 2:
      apply_kernel<<<blocks, kThreads, 0, stream>>>(static_cast<uint16_t*>(w), bits, n);
      break;
    case 4:
      apply_kernel<<<blocks, kThreads, 0, stream>>>(static_cast<uint32_t*>(w), bits, n);
      break;
    case 8:
      apply_kernel<<<blocks, kThreads, 0, stream>>>(static_cast<uint64_t*>(w), bits, n);
      break;
    default:
      return cudaErrorInvalidValue;
  }
  return cudaGetLastError();
}

cudaError_t prune_nm_mask(const void* w, int elem_size, int64_t numel, int n, int m, uint8_t* bits,
                          cudaStream_t stream) {
  if (numel == 0) return cudaSuccess;
  if (m < 1 || m > 256 || n < 0 || n > m || numel % m != 0) return cudaErrorInvalidValue;
  const int blocks = blocks_for((numel + 7) / 8);
  switch (elem_size) {
    case 2:
      nm_kernel<<<blocks, kThreads, 0, stream>>>(static_cast<const uint16_t*>(w), numel, n, m,
                                                 bits);
      break;
    case 4:
      nm_kernel<<<blocks, kThreads, 0, stream>>>(static_cast<const uint32_t*>(w), numel, n, m,
                                                 bits);
      break;
    case 8:
      nm_kernel<<<blocks, kThreads, 0, stream>>>(static_cast<const uint64_t*>(w), numel, n, m,
                                                 bits);
      break;
    default:
      return cudaErrorInvalidValue;
  }
  return cudaGetLastError();
}

}  // namespace torchspeed::kernels::cuda
