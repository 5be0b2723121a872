// Multi-tensor apply: cuts lists of tensors into 64K-element chunks and launches kMtaSplit blocks
// per chunk, with the (pointers, sizes, block -> chunk) metadata passed by value as the kernel
// argument, so a launch needs no host->device copy and nothing waits for the device.
//
// Host side (see README.md for a full example):
//   std::vector<MtaTensor<2>> list = ...;            // {ptrs, numel, index} per tensor
//   using Meta = MtaMeta<2, 64, 320>;                // depth, tensors and blocks per launch
//   cudaError_t e = mta_for_each_launch<Meta>(list.data(), list.size(),
//       [&](const Meta& meta, int blocks) {
//         my_kernel<<<blocks * kMtaSplit, kMtaBlockSize, 0, stream>>>(meta, params);
//         return cudaGetLastError();
//       });
// Device side:
//   const int slot = meta.block_tensor[mta_meta_block()];
//   mta_for_each_quad(meta.numel[slot], meta.block_chunk[mta_meta_block()], aligned,
//                     [&](auto vec, int64_t i, int valid) { ... elements [i, i + valid) ... });
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <type_traits>

namespace torchspeed::kernels::cuda {

constexpr int kMtaBlockSize = 512;  // threads per block
constexpr int kMtaIlp = 4;          // elements per thread per iteration (one 16-byte fp32 load)
constexpr int64_t kMtaChunkSize = 65536;  // elements per block; a multiple of kMtaIlp
/// Kernel parameters are limited to 4 KB on every driver; keep metadata + op parameters under it.
constexpr size_t kMaxKernelArgBytes = 4096;

/// CUDA blocks per metadata chunk: launch `blocks * kMtaSplit` blocks. The metadata limits a launch
/// to a few hundred chunks, fewer blocks than an H100/H200 holds at once (132 SMs x 2-4 blocks of
/// 512 threads); splitting each chunk keeps a launch at several waves, so its tail costs little.
constexpr int kMtaSplit = 4;
constexpr int64_t kMtaPartSize = kMtaChunkSize / kMtaSplit;
static_assert(kMtaChunkSize % (kMtaIlp * kMtaSplit) == 0, "parts must start on a vector boundary");

/// Host-side description of one tensor: one pointer per list (null when the list is absent),
/// its element count and its position in the op's argument lists (per-tensor outputs, steps).
template <int kDepth>
struct MtaTensor {
  void* ptr[kDepth];
  int64_t numel;
  int32_t index;
};

/// The kernel argument of one launch. Block b works on chunk block_chunk[b] of the tensor in slot
/// block_tensor[b]. Sized by the caller so that sizeof(meta) + sizeof(op params) <= 4 KB.
template <int kDepth, int kMaxTensors, int kMaxBlocks>
struct MtaMeta {
  static constexpr int kListDepth = kDepth;
  static constexpr int kTensors = kMaxTensors;
  static constexpr int kBlocks = kMaxBlocks;
  static_assert(kMaxTensors >= 1 && kMaxTensors <= 256, "block_tensor is a uint8_t slot index");
  void* ptr[kDepth][kMaxTensors];
  int64_t numel[kMaxTensors];
  int32_t index[kMaxTensors];
  int32_t block_chunk[kMaxBlocks];
  uint8_t block_tensor[kMaxBlocks];
};

/// Fills Meta with the chunks of `tensors` (empty ones skipped) and calls
/// `launch(const Meta&, int blocks) -> cudaError_t` whenever the tensor or block slots are full,
/// and once at the end. A tensor whose chunks do not fit is carried into slot 0 of the next launch.
/// Returns the first launch error.
template <class Meta, int kDepth, class Launch>
cudaError_t mta_for_each_launch(const MtaTensor<kDepth>* tensors, size_t count, Launch&& launch) {
  static_assert(Meta::kListDepth == kDepth, "metadata depth must match the tensor lists");
  Meta meta{};  // value-initialised: unused slots travel as zeros, not as stack garbage
  int slot = 0;
  int blocks = 0;
  auto place = [&](const MtaTensor<kDepth>& t, int s) {
    for (int d = 0; d < kDepth; ++d) meta.ptr[d][s] = t.ptr[d];
    meta.numel[s] = t.numel;
    meta.index[s] = t.index;
  };
  for (size_t t = 0; t < count; ++t) {
    const int64_t n = tensors[t].numel;
    if (n <= 0) continue;
    const int64_t chunks = (n + kMtaChunkSize - 1) / kMtaChunkSize;
    place(tensors[t], slot);
    bool slot_released = false;
    for (int64_t c = 0; c < chunks; ++c) {
      meta.block_tensor[blocks] = static_cast<uint8_t>(slot);
      meta.block_chunk[blocks] = static_cast<int32_t>(c);
      ++blocks;
      const bool last_chunk = c == chunks - 1;
      if (blocks == Meta::kBlocks || (last_chunk && slot + 1 == Meta::kTensors)) {
        const cudaError_t err = launch(static_cast<const Meta&>(meta), blocks);
        if (err != cudaSuccess) return err;
        blocks = 0;
        if (last_chunk) {
          slot = 0;
          slot_released = true;
        } else {
          slot = 0;  // the rest of this tensor continues in slot 0 of the next launch
          place(tensors[t], slot);
        }
      }
    }
    if (!slot_released) ++slot;
  }
  if (blocks > 0) return launch(static_cast<const Meta&>(meta), blocks);
  return cudaSuccess;
}

#if defined(__CUDACC__)

/// The metadata block (chunk) this CUDA block works on, and which of its kMtaSplit parts.
__device__ __forceinline__ int mta_meta_block() { return static_cast<int>(blockIdx.x) / kMtaSplit; }
__device__ __forceinline__ int mta_part() { return static_cast<int>(blockIdx.x) % kMtaSplit; }

/// Calls body(std::integral_constant<bool, vec>, i, valid) for this thread's groups of kMtaIlp
/// consecutive elements [i, i + valid) of this block's part of one chunk, int64 indices
/// throughout. vec == true: the group is full and the caller's pointers are aligned, so it may use
/// one vector load per list; vec == false: guarded element-wise access (valid in 1..4). A part
/// past the end of the tensor runs no iteration (the block still takes part in reductions).
template <class Body>
__device__ __forceinline__ void mta_for_each_quad(int64_t numel, int32_t chunk, bool aligned,
                                                  Body&& body) {
  const int64_t begin =
      static_cast<int64_t>(chunk) * kMtaChunkSize + static_cast<int64_t>(mta_part()) * kMtaPartSize;
  const int64_t end = begin + kMtaPartSize < numel ? begin + kMtaPartSize : numel;
  const int64_t stride = static_cast<int64_t>(blockDim.x) * kMtaIlp;
  for (int64_t i = begin + static_cast<int64_t>(threadIdx.x) * kMtaIlp; i < end; i += stride) {
    const int valid = end - i < kMtaIlp ? static_cast<int>(end - i) : kMtaIlp;
    if (aligned && valid == kMtaIlp) {
      body(std::integral_constant<bool, true>{}, i, kMtaIlp);
    } else {
      body(std::integral_constant<bool, false>{}, i, valid);
    }
  }
}

/// True when p may be read with one kMtaIlp-element vector access (null counts as aligned).
template <typename T>
__device__ __forceinline__ bool mta_aligned(const T* p) {
  return (reinterpret_cast<uintptr_t>(p) % (sizeof(T) * kMtaIlp)) == 0;
}

/// Sum over the block (any blockDim.x that is a multiple of 32, up to 1024); the result is valid
/// in thread 0. Every thread of the block must call it.
template <typename T>
__device__ __forceinline__ T mta_block_sum(T v) {
  __shared__ T warp_sums[32];
  for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_down_sync(0xffffffffu, v, offset);
  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
  __syncthreads();  // warp_sums may still be read by a previous call
  if (lane == 0) warp_sums[warp] = v;
  __syncthreads();
  const int warps = static_cast<int>(blockDim.x >> 5);
  if (warp == 0) {
    v = lane < warps ? warp_sums[lane] : T(0);
    for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_down_sync(0xffffffffu, v, offset);
  }
  return v;
}

#endif  // __CUDACC__

}  // namespace torchspeed::kernels::cuda
