// SIMD vectors of float lanes and of int32 lanes (`V::I32`), one specialisation per ISA; every CPU
// kernel template is written against this interface and instantiated once per ISA in its own
// translation unit.
//
// Torch-free on purpose: the ISA translation units are compiled with -mavx2/-mavx512f, and any
// inline function they share with the rest of the library could be emitted with those
// instructions and picked by the linker for every caller (an ODR trap that crashes older CPUs).
// So the kernel layer includes only this header, <cmath>, <cstdint> and <cstring>, and lives in a
// per-ISA namespace (TORCHSPEED_CPU_ISA_NAMESPACE, set by the build for each unit).
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

#if defined(__AVX2__) || defined(__AVX512F__)
#include <immintrin.h>
#endif

#include "kernels/cpu/types.h"

#ifndef TORCHSPEED_CPU_ISA_NAMESPACE
#error "kernels/cpu/vec.h: define TORCHSPEED_CPU_ISA_NAMESPACE (the build does, per ISA unit)"
#endif

namespace torchspeed::kernels::cpu {
namespace TORCHSPEED_CPU_ISA_NAMESPACE {

inline float bits_to_float(uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}
inline uint32_t float_to_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
}

// bf16: the top half of an fp32; rounding to nearest even, NaN kept quiet (as c10::BFloat16).
inline float to_float(bf16 x) { return bits_to_float(static_cast<uint32_t>(x.bits) << 16); }
inline bf16 to_bf16(float f) {
  if (std::isnan(f)) return bf16{0x7fc0};
  const uint32_t u = float_to_bits(f);
  const uint32_t rounding_bias = 0x7fffu + ((u >> 16) & 1u);
  return bf16{static_cast<uint16_t>((u + rounding_bias) >> 16)};
}

// IEEE half <-> float in portable bit arithmetic (the scalar ISA may not use F16C).
inline float to_float(fp16 h) {
  const uint32_t sign = static_cast<uint32_t>(h.bits & 0x8000u) << 16;
  const uint32_t exp = (h.bits >> 10) & 0x1fu;
  uint32_t mant = h.bits & 0x3ffu;
  if (exp == 0x1f) return bits_to_float(sign | 0x7f800000u | (mant << 13));  // inf / NaN
  if (exp != 0) return bits_to_float(sign | ((exp + 112u) << 23) | (mant << 13));
  if (mant == 0) return bits_to_float(sign);  // signed zero
  // Subnormal half: normalise into an fp32 normal.
  int e = -1;
  do {
    mant <<= 1;
    ++e;
  } while ((mant & 0x400u) == 0);
  return bits_to_float(sign | static_cast<uint32_t>(112 - e) << 23 | ((mant & 0x3ffu) << 13));
}
inline fp16 to_fp16(float f) {
  const uint32_t u = float_to_bits(f);
  const uint16_t sign = static_cast<uint16_t>((u >> 16) & 0x8000u);
  const uint32_t abs = u & 0x7fffffffu;
  if (abs > 0x7f800000u) return fp16{static_cast<uint16_t>(sign | 0x7e00u)};   // NaN
  if (abs >= 0x477ff000u) return fp16{static_cast<uint16_t>(sign | 0x7c00u)};  // overflow -> inf
  if (abs < 0x38800000u) {
    // Result is a half subnormal (or zero): scale so the mantissa lands in the low bits and let
    // the float adder round to nearest even.
    const float magic = bits_to_float(0x3f000000u);  // 0.5: 2^-1, shifts subnormals into place
    const float scaled = bits_to_float(abs) + magic;
    return fp16{static_cast<uint16_t>(sign | (float_to_bits(scaled) - float_to_bits(magic)))};
  }
  const uint32_t mant_odd = (abs >> 13) & 1u;
  const uint32_t rounded = abs + 0xc8000fffu + mant_odd;  // rebias exponent (-112 << 23) + RNE
  return fp16{static_cast<uint16_t>(sign | (rounded >> 13))};
}

inline float to_float(float x) { return x; }
inline double to_float(double x) { return x; }
inline float to_float(int8_t x) { return static_cast<float>(x); }
inline float to_float(uint8_t x) { return static_cast<float>(x); }

template <typename T>
inline T from_float(float f);
template <>
inline float from_float<float>(float f) {
  return f;
}
template <>
inline bf16 from_float<bf16>(float f) {
  return to_bf16(f);
}
template <>
inline fp16 from_float<fp16>(float f) {
  return to_fp16(f);
}
/// int8 from a value already rounded and clamped to [-128, 127] (the quantizer's last step).
template <>
inline int8_t from_float<int8_t>(float f) {
  return static_cast<int8_t>(static_cast<int32_t>(f));
}
/// uint8 from a value already rounded and clamped to [0, 255].
template <>
inline uint8_t from_float<uint8_t>(float f) {
  return static_cast<uint8_t>(static_cast<int32_t>(f));
}

// ---- int32 lanes: exact fixed-point arithmetic and bit manipulation ----------------------------
// load_u8 widens kWidth bytes; + and * wrap like int32 SIMD (callers keep sums in range); sra is
// an arithmetic right shift; store_u8_saturate clamps each lane to [0, 255] and narrows.
// Bit work (hashes, float bit patterns): mullo multiplies modulo 2^32, srl/sll shift logically,
// ^ & | andnot act on bits, abs/min/max are signed, cmpeq/cmpgt give all-ones lanes where true
// (signed compare), select picks by such a mask, ramp(x) holds x, x + 1, ... (lane order),
// store_u16 narrows each lane's low 16 bits. keep_nonzero(k, x) is x where k != 0 and 0 elsewhere;
// negate_where_negative(k, s) is -k where s < 0 and k elsewhere (one or two instructions each,
// where the mask spelling took three).

/// One int32 lane: the scalar ISA, and the tail of every integer vector loop.
struct ScalarVecI32 {
  static constexpr int kWidth = 1;
  int32_t v;
  ScalarVecI32() = default;
  explicit ScalarVecI32(int32_t x) : v(x) {}
  static ScalarVecI32 load_u8(const uint8_t* p) { return ScalarVecI32(p[0]); }
  friend ScalarVecI32 operator+(ScalarVecI32 a, ScalarVecI32 b) { return from_u32(a.u() + b.u()); }
  friend ScalarVecI32 operator-(ScalarVecI32 a, ScalarVecI32 b) { return from_u32(a.u() - b.u()); }
  friend ScalarVecI32 operator*(ScalarVecI32 a, ScalarVecI32 b) { return from_u32(a.u() * b.u()); }
  static ScalarVecI32 load_i8(const int8_t* p) { return ScalarVecI32(p[0]); }
  friend ScalarVecI32 abs(ScalarVecI32 a) { return a.v < 0 ? from_u32(0u - a.u()) : a; }
  friend ScalarVecI32 min(ScalarVecI32 a, ScalarVecI32 b) { return a.v < b.v ? a : b; }
  friend ScalarVecI32 max(ScalarVecI32 a, ScalarVecI32 b) { return a.v > b.v ? a : b; }
  /// Lanes already in [-128, 127], narrowed to int8.
  void store_i8(int8_t* p) const { p[0] = static_cast<int8_t>(v); }
  friend ScalarVecI32 sra(ScalarVecI32 a, int bits) { return ScalarVecI32(a.v >> bits); }
  void store_u8_saturate(uint8_t* p) const {
    p[0] = static_cast<uint8_t>(v < 0 ? 0 : (v > 255 ? 255 : v));
  }
  static ScalarVecI32 ramp(int32_t x) { return ScalarVecI32(x); }
  static ScalarVecI32 from_u32(uint32_t x) { return ScalarVecI32(static_cast<int32_t>(x)); }
  uint32_t u() const { return static_cast<uint32_t>(v); }
  friend ScalarVecI32 mullo(ScalarVecI32 a, ScalarVecI32 b) { return from_u32(a.u() * b.u()); }
  friend ScalarVecI32 operator^(ScalarVecI32 a, ScalarVecI32 b) { return from_u32(a.u() ^ b.u()); }
  friend ScalarVecI32 operator&(ScalarVecI32 a, ScalarVecI32 b) { return from_u32(a.u() & b.u()); }
  friend ScalarVecI32 operator|(ScalarVecI32 a, ScalarVecI32 b) { return from_u32(a.u() | b.u()); }
  friend ScalarVecI32 andnot(ScalarVecI32 a, ScalarVecI32 b) { return from_u32(~a.u() & b.u()); }
  friend ScalarVecI32 srl(ScalarVecI32 a, int bits) { return from_u32(a.u() >> bits); }
  friend ScalarVecI32 sll(ScalarVecI32 a, int bits) { return from_u32(a.u() << bits); }
  friend ScalarVecI32 cmpeq(ScalarVecI32 a, ScalarVecI32 b) {
    return from_u32(a.v == b.v ? ~0u : 0u);
  }
  friend ScalarVecI32 cmpgt(ScalarVecI32 a, ScalarVecI32 b) {
    return from_u32(a.v > b.v ? ~0u : 0u);
  }
  friend ScalarVecI32 select(ScalarVecI32 mask, ScalarVecI32 a, ScalarVecI32 b) {
    return mask.v ? a : b;
  }
  void store_u16(uint16_t* p) const { p[0] = static_cast<uint16_t>(u()); }
  friend ScalarVecI32 keep_nonzero(ScalarVecI32 k, ScalarVecI32 x) {
    return k.v != 0 ? x : ScalarVecI32(0);
  }
  friend ScalarVecI32 negate_where_negative(ScalarVecI32 k, ScalarVecI32 s) {
    return s.v < 0 ? from_u32(0u - k.u()) : k;
  }
};

#if defined(__AVX2__)
/// 8 int32 lanes (AVX2).
struct VecAvx2I32 {
  static constexpr int kWidth = 8;
  __m256i v;
  VecAvx2I32() = default;
  explicit VecAvx2I32(int32_t x) : v(_mm256_set1_epi32(x)) {}
  explicit VecAvx2I32(__m256i x) : v(x) {}
  static VecAvx2I32 load_u8(const uint8_t* p) {
    return VecAvx2I32(_mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p))));
  }
  friend VecAvx2I32 operator+(VecAvx2I32 a, VecAvx2I32 b) {
    return VecAvx2I32(_mm256_add_epi32(a.v, b.v));
  }
  friend VecAvx2I32 operator*(VecAvx2I32 a, VecAvx2I32 b) {
    return VecAvx2I32(_mm256_mullo_epi32(a.v, b.v));
  }
  friend VecAvx2I32 operator-(VecAvx2I32 a, VecAvx2I32 b) {
    return VecAvx2I32(_mm256_sub_epi32(a.v, b.v));
  }
  static VecAvx2I32 load_i8(const int8_t* p) {
    return VecAvx2I32(_mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p))));
  }
  friend VecAvx2I32 abs(VecAvx2I32 a) { return VecAvx2I32(_mm256_abs_epi32(a.v)); }
  friend VecAvx2I32 min(VecAvx2I32 a, VecAvx2I32 b) {
    return VecAvx2I32(_mm256_min_epi32(a.v, b.v));
  }
  friend VecAvx2I32 max(VecAvx2I32 a, VecAvx2I32 b) {
    return VecAvx2I32(_mm256_max_epi32(a.v, b.v));
  }
  /// Lanes already in [-128, 127], narrowed to int8.
  void store_i8(int8_t* p) const {
    const __m128i w = _mm_packs_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    _mm_storel_epi64(reinterpret_cast<__m128i*>(p), _mm_packs_epi16(w, w));
  }
  friend VecAvx2I32 sra(VecAvx2I32 a, int bits) {
    return VecAvx2I32(_mm256_sra_epi32(a.v, _mm_cvtsi32_si128(bits)));
  }
  void store_u8_saturate(uint8_t* p) const {
    const __m128i w = _mm_packs_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    _mm_storel_epi64(reinterpret_cast<__m128i*>(p), _mm_packus_epi16(w, w));
  }
  static VecAvx2I32 ramp(int32_t x) {
    return VecAvx2I32(
        _mm256_add_epi32(_mm256_set1_epi32(x), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7)));
  }
  static VecAvx2I32 from_u32(uint32_t x) { return VecAvx2I32(static_cast<int32_t>(x)); }
  friend VecAvx2I32 mullo(VecAvx2I32 a, VecAvx2I32 b) {
    return VecAvx2I32(_mm256_mullo_epi32(a.v, b.v));
  }
  friend VecAvx2I32 operator^(VecAvx2I32 a, VecAvx2I32 b) {
    return VecAvx2I32(_mm256_xor_si256(a.v, b.v));
  }
  friend VecAvx2I32 operator&(VecAvx2I32 a, VecAvx2I32 b) {
    return VecAvx2I32(_mm256_and_si256(a.v, b.v));
  }
  friend VecAvx2I32 operator|(VecAvx2I32 a, VecAvx2I32 b) {
    return VecAvx2I32(_mm256_or_si256(a.v, b.v));
  }
  friend VecAvx2I32 andnot(VecAvx2I32 a, VecAvx2I32 b) {
    return VecAvx2I32(_mm256_andnot_si256(a.v, b.v));
  }
  friend VecAvx2I32 srl(VecAvx2I32 a, int bits) {
    return VecAvx2I32(_mm256_srl_epi32(a.v, _mm_cvtsi32_si128(bits)));
  }
  friend VecAvx2I32 sll(VecAvx2I32 a, int bits) {
    return VecAvx2I32(_mm256_sll_epi32(a.v, _mm_cvtsi32_si128(bits)));
  }
  friend VecAvx2I32 cmpeq(VecAvx2I32 a, VecAvx2I32 b) {
    return VecAvx2I32(_mm256_cmpeq_epi32(a.v, b.v));
  }
  friend VecAvx2I32 cmpgt(VecAvx2I32 a, VecAvx2I32 b) {
    return VecAvx2I32(_mm256_cmpgt_epi32(a.v, b.v));
  }
  friend VecAvx2I32 select(VecAvx2I32 mask, VecAvx2I32 a, VecAvx2I32 b) {
    return VecAvx2I32(_mm256_blendv_epi8(b.v, a.v, mask.v));
  }
  /// Lanes' low 16 bits (each lane must hold a value in [0, 65535]).
  void store_u16(uint16_t* p) const {
    const __m128i w = _mm_packus_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(p), w);
  }
  friend VecAvx2I32 keep_nonzero(VecAvx2I32 k, VecAvx2I32 x) {
    return VecAvx2I32(_mm256_andnot_si256(_mm256_cmpeq_epi32(k.v, _mm256_setzero_si256()), x.v));
  }
  friend VecAvx2I32 negate_where_negative(VecAvx2I32 k, VecAvx2I32 s) {
    // psignd negates where s < 0 and zeroes where s == 0: s | 1 is never 0 and keeps s's sign.
    return VecAvx2I32(_mm256_sign_epi32(k.v, _mm256_or_si256(s.v, _mm256_set1_epi32(1))));
  }
};
#endif

