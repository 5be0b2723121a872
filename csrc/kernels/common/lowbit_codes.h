// The low-bit optimizer-state codes as scalar __host__ __device__ functions: the int8 maps
// (state_dtype "int8") and bf16's stochastic rounding and its hash (state_dtype "bf16"). They are
// the CUDA kernels' element math, the same integer and IEEE-rounded operations as the CPU kernels'
// vector code (kernels/cpu/lowbit_state.h, which documents the maps); tests compare the two bit
// for bit (tests/cpp/test_cuda_math_host.cpp).
//
// Inline code: include it from the op glue, the CUDA kernels and tests, never from a CPU ISA unit.
#pragma once

#include <cstdint>
#include <cstring>

#include "kernels/common/exact_math.h"

namespace torchspeed::kernels {

constexpr uint32_t kLowbitMOffset = (127u << 3) - 127u;  // m: sign + E4M3, code 127 is 1.0
constexpr uint32_t kLowbitVOffset = (127u << 3) - 255u;  // v: unsigned E5M3, code 255 is 1.0

TORCHSPEED_HD uint32_t lowbit_bits(float x) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(x);
#else
  uint32_t u;
  std::memcpy(&u, &x, sizeof u);
  return u;
#endif
}
TORCHSPEED_HD float lowbit_float(uint32_t u) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  float x;
  std::memcpy(&x, &u, sizeof x);
  return x;
#endif
}

/// The value in [0, 1] of a code magnitude k.
TORCHSPEED_HD float lowbit_unit(uint32_t k, uint32_t offset) {
  return k == 0 ? 0.f : lowbit_float((k + offset) << 20);
}

/// The code magnitude of x in [0, 1] (or NaN): bits rounded to 3 mantissa bits, clamped.
TORCHSPEED_HD int32_t lowbit_code(float x, uint32_t offset, int32_t max_code) {
  const uint32_t b = lowbit_bits(x);
  const auto r =
      static_cast<int32_t>((b + 0x7FFFFu + ((b >> 20) & 1u)) >> 20) - static_cast<int32_t>(offset);
  return r < 0 ? 0 : (r > max_code ? max_code : r);
}

TORCHSPEED_HD float lowbit_decode_m(int8_t c, float absmax) {
  const uint32_t k = c < 0 ? static_cast<uint32_t>(-static_cast<int32_t>(c)) : c;
  const uint32_t sign = c < 0 ? 0x80000000u : 0u;
  return f_mul(lowbit_float(lowbit_bits(lowbit_unit(k, kLowbitMOffset)) | sign), absmax);
}

TORCHSPEED_HD float lowbit_decode_v(uint8_t c, float absmax) {
  return f_mul(lowbit_unit(c, kLowbitVOffset), absmax);
}

/// 1 / absmax, or 0 for an all-zero or non-finite block (its codes are then 0).
TORCHSPEED_HD float lowbit_inverse(float absmax) {
  return absmax > 0.f && absmax <= 3.4028234663852886e38f ? f_div(1.f, absmax) : 0.f;
}

TORCHSPEED_HD int8_t lowbit_encode_m(float m, float inv) {
  const float x = f_mul(lowbit_float(lowbit_bits(m) & 0x7FFFFFFFu), inv);
  const int32_t k = lowbit_code(x, kLowbitMOffset, 127);
  return static_cast<int8_t>((lowbit_bits(m) >> 31) ? -k : k);
}

/// As lowbit_encode_m, rounded stochastically on the code grid with 20 bits of noise (the CPU's
/// quant_m_stochastic for one lane; one-moment optimizers' int8 moments): |m| * inv's bits plus
/// the noise, truncated to 3 mantissa bits, clamped. NaN (and inf * 0) gets +-127.
TORCHSPEED_HD int8_t lowbit_encode_m_stochastic(float m, float inv, uint32_t noise20) {
  const float x = f_mul(lowbit_float(lowbit_bits(m) & 0x7FFFFFFFu), inv);
  const auto r =
      static_cast<int32_t>((lowbit_bits(x) + noise20) >> 20) - static_cast<int32_t>(kLowbitMOffset);
  const int32_t k = r < 0 ? 0 : (r > 127 ? 127 : r);
  return static_cast<int8_t>((lowbit_bits(m) >> 31) ? -k : k);
}

TORCHSPEED_HD uint8_t lowbit_encode_v(float v, float inv) {
  const float x = f_mul(v, inv);
  return static_cast<uint8_t>(lowbit_code(x > 0.f ? x : 0.f, kLowbitVOffset, 255));
}

/// The running absmax of a block's first moments: max |m| (NaN skipped; starts at +0).
TORCHSPEED_HD float lowbit_absmax_m(float acc, float m) {
  const float a = lowbit_float(lowbit_bits(m) & 0x7FFFFFFFu);
  return a > acc ? a : acc;
}
/// The running absmax of a block's second moments: max v (NaN and negatives skipped; starts at +0).
TORCHSPEED_HD float lowbit_absmax_v(float acc, float v) { return v > acc ? v : acc; }

// ---- bf16 moments: stochastic rounding ----------------------------------------------------------

/// The stochastic-rounding seed of one param's bf16 moments in one step: its (already incremented)
/// step count and its position in the op's param list.
TORCHSPEED_HD uint32_t lowbit_step_salt(float step, int64_t position) {
  return static_cast<uint32_t>(step) * 0x9E3779B9u + static_cast<uint32_t>(position) * 0x7FEB352Du;
}

/// 32 bits of noise for element `index` of a param (the CPU's sr_range_salt + sr_noise for one
/// lane): murmur3's finaliser of the low 32 bits of the index, salted with the high 32. The first
/// moment takes the high 16 bits, the second the low 16.
TORCHSPEED_HD uint32_t lowbit_sr_noise(int64_t index, uint32_t salt) {
  salt ^= static_cast<uint32_t>(static_cast<uint64_t>(index) >> 32) * 0x85EBCA77u;
  uint32_t h = static_cast<uint32_t>(index) * 0x9E3779B1u ^ salt;
  h ^= h >> 16;
  h *= 0x85EBCA6Bu;
  h ^= h >> 13;
  h *= 0xC2B2AE35u;
  return h ^ (h >> 16);
}

/// The bf16 bits of x rounded stochastically with 16 bits of noise: up with probability
/// (dropped 16 bits) / 2^16. inf stays inf and NaN becomes the quiet 0x7fc0.
TORCHSPEED_HD uint16_t lowbit_bf16_stochastic(float x, uint32_t noise16) {
  const uint32_t u = lowbit_bits(x);
  const uint32_t magnitude = u & 0x7FFFFFFFu;
  if (magnitude > 0x7F800000u) return 0x7FC0u;
  return static_cast<uint16_t>((u + (magnitude < 0x7F800000u ? noise16 : 0u)) >> 16);
}

/// The float32 value of bf16 bits (exact).
TORCHSPEED_HD float lowbit_bf16_value(uint16_t bits) {
  return lowbit_float(static_cast<uint32_t>(bits) << 16);
}

}  // namespace torchspeed::kernels
