// Low-bit optimizer moments (state_dtype "int8" and "bf16"), written once over the vector type:
// the int8 block code maps, their dequantize / quantize, and bf16 stochastic rounding.
//
// int8: a moment tensor is cut into blocks of `block` elements (a power of two; the last block of
// a tensor may be shorter), each with one float32 absmax. The maps are non-linear, so that small
// values keep precision next to a large one in the same block, and closed-form both ways (two
// square roots at most, no table search), so quantizing costs a few vector instructions per
// element and stays under the memory time of the step:
//   first moment (signed, int8 c in [-127, 127]):  m = sign(c) * (|c| / 127)^2 * absmax
//   second moment (unsigned, uint8 c in [0, 255]):  v = (c / 255)^4 * absmax
// Quantizing rounds to the nearest code in the root domain (c = round(127 * sqrt(|m| / absmax)),
// c = round(255 * (v / absmax)^(1/4))), ties to even. The smallest non-zero values a block keeps
// are 6.2e-5 (m) and 2.3e-10 (v) of its absmax. Every operation is IEEE-rounded (no contraction):
// codes are bit-identical on every ISA and equal to a float32 emulation in torch
// (tests/python/optim/test_lowbit.py).
//
// bf16: moments are bfloat16; the update runs in fp32 and the new moment is written with
// stochastic rounding (the 16 dropped bits compared with 16 bits of a counter-based hash of the
// element's index, the step count and the param's position), so updates smaller than half a bf16
// ulp survive on average instead of being rounded away. Deterministic: the same step on the same
// state gives the same bits on every ISA and thread count.
#pragma once

#include <cstdint>
#include <cstring>

#include "kernels/cpu/vec.h"

namespace torchspeed::kernels::cpu {
namespace TORCHSPEED_CPU_ISA_NAMESPACE {

/// The largest int8 block the CPU kernels buffer (elements).
constexpr int64_t kMaxStateBlock = 4096;

/// Horizontal max of the lanes (NaN lanes are skipped, as `max` does).
template <class U>
inline float lane_max(U x) {
  float lanes[U::kWidth];
  x.store(lanes);
  float m = lanes[0];
  for (int k = 1; k < U::kWidth; ++k) m = lanes[k] > m ? lanes[k] : m;
  return m;
}

/// uint8 codes through the int8 vector load: c = s + 256 * (s < 0).
template <class U>
inline U load_u8_code(const uint8_t* p) {
  const U s = U::load(reinterpret_cast<const int8_t*>(p));
  return fma(min(sign(s), U(0.f)), U(-256.f), s);
}

/// Integral codes in [0, 255] through the int8 vector store: s = c - 256 * (c > 127).
template <class U>
inline void store_u8_code(U c, uint8_t* p) {
  const U high = max(sign(c - U(127.5f)), U(0.f));
  fma(high, U(-256.f), c).store(reinterpret_cast<int8_t*>(p));
}

template <class U>
inline U dequant_m(U code, float absmax) {
  const U t = code * U(1.f / 127.f);
  return t * abs(t) * U(absmax);
}

template <class U>
inline U dequant_v(U code, float absmax) {
  const U t = code * U(1.f / 255.f);
  const U t2 = t * t;
  return t2 * t2 * U(absmax);
}

/// The nearest code of m for a block whose absmax has the inverse `inv` (0 for an all-zero
/// block). A NaN m gives -127 (max/min return their second operand for NaN).
template <class U>
inline U quant_m(U m, float inv) {
  const U q = round_even(sqrt(abs(m) * U(inv)) * U(127.f)) * sign(m);
  return min(max(q, U(-127.f)), U(127.f));
}

template <class U>
inline U quant_v(U v, float inv) {
  const U q = round_even(sqrt(sqrt(v * U(inv))) * U(255.f));
  return min(max(q, U(0.f)), U(255.f));
}

/// 1 / absmax, or 0 for an all-zero (or non-finite) block: its codes are then 0.
inline float inverse_absmax(float absmax) {
  return absmax > 0.f && absmax <= 3.4028234663852886e38f ? 1.f / absmax : 0.f;
}

/// The stochastic-rounding noise of element `index`: 16 bits of a murmur3-finalised hash.
inline uint32_t sr_noise(int64_t index, uint32_t salt) {
  uint32_t h = static_cast<uint32_t>(index) * 0x9E3779B1u ^
               static_cast<uint32_t>(static_cast<uint64_t>(index) >> 32) * 0x85EBCA77u ^ salt;
  h ^= h >> 16;
  h *= 0x85EBCA6Bu;
  h ^= h >> 13;
  h *= 0xC2B2AE35u;
  h ^= h >> 16;
  return h & 0xFFFFu;
}

/// x rounded to bf16 stochastically: up with probability (dropped bits) / 2^16. NaN and inf keep
/// round-to-nearest (a NaN stays NaN).
inline uint16_t bf16_stochastic(float x, uint32_t noise) {
  uint32_t u;
  std::memcpy(&u, &x, sizeof u);
  if ((u & 0x7F800000u) == 0x7F800000u) return to_bf16(x).bits;
  return static_cast<uint16_t>((u + noise) >> 16);
}

/// Stores the lanes of `x` (elements first_index, first_index + 1, ...) as bf16, stochastically.
template <class U>
inline void store_bf16_stochastic(U x, bf16* p, int64_t first_index, uint32_t salt) {
  float lanes[U::kWidth];
  x.store(lanes);
  for (int k = 0; k < U::kWidth; ++k) {
    p[k].bits = bf16_stochastic(lanes[k], sr_noise(first_index + k, salt));
  }
}

}  // namespace TORCHSPEED_CPU_ISA_NAMESPACE
}  // namespace torchspeed::kernels::cpu
