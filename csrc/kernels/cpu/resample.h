// The image resampler's two passes (torchspeed.data's Resize / RandomResizedCrop), in Pillow's
// fixed-point arithmetic: int32 weights with kResamplePrecisionBits fraction bits, a rounding
// half added, an arithmetic shift, and a clamp to [0, 255]. Integer sums are exact, so every ISA
// gives the same bytes as the scalar one (and as Pillow, given the same weights).
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>

#if defined(__SSE4_1__)
#include <smmintrin.h>
#endif

#include "kernels/cpu/vec.h"

namespace torchspeed::kernels::cpu {
namespace TORCHSPEED_CPU_ISA_NAMESPACE {

constexpr int32_t kResampleHalf = 1 << (kResamplePrecisionBits - 1);

// One RGB output pixel of the horizontal pass; taps from bounds (first, count) and weights k.
inline void resample_pixel(const uint8_t* row, int first, int count, const int* k, uint8_t* o) {
  ScalarVecI32 s[3] = {ScalarVecI32(kResampleHalf), ScalarVecI32(kResampleHalf),
                       ScalarVecI32(kResampleHalf)};
  const uint8_t* p = row + static_cast<size_t>(first) * 3;
  for (int x = 0; x < count; ++x) {
    for (int c = 0; c < 3; ++c) {
      s[c] = s[c] + ScalarVecI32::load_u8(p + 3 * x + c) * ScalarVecI32(k[x]);
    }
  }
  for (int c = 0; c < 3; ++c) sra(s[c], kResamplePrecisionBits).store_u8_saturate(o + c);
}

/// Horizontal pass over one RGB row: out[xx - x0] for xx in [x0, x1), output pixel xx summing
/// row[bounds[2xx] + t] * kk[xx * ksize + t] over t < bounds[2xx + 1]. With SSE4.1 (the avx2 and
/// avx512 units), one 4-byte load per tap feeds the three channels in one int32x4; a pixel whose
/// last tap is the row's last pixel takes the scalar path, so no load reads past the row.
template <typename V>
void resample_horizontal_row(const uint8_t* row, int src_w, const int* bounds, const int* kk,
                             int ksize, int x0, int x1, uint8_t* out) {
  for (int xx = x0; xx < x1; ++xx) {
    const int first = bounds[static_cast<size_t>(xx) * 2];
    const int count = bounds[static_cast<size_t>(xx) * 2 + 1];
    const int* k = kk + static_cast<size_t>(xx) * static_cast<size_t>(ksize);
    uint8_t* o = out + static_cast<size_t>(xx - x0) * 3;
#if defined(__SSE4_1__)
    if (first + count < src_w) {
      const uint8_t* p = row + static_cast<size_t>(first) * 3;
      __m128i acc = _mm_set1_epi32(kResampleHalf);
      for (int x = 0; x < count; ++x) {
        int32_t v;
        std::memcpy(&v, p + 3 * x, 4);
        const __m128i px = _mm_cvtepu8_epi32(_mm_cvtsi32_si128(v));
        acc = _mm_add_epi32(acc, _mm_mullo_epi32(px, _mm_set1_epi32(k[x])));
      }
      acc = _mm_srai_epi32(acc, kResamplePrecisionBits);
      const __m128i b8 = _mm_packus_epi16(_mm_packs_epi32(acc, acc), _mm_setzero_si128());
      const uint32_t rgb = static_cast<uint32_t>(_mm_cvtsi128_si32(b8));
      o[0] = static_cast<uint8_t>(rgb);
      o[1] = static_cast<uint8_t>(rgb >> 8);
      o[2] = static_cast<uint8_t>(rgb >> 16);
      continue;
    }
#else
    (void)src_w;
#endif
    resample_pixel(row, first, count, k, o);
  }
}

/// Vertical pass for one output row: out[i] for i < n, summing rows[(first + y) * stride + i] *
/// k[y] over y < count, in V::I32 lanes (the accumulators stay in registers). Four vectors of
/// lanes per tap row, so each tap reads a whole 32-64 byte run of its row rather than a sliver
/// (with many taps, one vector per row touched `count` cache lines for 8-16 bytes each).
template <typename V>
void resample_vertical_row(const uint8_t* rows, size_t stride, int first, int count, const int* k,
                           size_t n, uint8_t* out) {
  using I = typename V::I32;
  constexpr size_t W = I::kWidth;
  const uint8_t* base = rows + static_cast<size_t>(first) * stride;
  size_t i = 0;
  for (; i + 4 * W <= n; i += 4 * W) {
    I a0(kResampleHalf), a1(kResampleHalf), a2(kResampleHalf), a3(kResampleHalf);
    for (int y = 0; y < count; ++y) {
      const uint8_t* p = base + static_cast<size_t>(y) * stride + i;
      const I ky(k[y]);
      a0 = a0 + I::load_u8(p) * ky;
      a1 = a1 + I::load_u8(p + W) * ky;
      a2 = a2 + I::load_u8(p + 2 * W) * ky;
      a3 = a3 + I::load_u8(p + 3 * W) * ky;
    }
    sra(a0, kResamplePrecisionBits).store_u8_saturate(out + i);
    sra(a1, kResamplePrecisionBits).store_u8_saturate(out + i + W);
    sra(a2, kResamplePrecisionBits).store_u8_saturate(out + i + 2 * W);
    sra(a3, kResamplePrecisionBits).store_u8_saturate(out + i + 3 * W);
  }
  for (; i + W <= n; i += W) {
    I acc(kResampleHalf);
    for (int y = 0; y < count; ++y) {
      acc = acc + I::load_u8(base + static_cast<size_t>(y) * stride + i) * I(k[y]);
    }
    sra(acc, kResamplePrecisionBits).store_u8_saturate(out + i);
  }
  for (; i < n; ++i) {
    ScalarVecI32 acc(kResampleHalf);
    for (int y = 0; y < count; ++y) {
      acc = acc +
            ScalarVecI32::load_u8(base + static_cast<size_t>(y) * stride + i) * ScalarVecI32(k[y]);
    }
    sra(acc, kResamplePrecisionBits).store_u8_saturate(out + i);
  }
}

}  // namespace TORCHSPEED_CPU_ISA_NAMESPACE
}  // namespace torchspeed::kernels::cpu