#if defined(__AVX512F__)
/// 16 int32 lanes (AVX-512 F).
struct VecAvx512I32 {
  static constexpr int kWidth = 16;
  __m512i v;
  VecAvx512I32() = default;
  explicit VecAvx512I32(int32_t x) : v(_mm512_set1_epi32(x)) {}
  explicit VecAvx512I32(__m512i x) : v(x) {}
  static VecAvx512I32 load_u8(const uint8_t* p) {
    return VecAvx512I32(_mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))));
  }
  friend VecAvx512I32 operator+(VecAvx512I32 a, VecAvx512I32 b) {
    return VecAvx512I32(_mm512_add_epi32(a.v, b.v));
  }
  friend VecAvx512I32 operator*(VecAvx512I32 a, VecAvx512I32 b) {
    return VecAvx512I32(_mm512_mullo_epi32(a.v, b.v));
  }
  friend VecAvx512I32 operator-(VecAvx512I32 a, VecAvx512I32 b) {
    return VecAvx512I32(_mm512_sub_epi32(a.v, b.v));
  }
  static VecAvx512I32 load_i8(const int8_t* p) {
    return VecAvx512I32(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))));
  }
  friend VecAvx512I32 abs(VecAvx512I32 a) { return VecAvx512I32(_mm512_abs_epi32(a.v)); }
  friend VecAvx512I32 min(VecAvx512I32 a, VecAvx512I32 b) {
    return VecAvx512I32(_mm512_min_epi32(a.v, b.v));
  }
  friend VecAvx512I32 max(VecAvx512I32 a, VecAvx512I32 b) {
    return VecAvx512I32(_mm512_max_epi32(a.v, b.v));
  }
  /// Lanes already in [-128, 127], narrowed to int8.
  void store_i8(int8_t* p) const {
    _mm_storeu_si128(reinterpret_cast<__m128i*>(p), _mm512_cvtsepi32_epi8(v));
  }
  friend VecAvx512I32 sra(VecAvx512I32 a, int bits) {
    return VecAvx512I32(_mm512_sra_epi32(a.v, _mm_cvtsi32_si128(bits)));
  }
  void store_u8_saturate(uint8_t* p) const {
    // Negative lanes to 0 first: the narrowing saturates as unsigned.
    const __m512i c = _mm512_max_epi32(v, _mm512_setzero_si512());
    _mm_storeu_si128(reinterpret_cast<__m128i*>(p), _mm512_cvtusepi32_epi8(c));
  }
  static VecAvx512I32 ramp(int32_t x) {
    return VecAvx512I32(
        _mm512_add_epi32(_mm512_set1_epi32(x),
                         _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15)));
  }
  static VecAvx512I32 from_u32(uint32_t x) { return VecAvx512I32(static_cast<int32_t>(x)); }
  friend VecAvx512I32 mullo(VecAvx512I32 a, VecAvx512I32 b) {
    return VecAvx512I32(_mm512_mullo_epi32(a.v, b.v));
  }
  friend VecAvx512I32 operator^(VecAvx512I32 a, VecAvx512I32 b) {
    return VecAvx512I32(_mm512_xor_si512(a.v, b.v));
  }
  friend VecAvx512I32 operator&(VecAvx512I32 a, VecAvx512I32 b) {
    return VecAvx512I32(_mm512_and_si512(a.v, b.v));
  }
  friend VecAvx512I32 operator|(VecAvx512I32 a, VecAvx512I32 b) {
    return VecAvx512I32(_mm512_or_si512(a.v, b.v));
  }
  friend VecAvx512I32 andnot(VecAvx512I32 a, VecAvx512I32 b) {
    return VecAvx512I32(_mm512_andnot_si512(a.v, b.v));
  }
  friend VecAvx512I32 srl(VecAvx512I32 a, int bits) {
    return VecAvx512I32(_mm512_srl_epi32(a.v, _mm_cvtsi32_si128(bits)));
  }
  friend VecAvx512I32 sll(VecAvx512I32 a, int bits) {
    return VecAvx512I32(_mm512_sll_epi32(a.v, _mm_cvtsi32_si128(bits)));
  }
  friend VecAvx512I32 cmpeq(VecAvx512I32 a, VecAvx512I32 b) {
    return VecAvx512I32(_mm512_movm_epi32(_mm512_cmpeq_epi32_mask(a.v, b.v)));
  }
  friend VecAvx512I32 cmpgt(VecAvx512I32 a, VecAvx512I32 b) {
    return VecAvx512I32(_mm512_movm_epi32(_mm512_cmpgt_epi32_mask(a.v, b.v)));
  }
  friend VecAvx512I32 select(VecAvx512I32 mask, VecAvx512I32 a, VecAvx512I32 b) {
    return VecAvx512I32(_mm512_mask_mov_epi32(b.v, _mm512_movepi32_mask(mask.v), a.v));
  }
  /// Lanes' low 16 bits (each lane must hold a value in [0, 65535]).
  void store_u16(uint16_t* p) const {
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), _mm512_cvtepi32_epi16(v));
  }
  friend VecAvx512I32 keep_nonzero(VecAvx512I32 k, VecAvx512I32 x) {
    return VecAvx512I32(_mm512_maskz_mov_epi32(_mm512_test_epi32_mask(k.v, k.v), x.v));
  }
  friend VecAvx512I32 negate_where_negative(VecAvx512I32 k, VecAvx512I32 s) {
    return VecAvx512I32(
        _mm512_mask_sub_epi32(k.v, _mm512_movepi32_mask(s.v), _mm512_setzero_si512(), k.v));
  }
};
#endif

