// The CUDA kernels of the packed-mask ops (bit j of byte b = element 8b + j): pack, unpack and
// in-place apply. One thread per mask byte (8 elements, the math in prune_math.cuh, checked on the
// host by ctest), so no two threads write one byte; grid-stride loops; enqueued on the given
// stream, no host sync.
#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/cuda/api.cuh"
#include "kernels/cuda/grid.cuh"
#include "kernels/cuda/prune_math.cuh"

namespace torchspeed::kernels::cuda {
namespace {

using namespace grid;  // NOLINT(google-build-using-namespace)

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

}  // namespace

cudaError_t pack_mask_bits(const uint8_t* bools, uint8_t* bits, int64_t n, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  pack_kernel<<<blocks_for((n + 7) / 8), kThreads, 0, stream>>>(bools, bits, n);
  return cudaGetLastError();
}

cudaError_t unpack_mask_bits(const uint8_t* bits, uint8_t* bools, int64_t n, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  unpack_kernel<<<blocks_for(n), kThreads, 0, stream>>>(bits, bools, n);
  return cudaGetLastError();
}

cudaError_t apply_mask_bits(void* w, int elem_size, const uint8_t* bits, int64_t n,
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

}  // namespace torchspeed::kernels::cuda
