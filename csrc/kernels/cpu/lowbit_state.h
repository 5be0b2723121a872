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
// Quantizing rounds to the nearest code in the root domain, ties to even: c = round(127 *
// sqrt(|m| * (1 / absmax))) and c = round(255 * sqrt(sqrt(v) * (1 / sqrt(absmax)))), where sqrt(v)
// is the square root the step computes for its denominator. The smallest non-zero values a block keeps
// are 6.2e-5 (m) and 2.3e-10 (v) of its absmax. Every operation is IEEE-rounded (no contraction):
// codes are bit-identical on every ISA and equal to a float32 emulation in torch
// (tests/python/optim/test_lowbit.py).
//
// bf16: moments are bfloat16; the update runs in fp32 and the new moment is written with
// stochastic rounding (16 bits of a counter-based hash of the element's index, the step count and
// the param's position added to the 16 dropped bits), so updates smaller than half a bf16 ulp
// survive on average instead of being rounded away. The hash runs in int32 vector lanes, one per
// element for both moments. Deterministic: the same step on the same state gives the same bits on
// every ISA and thread count.
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
/// block): the root's rounding, then m's sign bit. A NaN m gives -127 (max/min return their
/// second operand for NaN).
template <class U>
inline U quant_m(U m, float inv) {
  using I = typename U::I32;
  const U q = round_even(sqrt(abs(m) * U(inv)) * U(127.f));
  const U signed_q = U::from_bits(q.to_bits() | (m.to_bits() & I::from_u32(0x80000000u)));
  return min(max(signed_q, U(-127.f)), U(127.f));
}

/// The nearest code of v from its square root r = sqrt(v) (the step computes it for the
/// denominator anyway) and inv_root = 1 / sqrt(absmax): c = round(255 * sqrt(r * inv_root)), one
/// square root per element instead of two. A NaN v gives 0.
template <class U>
inline U quant_v(U r, float inv_root) {
  const U q = round_even(sqrt(r * U(inv_root)) * U(255.f));
  return min(max(q, U(0.f)), U(255.f));
}

/// 1 / absmax, or 0 for an all-zero (or non-finite) block: its codes are then 0.
inline float inverse_absmax(float absmax) {
  return absmax > 0.f && absmax <= 3.4028234663852886e38f ? 1.f / absmax : 0.f;
}

/// The second moment's inverse root for quant_v: 1 / sqrt(absmax), or 0 (as inverse_absmax).
inline float inverse_root_absmax(float absmax) { return inverse_absmax(std::sqrt(absmax)); }

/// The salt of a range's stochastic rounding: the step's salt and the high half of the index of
/// the range's first element (ranges start on multiples of 2^16, so they never straddle 2^32).
inline uint32_t sr_range_salt(uint32_t salt, int64_t first_index) {
  return salt ^ static_cast<uint32_t>(static_cast<uint64_t>(first_index) >> 32) * 0x85EBCA77u;
}

/// 32 bits of stochastic-rounding noise per lane for elements index, index + 1, ... (the low 32
/// bits of their indices): a multiply-xorshift hash (murmur3's finaliser) in int32 lanes, so it
/// vectorises. The first moment takes the high 16 bits, the second the low 16.
template <class U>
inline typename U::I32 sr_noise(uint32_t index, uint32_t salt) {
  using I = typename U::I32;
  I h = mullo(I::ramp(static_cast<int32_t>(index)), I::from_u32(0x9E3779B1u)) ^ I::from_u32(salt);
  h = h ^ srl(h, 16);
  h = mullo(h, I::from_u32(0x85EBCA6Bu));
  h = h ^ srl(h, 13);
  h = mullo(h, I::from_u32(0xC2B2AE35u));
  return h ^ srl(h, 16);
}

/// Stores x as bf16, rounded stochastically: up with probability (dropped 16 bits) / 2^16, given
/// 16 bits of noise per lane. inf stays inf and NaN becomes the quiet 0x7fc0, as to_bf16 does.
template <class U>
inline void store_bf16_stochastic(U x, typename U::I32 noise16, bf16* p) {
  using I = typename U::I32;
  const I u = x.to_bits();
  const I magnitude = u & I::from_u32(0x7FFFFFFFu);
  const I inf = I::from_u32(0x7F800000u);
  const I rounded = srl(u + (noise16 & cmpgt(inf, magnitude)), 16);
  select(cmpgt(magnitude, inf), I::from_u32(0x7FC0u), rounded)
      .store_u16(reinterpret_cast<uint16_t*>(p));
}

}  // namespace TORCHSPEED_CPU_ISA_NAMESPACE
}  // namespace torchspeed::kernels::cpu