/// Scalar "vector" of one lane, over float or double. The tail of every vector loop and the whole
/// scalar ISA use it, so the tail computes exactly what the vector body computes per lane.
template <typename F>
struct ScalarVec {
  using Scalar = ScalarVec<F>;
  using I32 = ScalarVecI32;
  static constexpr int kWidth = 1;
  F v;
  ScalarVec() = default;
  explicit ScalarVec(F x) : v(x) {}
  template <typename T>
  static ScalarVec load(const T* p) {
    return ScalarVec(static_cast<F>(to_float(*p)));
  }
  static ScalarVec load(const double* p) { return ScalarVec(static_cast<F>(*p)); }
  template <typename T>
  void store(T* p) const {
    *p = from_float<T>(static_cast<float>(v));
  }
  void store(double* p) const { *p = static_cast<double>(v); }
  friend ScalarVec operator+(ScalarVec a, ScalarVec b) { return ScalarVec(a.v + b.v); }
  friend ScalarVec operator-(ScalarVec a, ScalarVec b) { return ScalarVec(a.v - b.v); }
  friend ScalarVec operator*(ScalarVec a, ScalarVec b) { return ScalarVec(a.v * b.v); }
  friend ScalarVec operator/(ScalarVec a, ScalarVec b) { return ScalarVec(a.v / b.v); }
  friend ScalarVec operator-(ScalarVec a) { return ScalarVec(-a.v); }
  /// a * b + c, fused (one rounding), like the vector ISAs' fma.
  friend ScalarVec fma(ScalarVec a, ScalarVec b, ScalarVec c) {
    return ScalarVec(std::fma(a.v, b.v, c.v));
  }
  friend ScalarVec sqrt(ScalarVec a) { return ScalarVec(std::sqrt(a.v)); }
  friend ScalarVec abs(ScalarVec a) { return ScalarVec(std::fabs(a.v)); }
  /// (a > b) ? a : b, in every ISA: when either is NaN the result is `b` (unlike std::fmax,
  /// which returns the other operand); callers that must see NaN check for it separately.
  friend ScalarVec max(ScalarVec a, ScalarVec b) { return ScalarVec(a.v > b.v ? a.v : b.v); }
  /// (a < b) ? a : b, in every ISA (NaN: `b`, as max).
  friend ScalarVec min(ScalarVec a, ScalarVec b) { return ScalarVec(a.v < b.v ? a.v : b.v); }
  /// Round to the nearest integer, ties to even (torch.round), in the default FP environment.
  friend ScalarVec round_even(ScalarVec a) { return ScalarVec(std::nearbyint(a.v)); }
  /// +1, -1 or 0 (sign(0) = 0, as torch.sign).
  friend ScalarVec sign(ScalarVec a) { return ScalarVec(static_cast<F>((a.v > 0) - (a.v < 0))); }
  /// Keep `a` where mask_src != 0, else 0 (pruning masks): the mask is a {0,1} value.
  friend ScalarVec select_nonzero(ScalarVec mask_src, ScalarVec a) {
    return ScalarVec(mask_src.v != F(0) ? a.v : F(0));
  }
  double reduce_add() const { return static_cast<double>(v); }
  /// The largest lane. Lanes must not be NaN (a running `max` never takes one in): then every
  /// order of the comparisons gives the same value, and the vector types use a tree.
  F reduce_max() const { return v; }
  /// The lanes' IEEE bit patterns (float lanes only), and back.
  I32 to_bits() const { return I32::from_u32(float_to_bits(static_cast<float>(v))); }
  static ScalarVec from_bits(I32 b) { return ScalarVec(static_cast<F>(bits_to_float(b.u()))); }
};

