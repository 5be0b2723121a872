// Per-mask-byte math of the prune CUDA kernels (kernels/cuda/prune.cu), as __host__ __device__
// functions: one call computes or applies the 8 elements of one mask byte (bit j of byte b =
// element 8b + j). tests/cpp/test_cuda_math_host.cpp builds them for the host and compares them
// with the CPU kernels (kernels/cpu/prune.h), so the CUDA selection is checked without a GPU.
#pragma once

#include <cstdint>

#include "kernels/common/exact_math.h"

namespace torchspeed::kernels::cuda {

/// |bits| of element i (T = uint16_t/uint32_t/uint64_t storage of a float of that width): orders
/// exactly like |w| (-0 == +0, NaN above inf).
template <typename T>
TORCHSPEED_HD uint64_t prune_key(const T* w, int64_t i) {
  constexpr uint64_t kNoSign = (uint64_t{1} << (8 * sizeof(T) - 1)) - 1;  // drop the sign
  return static_cast<uint64_t>(w[i]) & kNoSign;
}

/// Byte b of the packed form of n {0,1} bytes (nonzero = 1; bits past n are 0).
TORCHSPEED_HD uint8_t prune_pack_byte(const uint8_t* bools, int64_t n, int64_t b) {
  uint8_t x = 0;
  for (int k = 0; k < 8 && b * 8 + k < n; ++k)
    x |= static_cast<uint8_t>((bools[b * 8 + k] != 0) << k);
  return x;
}

/// Zeroes the elements of mask byte b whose bit is 0 (n elements in all).
template <typename T>
TORCHSPEED_HD void prune_apply_byte(T* w, const uint8_t* bits, int64_t n, int64_t b) {
  const uint8_t x = bits[b];
  if (x == 0xffu) return;
  for (int k = 0; k < 8 && b * 8 + k < n; ++k) {
    if (!((x >> k) & 1u)) w[b * 8 + k] = T(0);
  }
}

/// Byte b of the N:M mask of numel elements (numel % m == 0): element i is kept when fewer than n
/// elements of its group come before it in (key descending, index ascending) order.
template <typename T>
TORCHSPEED_HD uint8_t prune_nm_byte(const T* w, int64_t numel, int n, int m, int64_t b) {
  uint8_t x = 0;
  for (int k = 0; k < 8 && b * 8 + k < numel; ++k) {
    const int64_t i = b * 8 + k;
    const int64_t base = i - i % m;
    const int j = static_cast<int>(i - base);
    const uint64_t kj = prune_key(w, i);
    int rank = 0;
    for (int t = 0; t < m && rank < n; ++t) {
      const uint64_t kt = prune_key(w, base + t);
      rank += kt > kj || (kt == kj && t < j);
    }
    x |= static_cast<uint8_t>((rank < n) << k);
  }
  return x;
}

}  // namespace torchspeed::kernels::cuda
