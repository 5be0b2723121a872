// Low-bit optimizer moments (state_dtype "int8" and "bf16"), written once over the vector type:
// the int8 block code maps, their dequantize / quantize, and bf16 stochastic rounding.
//
// int8: a moment tensor is cut into blocks of `block` elements (a power of two; the last block of
// a tensor may be shorter), each with one float32 absmax. Each code is an 8-bit float relative to
// its block's absmax (dynamic exponent, as the 8-bit optimizers' maps), so that small values keep
// their relative precision next to a large one in the same block:
//   first moment (signed, int8 c in [-127, 127]):  m = sign(c) * E4M3(|c|) * absmax,
//     |m| / absmax in {0} U [2^-16 * 1.25, 1], 3 mantissa bits (relative step <= 1/8);
//   second moment (unsigned, uint8 c in [0, 255]): v = E5M3(c) * absmax,
//     v / absmax in {0} U [2^-32 * 1.25, 1], 3 mantissa bits.
// Encoding and decoding are a few integer lane operations on the float32 bits (no square root, no
// division, no table), so they stay far under the memory time of the step. Quantizing rounds
// |m| / absmax (as |m| * (1 / absmax)) to the nearest code of its binade, ties to even; values
// below the smallest code round to it or to 0. The absmax element itself is exact (code 127 / 255
// is 1.0). Everything is integer or IEEE-rounded float arithmetic (no contraction): codes are
// bit-identical on every ISA.
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

/// A block's absmax from the vector loop's and the tail's running maxima (neither holds a NaN:
/// `max(x, running)` keeps the running value over a NaN x).
template <class V, class S>
inline float block_max(V vector_max, S tail_max) {
  const float a = vector_max.reduce_max();
  return a > tail_max.v ? a : tail_max.v;
}

/// The int8 maps are 8-bit floats relative to the block's absmax: a code's magnitude k (1..127
/// for m, 1..255 for v) stands for the float32 whose bits are (k + offset) << 20, i.e. an exponent
/// and 3 mantissa bits, and k = 127 (m) or 255 (v) is exactly 1.0; k = 0 is 0.
constexpr uint32_t kMCodeOffset = (127u << 3) - 127u;  // m: sign + E4M3, 2^-16 .. 1
constexpr uint32_t kVCodeOffset = (127u << 3) - 255u;  // v: unsigned E5M3, 2^-32 .. 1

/// The value in [0, 1] of code magnitudes k (int32 lanes).
template <class U>
inline U code_to_unit(typename U::I32 k, uint32_t offset) {
  using I = typename U::I32;
  return U::from_bits(keep_nonzero(k, sll(k + I::from_u32(offset), 20)));
}

/// The code magnitude of x >= 0 (or a NaN with the sign bit clear: take abs after the multiply by
/// 1 / absmax, as inf * 0 gives x86's default NaN, whose sign bit is set) before clamping: x's
/// float32 bits rounded to 3 mantissa bits (nearest, ties to even: the nearest code within x's
/// binade), minus the offset. Below 0 for x under the smallest code, above the largest code for x >
/// 1 and NaN. The offset is folded into the rounding constant and the shift is arithmetic, which is
/// exact: the sum stays within int32 for every such x.
template <class U>
inline typename U::I32 unit_to_code_unclamped(U x, uint32_t offset) {
  using I = typename U::I32;
  const I b = x.to_bits();
  return sra(b + I::from_u32(0x7FFFFu - (offset << 20)) + (srl(b, 20) & I(1)), 20);
}

/// Stores the first moment's int8 codes: magnitudes k (before clamping) clamped to [0, 127], with
/// m's sign (a NaN m keeps its sign bit's).
template <class U>
inline void store_m_codes(typename U::I32 k, U m, int8_t* p) {
  using I = typename U::I32;
  negate_where_negative(min(max(k, I(0)), I(127)), m.to_bits()).store_i8(p);
}

/// First moment from int8 codes: sign(c) * unit(|c|) * absmax.
template <class U>
inline U dequant_m(const int8_t* p, float absmax) {
  using I = typename U::I32;
  const I c = I::load_i8(p);
  const U unit = code_to_unit<U>(abs(c), kMCodeOffset);
  return U::from_bits(unit.to_bits() | (c & I::from_u32(0x80000000u))) * U(absmax);
}

/// Second moment from uint8 codes: unit(c) * absmax.
template <class U>
inline U dequant_v(const uint8_t* p, float absmax) {
  return code_to_unit<U>(U::I32::load_u8(p), kVCodeOffset) * U(absmax);
}

/// Stores the int8 codes of m for a block whose absmax has the inverse `inv` (0 for an all-zero
/// or non-finite block: codes 0). A NaN m gets the code +-127.
template <class U>
inline void quant_m(U m, float inv, int8_t* p) {
  store_m_codes(unit_to_code_unclamped(abs(m * U(inv)), kMCodeOffset), m, p);
}

/// As quant_m, rounded stochastically on the code grid instead of to nearest, given 20 bits of
/// noise per lane: |m| / absmax's float32 bits plus the noise, truncated to 3 mantissa bits, so a
/// value between two codes goes up with probability (distance to the lower code) / (their
/// spacing), within each binade of the grid. Codes are exact where they are (the absmax element
/// stays 127). Not unbiased at the bottom of the grid: code 0 stands for 0, so values below the
/// smallest code's binade (|m| / absmax < 2^-16 * 1.125) always become 0, and those between it and
/// the smallest code round up with probability (x - 1.125) / 0.125 (in units of 2^-16) rather than
/// x / 1.25: a bias below 2^-16 of the block's absmax. For one-moment optimizers whose EMA
/// moves a moment by less than half a code step per step (Lion's beta2 = 0.99: 1 %), where
/// rounding to nearest would freeze it.
template <class U>
inline void quant_m_stochastic(U m, float inv, typename U::I32 noise20, int8_t* p) {
  using I = typename U::I32;
  const I r = srl((abs(m) * U(inv)).to_bits() + noise20, 20);
  store_m_codes(r - I::from_u32(kMCodeOffset), m, p);
}

/// Stores the uint8 codes of v for a block whose absmax has the inverse `inv` (NaN and negative
/// v: 0). The narrowing store clamps the code to [0, 255].
template <class U>
inline void quant_v(U v, float inv, uint8_t* p) {
  unit_to_code_unclamped(max(v * U(inv), U(0.f)), kVCodeOffset).store_u8_saturate(p);
}

/// 1 / absmax, or 0 for an all-zero (or non-finite) block: its codes are then 0.
inline float inverse_absmax(float absmax) {
  return absmax > 0.f && absmax <= 3.4028234663852886e38f ? 1.f / absmax : 0.f;
}

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
/// 16 bits of noise per lane. inf stays inf (its low 16 bits are 0, so the noise never carries)
/// and NaN becomes the quiet 0x7fc0, as to_bf16 does (whatever the noise made of its bits).
template <class U>
inline void store_bf16_stochastic(U x, typename U::I32 noise16, bf16* p) {
  using I = typename U::I32;
  const I u = x.to_bits();
  const I magnitude = u & I::from_u32(0x7FFFFFFFu);
  select(cmpgt(magnitude, I::from_u32(0x7F800000u)), I::from_u32(0x7FC0u), srl(u + noise16, 16))
      .store_u16(reinterpret_cast<uint16_t*>(p));
}

}  // namespace TORCHSPEED_CPU_ISA_NAMESPACE
}  // namespace torchspeed::kernels::cpu
