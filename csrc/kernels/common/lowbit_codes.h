// The int8 optimizer-state codes (state_dtype "int8") as scalar __host__ __device__ functions: the
// CUDA kernels' element math, the same integer and IEEE-rounded operations as the CPU kernels'
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

TORCHSPEED_HD uint8_t lowbit_encode_v(float v, float inv) {
  const float x = f_mul(v, inv);
  return static_cast<uint8_t>(lowbit_code(x > 0.f ? x : 0.f, kLowbitVOffset, 255));
}

}  // namespace torchspeed::kernels
