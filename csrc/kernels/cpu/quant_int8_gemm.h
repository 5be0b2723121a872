// The int8 Linear's CPU kernels: per-row dynamic quantization of the activations, the weight
// packing, and the int8 GEMM with its fused fp32 epilogue, on four paths (types.h's Int8Path):
//
//   scalar       the reference loop.
//   avx2         vpmaddubsw on |a| (u8) x sign(w, a) (s8): a pair sum is at most 2 * 128 * 127 =
//                32512 < 32767, so it never saturates while w stays in [-127, 127]; vpmaddwd
//                with ones widens the pairs to int32.
//   avx512       the same sequence on 512 bits for AVX-512 CPUs without VNNI (Skylake-SP):
//                AVX-512 has no vpsignb, so w is negated under the mask of a's sign bits.
//   avx512_vnni  vpdpbusd on (a + 128) (u8, written so by the row quantization) x w (s8), no
//                intermediate saturation, minus the per-channel compensation 128 * sum_k w[n, k]
//                stored at pack time.
//   amx          AMX-INT8 tdpbusd on 32 x 32 blocks (the same u8 rows and compensation as VNNI);
//                rows left over (fewer than 16) take the VNNI microkernel.
//
// Every path computes the same numbers bit for bit: the int32 accumulation is exact (the int32
// sum of the products, wrapping arithmetic cancelling the u8 offset; exact while |acc| < 2^31,
// which K <= 131072 guarantees), and the epilogue is the fp32 formula of types.h's Int8GemmArgs
// (units are built with -ffp-contract=off). The packed layout is shared by all paths (types.h).
#pragma once

#include <algorithm>
#include <cstring>
#include <limits>
#include <vector>

#include "kernels/cpu/vec.h"

