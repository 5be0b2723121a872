// Bit-packed pruning masks inside the CPU kernels: keep_bits(bits, i, v) keeps the lanes of `v`
// (elements i .. i + kWidth - 1) whose mask bit is 1 and zeroes the others. Bit j of byte b is
// element 8 * b + j (least significant bit first), the layout of torchspeed.prune's packed masks.
// The vector overloads need i % 8 == 0 (callers start chunks on a byte); the scalar one takes any
// i.
#pragma once

#include "kernels/cpu/vec.h"

namespace torchspeed::kernels::cpu {
namespace TORCHSPEED_CPU_ISA_NAMESPACE {

/// Bit i of a packed mask.
inline bool mask_bit(const uint8_t* bits, int64_t i) { return (bits[i >> 3] >> (i & 7)) & 1u; }

template <typename F>
inline ScalarVec<F> keep_bits(const uint8_t* bits, int64_t i, ScalarVec<F> a) {
  return ScalarVec<F>(mask_bit(bits, i) ? a.v : F(0));
}

#if defined(__AVX2__)
inline VecAvx2 keep_bits(const uint8_t* bits, int64_t i, VecAvx2 a) {
  // Broadcast the byte, isolate bit k in lane k, compare: all-ones lanes keep `a`.
  const __m256i lane_bit = _mm256_setr_epi32(1, 2, 4, 8, 16, 32, 64, 128);
  const __m256i b = _mm256_and_si256(_mm256_set1_epi32(bits[i >> 3]), lane_bit);
  return VecAvx2(_mm256_and_ps(_mm256_castsi256_ps(_mm256_cmpeq_epi32(b, lane_bit)), a.v));
}
#endif

#if defined(__AVX512F__)
inline VecAvx512 keep_bits(const uint8_t* bits, int64_t i, VecAvx512 a) {
  uint16_t k;
  std::memcpy(&k, bits + (i >> 3), sizeof k);  // 16 lanes = 2 bytes, little-endian
  return VecAvx512(_mm512_maskz_mov_ps(static_cast<__mmask16>(k), a.v));
}
#endif

}  // namespace TORCHSPEED_CPU_ISA_NAMESPACE
}  // namespace torchspeed::kernels::cpu
