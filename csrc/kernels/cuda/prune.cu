// The prune area's CUDA kernel over bit-packed masks (bit j of byte b = element 8b + j): N:M
// selection (pack, unpack and apply are in mask.cu). One thread per mask byte (8 elements, the math
// in prune_math.cuh, checked on the host by ctest), so no two threads write one byte; grid-stride
// loops; enqueued on the given stream, no host sync.
#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/cuda/api.cuh"
#include "kernels/cuda/grid.cuh"
#include "kernels/cuda/prune_math.cuh"

namespace torchspeed::kernels::cuda {
namespace {

using namespace grid;  // NOLINT(google-build-using-namespace)

template <typename T>
__global__ void nm_kernel(const T* __restrict__ w, int64_t numel, int n, int m,
                          uint8_t* __restrict__ bits) {
  const int64_t bytes = (numel + 7) / 8;
  for (int64_t b = first_index(); b < bytes; b += grid_stride()) {
    bits[b] = prune_nm_byte(w, numel, n, m, b);
  }
}

}  // namespace

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