namespace torchspeed::kernels::cpu {
namespace TORCHSPEED_CPU_ISA_NAMESPACE {
namespace int8 {

// ---- Per-row dynamic quantization ---------------------------------------------------------------

/// The u8 x s8 paths (avx512_vnni, amx) store q xor 0x80 (= q + 128 as u8): kOffset.
template <class V, bool kOffset, typename In>
void quantize_rows_typed(const In* x, int64_t rows, int64_t cols, int8_t* q, int64_t ldq,
                         float* scale) {
  using S = typename V::Scalar;
  constexpr int64_t W = V::kWidth;
  for (int64_t r = 0; r < rows; ++r) {
    const In* xr = x + r * cols;
    int8_t* qr = q + r * ldq;
    // absmax (order-free), and a sum of |x| * 0 that is NaN iff the row holds inf or NaN.
    V vmax(0.f), vbad(0.f);
    S smax(0.f), sbad(0.f);
    int64_t i = 0;
    for (; i + W <= cols; i += W) {
      const V ax = abs(V::load(xr + i));
      vmax = max(vmax, ax);
      vbad = vbad + ax * V(0.f);
    }
    for (; i < cols; ++i) {
      const S ax = abs(S::load(xr + i));
      smax = max(smax, ax);
      sbad = sbad + ax * S(0.f);
    }
    alignas(64) float lanes[W];
    vmax.store(lanes);
    float amax = smax.v;
    for (int64_t j = 0; j < W; ++j) amax = lanes[j] > amax ? lanes[j] : amax;
    const float bad = static_cast<float>(vbad.reduce_add()) + sbad.v;
    if (bad != 0.f) {  // NaN: a non-finite element
      scale[r] = std::numeric_limits<float>::quiet_NaN();
      std::memset(qr, 0, static_cast<size_t>(ldq));
      continue;
    }
    const float s = amax == 0.f ? 1.f : amax / 127.f;
    scale[r] = s;
    const float inv_f = 1.f / s;
    const V inv(inv_f), lo(-127.f), hi(127.f);
    i = 0;
    for (; i + W <= cols; i += W) min(max(round_even(V::load(xr + i) * inv), lo), hi).store(qr + i);
    for (; i < cols; ++i) {
      min(max(round_even(S::load(xr + i) * S(inv_f)), S(-127.f)), S(127.f)).store(qr + i);
    }
    if (ldq > cols) std::memset(qr + cols, 0, static_cast<size_t>(ldq - cols));
    if constexpr (kOffset) {
      uint64_t* words = reinterpret_cast<uint64_t*>(qr);  // ldq is a multiple of 64
      for (int64_t w = 0; w < ldq / 8; ++w) words[w] ^= 0x8080808080808080ull;
    }
  }
}

template <class V, bool kOffset = false>
bool quantize_rows(DType in_dtype, const void* x, int64_t rows, int64_t cols, int8_t* q,
                   int64_t ldq, float* scale) {
  switch (in_dtype) {
    case DType::kFloat:
      quantize_rows_typed<V, kOffset>(static_cast<const float*>(x), rows, cols, q, ldq, scale);
      return true;
    case DType::kBFloat16:
      quantize_rows_typed<V, kOffset>(static_cast<const bf16*>(x), rows, cols, q, ldq, scale);
      return true;
    case DType::kHalf:
      quantize_rows_typed<V, kOffset>(static_cast<const fp16*>(x), rows, cols, q, ldq, scale);
      return true;
    default:
      return false;
  }
}

// ---- Packing (one layout for every path, see types.h) ------------------------------------------

inline void pack_weight(const int8_t* w, int64_t n, int64_t k, int64_t n_pad, int64_t k_pad,
                        void* body) {
  int32_t* comp = static_cast<int32_t*>(body);
  int8_t* panels = reinterpret_cast<int8_t*>(comp + n_pad);
  std::memset(panels, 0, static_cast<size_t>(n_pad * k_pad));
  for (int64_t r = 0; r < n_pad; ++r) {
    uint32_t sum = 0;  // wrapping, like the GEMM's int32 lanes
    if (r < n) {
      const int8_t* src = w + r * k;
      int8_t* dst = panels + (r / kInt8PanelN) * kInt8PanelN * k_pad + (r % kInt8PanelN) * 4;
      for (int64_t kk = 0; kk < k; ++kk) {
        dst[(kk >> 2) * 64 + (kk & 3)] = src[kk];
        sum += static_cast<uint32_t>(static_cast<int32_t>(src[kk]));
      }
    }
    comp[r] = static_cast<int32_t>(sum * 128u);
  }
}

inline const int32_t* packed_comp(const Int8GemmArgs& g) {
  return static_cast<const int32_t*>(g.packed);
}
inline const int8_t* packed_panel(const Int8GemmArgs& g, int64_t n) {
  return reinterpret_cast<const int8_t*>(packed_comp(g) + g.n_pad) +
         (n / kInt8PanelN) * kInt8PanelN * g.k_pad;
}

inline int32_t load_i32(const int8_t* p) {
  int32_t v;
  std::memcpy(&v, p, 4);
  return v;
}

// ---- The epilogue -------------------------------------------------------------------------------

#if defined(__AVX512F__)
using EpiVec = VecAvx512;
inline EpiVec load_acc(const int32_t* p) {
  return EpiVec(_mm512_cvtepi32_ps(_mm512_loadu_si512(p)));
}
#elif defined(__AVX2__)
using EpiVec = VecAvx2;
inline EpiVec load_acc(const int32_t* p) {
  return EpiVec(_mm256_cvtepi32_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p))));
}
#else
using EpiVec = ScalarVec<float>;
inline EpiVec load_acc(const int32_t* p) { return EpiVec(static_cast<float>(*p)); }
#endif

template <typename T>
void epilogue_row_typed(const Int8GemmArgs& g, int64_t m, int64_t n0, int64_t cnt,
                        const int32_t* acc) {
  using V = EpiVec;
  using S = typename V::Scalar;
  constexpr int64_t W = V::kWidth;
  T* out = static_cast<T*>(g.out) + m * g.ldo + n0;
  const float as = g.a_scale[m];
  const float* ws = g.w_scale + n0;
  const float* bias = g.bias ? g.bias + n0 : nullptr;
  int64_t j = 0;
  const V vas(as), zero(0.f);
  for (; j + W <= cnt; j += W) {
    V y = load_acc(acc + j) * (vas * V::load(ws + j));
    if (bias) y = y + V::load(bias + j);
    if (g.relu) y = max(zero, y);
    y.store(out + j);
  }
  for (; j < cnt; ++j) {
    S y = S(static_cast<float>(acc[j])) * (S(as) * S(ws[j]));
    if (bias) y = y + S(bias[j]);
    if (g.relu) y = max(S(0.f), y);
    y.store(out + j);
  }
}