#if defined(__AVX2__)
/// 8 fp32 lanes (AVX2 + FMA + F16C).
struct VecAvx2 {
  using Scalar = ScalarVec<float>;  // the tail loops' type
  using I32 = VecAvx2I32;
  static constexpr int kWidth = 8;
  __m256 v;
  VecAvx2() = default;
  explicit VecAvx2(float x) : v(_mm256_set1_ps(x)) {}
  explicit VecAvx2(__m256 x) : v(x) {}
  static VecAvx2 load(const float* p) { return VecAvx2(_mm256_loadu_ps(p)); }
  static VecAvx2 load(const bf16* p) {
    const __m256i w = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
    return VecAvx2(_mm256_castsi256_ps(_mm256_slli_epi32(w, 16)));
  }
  static VecAvx2 load(const fp16* p) {
    return VecAvx2(_mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))));
  }
  void store(float* p) const { _mm256_storeu_ps(p, v); }
  void store(bf16* p) const {
    const __m256i u = _mm256_castps_si256(v);
    const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
    __m256i r = _mm256_add_epi32(u, _mm256_add_epi32(_mm256_set1_epi32(0x7fff), lsb));
    r = _mm256_srli_epi32(r, 16);
    const __m256i nan = _mm256_castps_si256(_mm256_cmp_ps(v, v, _CMP_UNORD_Q));
    r = _mm256_blendv_epi8(r, _mm256_set1_epi32(0x7fc0), nan);
    const __m128i packed =
        _mm_packus_epi32(_mm256_castsi256_si128(r), _mm256_extracti128_si256(r, 1));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(p), packed);
  }
  void store(fp16* p) const {
    _mm_storeu_si128(reinterpret_cast<__m128i*>(p), _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT));
  }
  I32 to_bits() const { return I32(_mm256_castps_si256(v)); }
  static VecAvx2 from_bits(I32 b) { return VecAvx2(_mm256_castsi256_ps(b.v)); }
  static VecAvx2 load(const uint8_t* p) {
    const __m128i b = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(p));
    return VecAvx2(_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(b)));
  }
  /// Lanes already rounded and clamped to [0, 255]: exact conversion, then narrowing.
  void store(uint8_t* p) const {
    const __m256i i = _mm256_cvtps_epi32(v);
    const __m128i w = _mm_packs_epi32(_mm256_castsi256_si128(i), _mm256_extracti128_si256(i, 1));
    _mm_storel_epi64(reinterpret_cast<__m128i*>(p), _mm_packus_epi16(w, w));
  }
  static VecAvx2 load(const int8_t* p) {
    const __m128i b = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(p));
    return VecAvx2(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(b)));
  }
  /// Lanes already rounded and clamped to [-128, 127]: exact conversion, then narrowing.
  void store(int8_t* p) const {
    const __m256i i = _mm256_cvtps_epi32(v);
    const __m128i w = _mm_packs_epi32(_mm256_castsi256_si128(i), _mm256_extracti128_si256(i, 1));
    _mm_storel_epi64(reinterpret_cast<__m128i*>(p), _mm_packs_epi16(w, w));
  }
  friend VecAvx2 operator+(VecAvx2 a, VecAvx2 b) { return VecAvx2(_mm256_add_ps(a.v, b.v)); }
  friend VecAvx2 operator-(VecAvx2 a, VecAvx2 b) { return VecAvx2(_mm256_sub_ps(a.v, b.v)); }
  friend VecAvx2 operator*(VecAvx2 a, VecAvx2 b) { return VecAvx2(_mm256_mul_ps(a.v, b.v)); }
  friend VecAvx2 operator/(VecAvx2 a, VecAvx2 b) { return VecAvx2(_mm256_div_ps(a.v, b.v)); }
  friend VecAvx2 operator-(VecAvx2 a) { return VecAvx2(_mm256_xor_ps(a.v, _mm256_set1_ps(-0.f))); }
  friend VecAvx2 fma(VecAvx2 a, VecAvx2 b, VecAvx2 c) {
    return VecAvx2(_mm256_fmadd_ps(a.v, b.v, c.v));
  }
  friend VecAvx2 sqrt(VecAvx2 a) { return VecAvx2(_mm256_sqrt_ps(a.v)); }
  friend VecAvx2 abs(VecAvx2 a) { return VecAvx2(_mm256_andnot_ps(_mm256_set1_ps(-0.f), a.v)); }
  // maxps / minps are (a > b) ? a : b and (a < b) ? a : b exactly, as ScalarVec's max and min:
  // the second operand when either is NaN and when both are zeros of either sign.
  friend VecAvx2 max(VecAvx2 a, VecAvx2 b) { return VecAvx2(_mm256_max_ps(a.v, b.v)); }
  friend VecAvx2 min(VecAvx2 a, VecAvx2 b) { return VecAvx2(_mm256_min_ps(a.v, b.v)); }
  friend VecAvx2 round_even(VecAvx2 a) {
    return VecAvx2(_mm256_round_ps(a.v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
  }
  friend VecAvx2 sign(VecAvx2 a) {
    const __m256 zero = _mm256_setzero_ps();
    const __m256 pos = _mm256_and_ps(_mm256_cmp_ps(a.v, zero, _CMP_GT_OQ), _mm256_set1_ps(1.f));
    const __m256 neg = _mm256_and_ps(_mm256_cmp_ps(a.v, zero, _CMP_LT_OQ), _mm256_set1_ps(1.f));
    return VecAvx2(_mm256_sub_ps(pos, neg));
  }
  friend VecAvx2 select_nonzero(VecAvx2 mask_src, VecAvx2 a) {
    const __m256 keep = _mm256_cmp_ps(mask_src.v, _mm256_setzero_ps(), _CMP_NEQ_UQ);
    return VecAvx2(_mm256_and_ps(keep, a.v));
  }
  float reduce_max() const {
    __m128 m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    m = _mm_max_ps(m, _mm_movehl_ps(m, m));
    return _mm_cvtss_f32(_mm_max_ss(m, _mm_movehdup_ps(m)));
  }
  double reduce_add() const {
    alignas(32) float lanes[8];
    _mm256_store_ps(lanes, v);
    double s = 0;
    for (float x : lanes) s += x;
    return s;
  }
};
#endif

#if defined(__AVX512F__)
/// 16 fp32 lanes (AVX-512 F/BW/VL/DQ).
struct VecAvx512 {
  using Scalar = ScalarVec<float>;  // the tail loops' type
  using I32 = VecAvx512I32;
  static constexpr int kWidth = 16;
  __m512 v;
  VecAvx512() = default;
  explicit VecAvx512(float x) : v(_mm512_set1_ps(x)) {}
  explicit VecAvx512(__m512 x) : v(x) {}
  static VecAvx512 load(const float* p) { return VecAvx512(_mm512_loadu_ps(p)); }
  static VecAvx512 load(const bf16* p) {
    const __m512i w =
        _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
    return VecAvx512(_mm512_castsi512_ps(_mm512_slli_epi32(w, 16)));
  }
  static VecAvx512 load(const fp16* p) {
    return VecAvx512(_mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p))));
  }
  void store(float* p) const { _mm512_storeu_ps(p, v); }
  void store(bf16* p) const {
    const __m512i u = _mm512_castps_si512(v);
    const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
    __m512i r = _mm512_add_epi32(u, _mm512_add_epi32(_mm512_set1_epi32(0x7fff), lsb));
    r = _mm512_srli_epi32(r, 16);
    const __mmask16 nan = _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
    r = _mm512_mask_mov_epi32(r, nan, _mm512_set1_epi32(0x7fc0));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), _mm512_cvtepi32_epi16(r));
  }
  void store(fp16* p) const {
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(p),
                        _mm512_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT));
  }
  I32 to_bits() const { return I32(_mm512_castps_si512(v)); }
  static VecAvx512 from_bits(I32 b) { return VecAvx512(_mm512_castsi512_ps(b.v)); }
  static VecAvx512 load(const uint8_t* p) {
    const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
    return VecAvx512(_mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(b)));
  }
  /// Lanes already rounded and clamped to [0, 255]: exact conversion, then narrowing.
  void store(uint8_t* p) const {
    _mm_storeu_si128(reinterpret_cast<__m128i*>(p), _mm512_cvtusepi32_epi8(_mm512_cvtps_epi32(v)));
  }
  static VecAvx512 load(const int8_t* p) {
    const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
    return VecAvx512(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(b)));
  }
  /// Lanes already rounded and clamped to [-128, 127]: exact conversion, then narrowing.
  void store(int8_t* p) const {
    _mm_storeu_si128(reinterpret_cast<__m128i*>(p), _mm512_cvtsepi32_epi8(_mm512_cvtps_epi32(v)));
  }
  friend VecAvx512 operator+(VecAvx512 a, VecAvx512 b) {
    return VecAvx512(_mm512_add_ps(a.v, b.v));
  }
  friend VecAvx512 operator-(VecAvx512 a, VecAvx512 b) {
    return VecAvx512(_mm512_sub_ps(a.v, b.v));
  }
  friend VecAvx512 operator*(VecAvx512 a, VecAvx512 b) {
    return VecAvx512(_mm512_mul_ps(a.v, b.v));
  }
  friend VecAvx512 operator/(VecAvx512 a, VecAvx512 b) {
    return VecAvx512(_mm512_div_ps(a.v, b.v));
  }
  friend VecAvx512 operator-(VecAvx512 a) {
    return VecAvx512(_mm512_castsi512_ps(
        _mm512_xor_si512(_mm512_castps_si512(a.v), _mm512_set1_epi32(INT32_MIN))));
  }
  friend VecAvx512 fma(VecAvx512 a, VecAvx512 b, VecAvx512 c) {
    return VecAvx512(_mm512_fmadd_ps(a.v, b.v, c.v));
  }
  friend VecAvx512 sqrt(VecAvx512 a) { return VecAvx512(_mm512_sqrt_ps(a.v)); }
  friend VecAvx512 abs(VecAvx512 a) { return VecAvx512(_mm512_abs_ps(a.v)); }
  // As VecAvx2's: maxps / minps are the ternaries exactly.
  friend VecAvx512 max(VecAvx512 a, VecAvx512 b) { return VecAvx512(_mm512_max_ps(a.v, b.v)); }
  friend VecAvx512 min(VecAvx512 a, VecAvx512 b) { return VecAvx512(_mm512_min_ps(a.v, b.v)); }
  friend VecAvx512 round_even(VecAvx512 a) {
    return VecAvx512(_mm512_roundscale_ps(a.v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
  }
  friend VecAvx512 sign(VecAvx512 a) {
    const __m512 zero = _mm512_setzero_ps();
    const __m512 one = _mm512_set1_ps(1.f);
    const __m512 pos = _mm512_maskz_mov_ps(_mm512_cmp_ps_mask(a.v, zero, _CMP_GT_OQ), one);
    const __m512 neg = _mm512_maskz_mov_ps(_mm512_cmp_ps_mask(a.v, zero, _CMP_LT_OQ), one);
    return VecAvx512(_mm512_sub_ps(pos, neg));
  }
  friend VecAvx512 select_nonzero(VecAvx512 mask_src, VecAvx512 a) {
    return VecAvx512(
        _mm512_maskz_mov_ps(_mm512_cmp_ps_mask(mask_src.v, _mm512_setzero_ps(), _CMP_NEQ_UQ), a.v));
  }
  float reduce_max() const { return _mm512_reduce_max_ps(v); }
  double reduce_add() const {
    alignas(64) float lanes[16];
    _mm512_store_ps(lanes, v);
    double s = 0;
    for (float x : lanes) s += x;
    return s;
  }
};
#endif

}  // namespace TORCHSPEED_CPU_ISA_NAMESPACE
}  // namespace torchspeed::kernels::cpu