/// out[m, n0 .. n0 + cnt) from the int32 sums acc[0 .. cnt).
inline void epilogue_row(const Int8GemmArgs& g, int64_t m, int64_t n0, int64_t cnt,
                         const int32_t* acc) {
  switch (g.out_dtype) {
    case DType::kBFloat16:
      epilogue_row_typed<bf16>(g, m, n0, cnt, acc);
      break;
    case DType::kHalf:
      epilogue_row_typed<fp16>(g, m, n0, cnt, acc);
      break;
    default:
      epilogue_row_typed<float>(g, m, n0, cnt, acc);
      break;
  }
}

// ---- scalar -------------------------------------------------------------------------------------

inline void gemm_scalar(const Int8GemmArgs& g, int64_t m0, int64_t m1, int64_t n0, int64_t n1) {
  int32_t acc[kInt8PanelN];
  for (int64_t n = n0; n < n1; n += kInt8PanelN) {
    const int8_t* panel = packed_panel(g, n);
    const int64_t cnt = std::min<int64_t>(kInt8PanelN, n1 - n);
    for (int64_t m = m0; m < m1; ++m) {
      const int8_t* a = g.a + m * g.lda;
      for (int64_t j = 0; j < cnt; ++j) {
        int32_t s = 0;
        for (int64_t kk = 0; kk < g.k; ++kk) {
          s += static_cast<int32_t>(a[kk]) * panel[(kk >> 2) * 64 + j * 4 + (kk & 3)];
        }
        acc[j] = s;
      }
      epilogue_row(g, m, n, cnt, acc);
    }
  }
}

// ---- avx2: |a| (u8) x sign(w, a) (s8), exact --------------------------------------------------

#if defined(__AVX2__)
// The microkernels name their accumulators one by one (arrays of vectors make gcc keep a copy
// on the stack inside the loop); rows beyond MR and panels beyond NB compile away.
#define TS_INT8_AVX2_ROW(r)                                                \
  if constexpr (MR > r) {                                                  \
    const __m256i ab = _mm256_set1_epi32(load_i32(a + r * lda + gi * 4));  \
    const __m256i au = _mm256_set1_epi32(load_i32(ua + r * lda + gi * 4)); \
    const __m256i p0 = _mm256_maddubs_epi16(au, _mm256_sign_epi8(w0, ab)); \
    const __m256i p1 = _mm256_maddubs_epi16(au, _mm256_sign_epi8(w1, ab)); \
    c##r##_0 = _mm256_add_epi32(c##r##_0, _mm256_madd_epi16(p0, ones));    \
    c##r##_1 = _mm256_add_epi32(c##r##_1, _mm256_madd_epi16(p1, ones));    \
  }
#define TS_INT8_AVX2_STORE(r)                                              \
  if constexpr (MR > r) {                                                  \
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(acc[r]), c##r##_0);     \
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(acc[r] + 8), c##r##_1); \
  }

/// acc[r][0 .. 16) = sum over k_pad of a[r, k] * w[panel channel, k], for MR <= 4 rows; ua holds
/// |a| in the same layout.
template <int MR>
void avx2_block(const int8_t* a, const int8_t* ua, int64_t lda, const int8_t* panel, int64_t groups,
                int32_t (*acc)[kInt8PanelN]) {
  const __m256i z = _mm256_setzero_si256();
  __m256i c0_0 = z, c0_1 = z, c1_0 = z, c1_1 = z, c2_0 = z, c2_1 = z, c3_0 = z, c3_1 = z;
  const __m256i ones = _mm256_set1_epi16(1);
  for (int64_t gi = 0; gi < groups; ++gi) {
    const __m256i w0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(panel + gi * 64));
    const __m256i w1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(panel + gi * 64 + 32));
    TS_INT8_AVX2_ROW(0)
    TS_INT8_AVX2_ROW(1)
    TS_INT8_AVX2_ROW(2)
    TS_INT8_AVX2_ROW(3)
  }
  TS_INT8_AVX2_STORE(0)
  TS_INT8_AVX2_STORE(1)
  TS_INT8_AVX2_STORE(2)
  TS_INT8_AVX2_STORE(3)
}
#undef TS_INT8_AVX2_ROW
#undef TS_INT8_AVX2_STORE

inline void gemm_avx2(const Int8GemmArgs& g, int64_t m0, int64_t m1, int64_t n0, int64_t n1) {
  constexpr int MR = 4;
  int32_t acc[MR][kInt8PanelN];
  const int64_t groups = g.k_pad / 4;
  // |a| once per block of rows rather than once per panel: vpabsb needs the ports the multiplies
  // and vpsignb use, and leaving the inner loop makes the path 14-18% faster. Rows are lda long
  // (a multiple of 64, zero-filled past k).
  thread_local std::vector<int8_t> abs_rows;
  abs_rows.resize(static_cast<size_t>((m1 - m0) * g.lda));
  for (int64_t m = m0; m < m1; ++m) {
    const int8_t* src = g.a + m * g.lda;
    int8_t* dst = abs_rows.data() + (m - m0) * g.lda;
    for (int64_t i = 0; i < g.lda; i += 32) {
      const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + i));
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + i), _mm256_abs_epi8(v));
    }
  }
  for (int64_t n = n0; n < n1; n += kInt8PanelN) {
    const int8_t* panel = packed_panel(g, n);
    const int64_t cnt = std::min<int64_t>(kInt8PanelN, n1 - n);
    int64_t m = m0;
    for (; m + MR <= m1; m += MR) {
      avx2_block<MR>(g.a + m * g.lda, abs_rows.data() + (m - m0) * g.lda, g.lda, panel, groups,
                     acc);
      for (int r = 0; r < MR; ++r) epilogue_row(g, m + r, n, cnt, acc[r]);
    }
    for (; m < m1; ++m) {
      avx2_block<1>(g.a + m * g.lda, abs_rows.data() + (m - m0) * g.lda, g.lda, panel, groups, acc);
      epilogue_row(g, m, n, cnt, acc[0]);
    }
  }
}
#endif

// ---- avx512 (BW, no VNNI): the avx2 sequence on 512 bits, sign(w, a) as a masked negation
// ----------

#if defined(__AVX512BW__)
#define TS_INT8_BW_PANEL(r, b)       \
  c##r##_##b = _mm512_add_epi32(     \
      c##r##_##b, _mm512_madd_epi16( \
                      _mm512_maddubs_epi16(au, _mm512_mask_sub_epi8(w##b, neg, z, w##b)), ones));
#define TS_INT8_BW_ROW(r)                                                 \
  if constexpr (MR > r) {                                                 \
    const __m512i ab = _mm512_set1_epi32(load_i32(a + r * lda + gi * 4)); \
    const __m512i au = _mm512_abs_epi8(ab);                               \
    const __mmask64 neg = _mm512_movepi8_mask(ab);                        \
    TS_INT8_BW_PANEL(r, 0)                                                \
    if constexpr (NB > 1) {                                               \
      TS_INT8_BW_PANEL(r, 1)                                              \
    }                                                                     \
    if constexpr (NB > 2) {                                               \
      TS_INT8_BW_PANEL(r, 2)                                              \
    }                                                                     \
  }
#define TS_INT8_BW_STORE(r)                                                    \
  if constexpr (MR > r) {                                                      \
    _mm512_storeu_si512(acc + r * ldacc, c##r##_0);                            \
    if constexpr (NB > 1) _mm512_storeu_si512(acc + r * ldacc + 16, c##r##_1); \
    if constexpr (NB > 2) _mm512_storeu_si512(acc + r * ldacc + 32, c##r##_2); \
  }

/// acc[r][b * 16 .. b * 16 + 16) for MR <= 6 rows of signed `a` and NB <= 3 panels: |a| (u8) x
/// (w negated where a < 0) (s8), pair sums at most 2 * 128 * 127 like the avx2 path.
template <int MR, int NB>
void bw_block(const int8_t* a, int64_t lda, const int8_t* panel, int64_t panel_stride,
              int64_t groups, int32_t* acc, int64_t ldacc) {
  const __m512i z = _mm512_setzero_si512();
  const __m512i ones = _mm512_set1_epi16(1);
  __m512i c0_0 = z, c0_1 = z, c0_2 = z, c1_0 = z, c1_1 = z, c1_2 = z, c2_0 = z, c2_1 = z;
  __m512i c2_2 = z, c3_0 = z, c3_1 = z, c3_2 = z, c4_0 = z, c4_1 = z, c4_2 = z, c5_0 = z;
  __m512i c5_1 = z, c5_2 = z;
  const int8_t* p1 = panel + panel_stride;
  const int8_t* p2 = panel + 2 * panel_stride;
  for (int64_t gi = 0; gi < groups; ++gi) {
    const __m512i w0 = _mm512_loadu_si512(panel + gi * 64);
    const __m512i w1 = NB > 1 ? _mm512_loadu_si512(p1 + gi * 64) : z;
    const __m512i w2 = NB > 2 ? _mm512_loadu_si512(p2 + gi * 64) : z;
    TS_INT8_BW_ROW(0)
    TS_INT8_BW_ROW(1)
    TS_INT8_BW_ROW(2)
    TS_INT8_BW_ROW(3)
    TS_INT8_BW_ROW(4)
    TS_INT8_BW_ROW(5)
  }
  TS_INT8_BW_STORE(0)
  TS_INT8_BW_STORE(1)
  TS_INT8_BW_STORE(2)
  TS_INT8_BW_STORE(3)
  TS_INT8_BW_STORE(4)
  TS_INT8_BW_STORE(5)
}
#undef TS_INT8_BW_PANEL
#undef TS_INT8_BW_ROW
#undef TS_INT8_BW_STORE

template <int MR>
void bw_rows(const Int8GemmArgs& g, int64_t m, int64_t n, int64_t n1, int32_t* acc, int64_t ldacc) {
  const int64_t groups = g.k_pad / 4;
  const int64_t stride = kInt8PanelN * g.k_pad;
  const int64_t panels = (std::min(n1, n + 3 * kInt8PanelN) - n + kInt8PanelN - 1) / kInt8PanelN;
  const int8_t* panel = packed_panel(g, n);
  const int8_t* a = g.a + m * g.lda;
  if (panels == 3) {
    bw_block<MR, 3>(a, g.lda, panel, stride, groups, acc, ldacc);
  } else if (panels == 2) {
    bw_block<MR, 2>(a, g.lda, panel, stride, groups, acc, ldacc);
  } else {
    bw_block<MR, 1>(a, g.lda, panel, stride, groups, acc, ldacc);
  }
}

/// Rows [m0, m1) x columns [n0, n1) with the AVX-512BW microkernels (6 rows x 3 panels).
inline void gemm_avx512bw(const Int8GemmArgs& g, int64_t m0, int64_t m1, int64_t n0, int64_t n1) {
  constexpr int MR = 6;
  constexpr int64_t NC = 3 * kInt8PanelN;
  int32_t acc[MR * NC];
  for (int64_t n = n0; n < n1; n += NC) {
    const int64_t cnt = std::min(NC, n1 - n);
    int64_t m = m0;
    for (; m + MR <= m1; m += MR) {
      bw_rows<MR>(g, m, n, n1, acc, NC);
      for (int r = 0; r < MR; ++r) epilogue_row(g, m + r, n, cnt, acc + r * NC);
    }
    for (; m < m1; ++m) {
      bw_rows<1>(g, m, n, n1, acc, NC);
      epilogue_row(g, m, n, cnt, acc);
    }
  }
}
#endif

// ---- avx512_vnni: (a + 128) (u8) x w (s8) - 128 * sum_k w ---------------------------------------

#if defined(__AVX512VNNI__) && defined(__AVX512F__)
/// c += u8 x s8 dot products (vpdpbusd), with c tied to the destination register: gcc 12's
/// builtin copies the accumulator in and out around every instruction (and spills at 24).
inline __m512i dpbusd(__m512i c, __m512i u8, __m512i s8) {
  asm("vpdpbusd %2, %1, %0" : "+v"(c) : "v"(u8), "v"(s8));
  return c;
}

#define TS_INT8_VNNI_ROW(r)                                               \
  if constexpr (MR > r) {                                                 \
    const __m512i ab = _mm512_set1_epi32(load_i32(a + r * lda + gi * 4)); \
    c##r##_0 = dpbusd(c##r##_0, ab, w0);                                  \
    if constexpr (NB > 1) c##r##_1 = dpbusd(c##r##_1, ab, w1);            \
    if constexpr (NB > 2) c##r##_2 = dpbusd(c##r##_2, ab, w2);            \
  }
#define TS_INT8_VNNI_STORE(r)                                                    \
  if constexpr (MR > r) {                                                        \
    _mm512_storeu_si512(acc + r * ldacc, _mm512_sub_epi32(c##r##_0, k0));        \
    if constexpr (NB > 1)                                                        \
      _mm512_storeu_si512(acc + r * ldacc + 16, _mm512_sub_epi32(c##r##_1, k1)); \
    if constexpr (NB > 2)                                                        \
      _mm512_storeu_si512(acc + r * ldacc + 32, _mm512_sub_epi32(c##r##_2, k2)); \
  }

/// acc[r][b * 16 .. b * 16 + 16) for MR <= 8 rows of `a` (q xor 0x80, u8) and NB <= 3 panels.
template <int MR, int NB>
void vnni_block(const int8_t* a, int64_t lda, const int8_t* panel, int64_t panel_stride,
                const int32_t* comp, int64_t groups, int32_t* acc, int64_t ldacc) {
  const __m512i z = _mm512_setzero_si512();
  __m512i c0_0 = z, c0_1 = z, c0_2 = z, c1_0 = z, c1_1 = z, c1_2 = z, c2_0 = z, c2_1 = z;
  __m512i c2_2 = z, c3_0 = z, c3_1 = z, c3_2 = z, c4_0 = z, c4_1 = z, c4_2 = z, c5_0 = z;
  __m512i c5_1 = z, c5_2 = z, c6_0 = z, c6_1 = z, c6_2 = z, c7_0 = z, c7_1 = z, c7_2 = z;
  const int8_t* p1 = panel + panel_stride;
  const int8_t* p2 = panel + 2 * panel_stride;
  for (int64_t gi = 0; gi < groups; ++gi) {
    const __m512i w0 = _mm512_loadu_si512(panel + gi * 64);
    const __m512i w1 = NB > 1 ? _mm512_loadu_si512(p1 + gi * 64) : z;
    const __m512i w2 = NB > 2 ? _mm512_loadu_si512(p2 + gi * 64) : z;
    TS_INT8_VNNI_ROW(0)
    TS_INT8_VNNI_ROW(1)
    TS_INT8_VNNI_ROW(2)
    TS_INT8_VNNI_ROW(3)
    TS_INT8_VNNI_ROW(4)
    TS_INT8_VNNI_ROW(5)
    TS_INT8_VNNI_ROW(6)
    TS_INT8_VNNI_ROW(7)
  }
  const __m512i k0 = _mm512_loadu_si512(comp);
  const __m512i k1 = NB > 1 ? _mm512_loadu_si512(comp + 16) : z;
  const __m512i k2 = NB > 2 ? _mm512_loadu_si512(comp + 32) : z;
  TS_INT8_VNNI_STORE(0)
  TS_INT8_VNNI_STORE(1)
  TS_INT8_VNNI_STORE(2)
  TS_INT8_VNNI_STORE(3)
  TS_INT8_VNNI_STORE(4)
  TS_INT8_VNNI_STORE(5)
  TS_INT8_VNNI_STORE(6)
  TS_INT8_VNNI_STORE(7)
}
#undef TS_INT8_VNNI_ROW
#undef TS_INT8_VNNI_STORE

template <int MR>
void vnni_rows(const Int8GemmArgs& g, const int8_t* au, int64_t m, int64_t n, int64_t n1,
               int32_t* acc, int64_t ldacc) {
  const int64_t groups = g.k_pad / 4;
  const int64_t stride = kInt8PanelN * g.k_pad;
  const int32_t* comp = packed_comp(g) + n;
  const int64_t panels = (std::min(n1, n + 3 * kInt8PanelN) - n + kInt8PanelN - 1) / kInt8PanelN;
  const int8_t* panel = packed_panel(g, n);
  if (panels == 3) {
    vnni_block<MR, 3>(au, g.lda, panel, stride, comp, groups, acc, ldacc);
  } else if (panels == 2) {
    vnni_block<MR, 2>(au, g.lda, panel, stride, comp, groups, acc, ldacc);
  } else {
    vnni_block<MR, 1>(au, g.lda, panel, stride, comp, groups, acc, ldacc);
  }
}

/// Rows [m0, m1) x columns [n0, n1) with the VNNI microkernels (MR = 8 rows x 3 panels); the
/// rows hold q xor 0x80 (quantize_rows<V, true>).
inline void gemm_vnni(const Int8GemmArgs& g, int64_t m0, int64_t m1, int64_t n0, int64_t n1) {
  const int8_t* au = g.a;
  constexpr int MR = 8;
  constexpr int64_t NC = 3 * kInt8PanelN;
  int32_t acc[MR * NC];
  for (int64_t n = n0; n < n1; n += NC) {
    const int64_t cnt = std::min(NC, n1 - n);
    int64_t m = m0;
    for (; m + MR <= m1; m += MR) {
      vnni_rows<MR>(g, au + m * g.lda, m, n, n1, acc, NC);
      for (int r = 0; r < MR; ++r) epilogue_row(g, m + r, n, cnt, acc + r * NC);
    }
    for (; m < m1; ++m) {
      vnni_rows<1>(g, au + m * g.lda, m, n, n1, acc, NC);
      epilogue_row(g, m, n, cnt, acc);
    }
  }
}

#endif

// ---- amx: tdpbusd on 32 x 32 blocks (u8 rows like VNNI, minus the same compensation)
// -------------------------------------------------------------

#if defined(__AMX_INT8__) && defined(__AMX_TILE__) && defined(__AVX512VNNI__)
struct alignas(64) TileConfig {
  uint8_t palette_id;
  uint8_t start_row;
  uint8_t reserved[14];
  uint16_t colsb[16];
  uint8_t rows[16];
};

/// Tiles 0-3: C (2 x 2 of 16 x 16 int32), 4-5: A (16 rows x 64 k), 6-7: B (16 groups x 64 bytes).
inline void amx_configure() {
  TileConfig cfg{};
  cfg.palette_id = 1;
  for (int t = 0; t < 8; ++t) {
    cfg.rows[t] = 16;
    cfg.colsb[t] = 64;
  }
  _tile_loadconfig(&cfg);
}

/// acc (32 x 32 int32, row stride 32) = MT x 16 rows of a times NT panels.
template <int MT, int NT>
void amx_block(const int8_t* a, int64_t lda, const int8_t* panel, int64_t panel_stride,
               int64_t chunks, int32_t* acc) {
  _tile_zero(0);
  if constexpr (NT == 2) _tile_zero(1);
  if constexpr (MT == 2) _tile_zero(2);
  if constexpr (MT == 2 && NT == 2) _tile_zero(3);
  for (int64_t c = 0; c < chunks; ++c) {
    _tile_loadd(4, a + c * 64, lda);
    _tile_loadd(6, panel + c * 1024, 64);
    if constexpr (MT == 2) _tile_loadd(5, a + 16 * lda + c * 64, lda);
    if constexpr (NT == 2) _tile_loadd(7, panel + panel_stride + c * 1024, 64);
    _tile_dpbusd(0, 4, 6);
    if constexpr (NT == 2) _tile_dpbusd(1, 4, 7);
    if constexpr (MT == 2) _tile_dpbusd(2, 5, 6);
    if constexpr (MT == 2 && NT == 2) _tile_dpbusd(3, 5, 7);
  }
  _tile_stored(0, acc, 128);
  if constexpr (NT == 2) _tile_stored(1, acc + 16, 128);
  if constexpr (MT == 2) _tile_stored(2, acc + 16 * 32, 128);
  if constexpr (MT == 2 && NT == 2) _tile_stored(3, acc + 16 * 32 + 16, 128);
}

/// The epilogue of a full 32-column block (acc: rows x 32 int32, row stride 32): the column
/// vectors (w_scale, bias, comp) are loaded once for all rows. The same fp32 operations, in the
/// same order, as epilogue_row.
template <typename T>
void epilogue_block32(const Int8GemmArgs& g, int64_t m, int64_t rows, int64_t n, const int32_t* acc,
                      const int32_t* comp) {
  using V = EpiVec;
  static_assert(V::kWidth == 16, "the amx unit's epilogue vectors are 16 floats");
  const V ws0 = V::load(g.w_scale + n), ws1 = V::load(g.w_scale + n + 16);
  const V zero(0.f);
  V b0 = zero, b1 = zero;
  if (g.bias) {
    b0 = V::load(g.bias + n);
    b1 = V::load(g.bias + n + 16);
  }
  const __m512i k0 = _mm512_loadu_si512(comp), k1 = _mm512_loadu_si512(comp + 16);
  for (int64_t r = 0; r < rows; ++r) {
    const int32_t* a = acc + r * 32;
    const V as(g.a_scale[m + r]);
    V y0(_mm512_cvtepi32_ps(_mm512_sub_epi32(_mm512_loadu_si512(a), k0)));
    V y1(_mm512_cvtepi32_ps(_mm512_sub_epi32(_mm512_loadu_si512(a + 16), k1)));
    y0 = y0 * (as * ws0);
    y1 = y1 * (as * ws1);
    if (g.bias) {
      y0 = y0 + b0;
      y1 = y1 + b1;
    }
    if (g.relu) {
      y0 = max(zero, y0);
      y1 = max(zero, y1);
    }
    T* out = static_cast<T*>(g.out) + (m + r) * g.ldo + n;
    y0.store(out);
    y1.store(out + 16);
  }
}

inline void gemm_amx(const Int8GemmArgs& g, int64_t m0, int64_t m1, int64_t n0, int64_t n1) {
  if (m1 <= m0) return;
  const int64_t full = m0 + (m1 - m0) / 16 * 16;  // rows the tiles take
  if (full > m0) {
    amx_configure();
    alignas(64) int32_t acc[32 * 32];
    const int64_t chunks = g.k_pad / 64;
    const int64_t stride = kInt8PanelN * g.k_pad;
    for (int64_t n = n0; n < n1; n += 2 * kInt8PanelN) {
      const int64_t cnt = std::min<int64_t>(2 * kInt8PanelN, n1 - n);
      const bool two = cnt > kInt8PanelN;
      const int8_t* panel = packed_panel(g, n);
      for (int64_t m = m0; m < full;) {
        const int64_t rows = m + 32 <= full ? 32 : 16;
        const int8_t* a = g.a + m * g.lda;
        if (rows == 32) {
          two ? amx_block<2, 2>(a, g.lda, panel, stride, chunks, acc)
              : amx_block<2, 1>(a, g.lda, panel, stride, chunks, acc);
        } else {
          two ? amx_block<1, 2>(a, g.lda, panel, stride, chunks, acc)
              : amx_block<1, 1>(a, g.lda, panel, stride, chunks, acc);
        }
        const int32_t* comp = packed_comp(g) + n;
        if (cnt == 32 && g.out_dtype == DType::kFloat) {
          epilogue_block32<float>(g, m, rows, n, acc, comp);
        } else if (cnt == 32 && g.out_dtype == DType::kBFloat16) {
          epilogue_block32<bf16>(g, m, rows, n, acc, comp);
        } else if (cnt == 32 && g.out_dtype == DType::kHalf) {
          epilogue_block32<fp16>(g, m, rows, n, acc, comp);
        } else {
          for (int64_t r = 0; r < rows; ++r) {
            int32_t* row = acc + r * 32;
            // comp[n_pad) covers both panels; the lanes wrap like vpsubd (the true sum fits int32)
            for (int j = 0; j < 32; ++j) {
              row[j] = static_cast<int32_t>(static_cast<uint32_t>(row[j]) -
                                            static_cast<uint32_t>(comp[j]));
            }
            epilogue_row(g, m + r, n, cnt, row);
          }
        }
        m += rows;
      }
    }
    _tile_release();
  }
  if (full < m1) gemm_vnni(g, full, m1, n0, n1);
}
#endif

/// The best int8 path this unit's flags compile.
constexpr Int8LinearKernels int8_linear_kernels() {
#if defined(__AMX_INT8__) && defined(__AMX_TILE__) && defined(__AVX512VNNI__)
  return {Int8Path::kAmx, "amx", &quantize_rows<EpiVec, true>, &pack_weight, &gemm_amx};
#elif defined(__AVX512VNNI__) && defined(__AVX512F__)
  return {Int8Path::kAvx512Vnni, "avx512_vnni", &quantize_rows<EpiVec, true>, &pack_weight,
          &gemm_vnni};
#elif defined(__AVX512BW__)
  return {Int8Path::kAvx512, "avx512", &quantize_rows<EpiVec>, &pack_weight, &gemm_avx512bw};
#elif defined(__AVX2__)
  return {Int8Path::kAvx2, "avx2", &quantize_rows<EpiVec>, &pack_weight, &gemm_avx2};
#else
  return {Int8Path::kScalar, "scalar", &quantize_rows<EpiVec>, &pack_weight, &gemm_scalar};
#endif
}

}  // namespace int8
}  // namespace TORCHSPEED_CPU_ISA_NAMESPACE
}  // namespace torchspeed::kernels::cpu
