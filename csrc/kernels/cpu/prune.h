// The prune area's CPU kernels over bit-packed masks (layout: kernels/cpu/mask_bits.h): pack and
// unpack {0,1} bytes, apply a mask in place, build N:M masks and exact-count magnitude masks.
//
// Magnitudes are compared as the integer key |bits| (the element's bits without the sign): for
// IEEE floats of one width that orders exactly like |w| (−0 == +0, NaN above inf), so the choice
// is exact for float32/float64/bfloat16/float16 alike and needs no float conversion. Every range
// a kernel gets starts on a byte of the mask (element index % 8 == 0) and writes whole bytes.
#pragma once

#include <type_traits>

#include "kernels/cpu/mask_bits.h"

namespace torchspeed::kernels::cpu {
namespace TORCHSPEED_CPU_ISA_NAMESPACE {

/// The magnitude key of element i of an array of `elem_size`-byte floats (2, 4 or 8).
inline uint64_t magnitude_key(const void* w, int elem_size, int64_t i) {
  switch (elem_size) {
    case 2:
      return static_cast<const uint16_t*>(w)[i] & 0x7fffu;
    case 4:
      return static_cast<const uint32_t*>(w)[i] & 0x7fffffffu;
    default:
      return static_cast<const uint64_t*>(w)[i] & 0x7fffffffffffffffull;
  }
}

/// bits[b] = the 8 {0,1} bytes bools[8b .. 8b + 7] (nonzero = 1), n elements, ceil(n/8) bytes;
/// the bits past n in the last byte are 0.
template <class V>
void pack_mask(const uint8_t* bools, uint8_t* bits, int64_t n) {
  const int64_t full = n / 8;
  for (int64_t b = 0; b < full; ++b) {
    uint64_t x;
    std::memcpy(&x, bools + 8 * b, sizeof x);
    // Nonzero bytes to 0x01 (byte k at bits 8k), then gather bit 0 of each byte into one byte.
    x = ((x | (x >> 1) | (x >> 2) | (x >> 3) | (x >> 4) | (x >> 5) | (x >> 6) | (x >> 7)) &
         0x0101010101010101ull);
    bits[b] = static_cast<uint8_t>((x * 0x0102040810204080ull) >> 56);
  }
  if (full * 8 < n) {
    uint8_t last = 0;
    for (int64_t i = full * 8; i < n; ++i) last |= static_cast<uint8_t>((bools[i] != 0) << (i & 7));
    bits[full] = last;
  }
}

/// bools[i] = bit i (0 or 1), n elements.
template <class V>
void unpack_mask(const uint8_t* bits, uint8_t* bools, int64_t n) {
  const int64_t full = n / 8;
  for (int64_t b = 0; b < full; ++b) {
    // One shift per lane; the compiler vectorises the fixed 8-lane loop.
    const uint8_t x = bits[b];
    for (int k = 0; k < 8; ++k) bools[8 * b + k] = (x >> k) & 1u;
  }
  for (int64_t i = full * 8; i < n; ++i) bools[i] = mask_bit(bits, i);
}

/// w[i] = 0 where bit i is 0, over n elements of `elem_size` bytes; kept elements are untouched.
/// float32 runs in V's lanes (one masked load/and/store); 2- and 8-byte elements per mask byte.
template <class V>
void apply_mask(void* w, int elem_size, const uint8_t* bits, int64_t n) {
  if (elem_size == 4) {
    float* p = static_cast<float*>(w);
    using S = typename V::Scalar;
    constexpr int64_t W = V::kWidth;
    int64_t i = 0;
    for (; i + W <= n; i += W) keep_bits(bits, i, V::load(p + i)).store(p + i);
    for (; i < n; ++i) keep_bits(bits, i, S::load(p + i)).store(p + i);
    return;
  }
  auto zero_where_clear = [&](auto* p) {
    using T = std::remove_pointer_t<decltype(p)>;
    for (int64_t b = 0; b * 8 < n; ++b) {
      const uint8_t x = bits[b];
      if (x == 0xffu) continue;
      const int64_t end = b * 8 + 8 < n ? b * 8 + 8 : n;
      for (int64_t i = b * 8; i < end; ++i) {
        if (!((x >> (i & 7)) & 1u)) p[i] = T(0);
      }
    }
  };
  if (elem_size == 2) {
    zero_where_clear(static_cast<uint16_t*>(w));
  } else {
    zero_where_clear(static_cast<uint64_t*>(w));
  }
}

/// N:M over `groups` consecutive groups of m elements (w and bits start on a group and a byte):
/// in each group keep the n largest keys, an equal key ranking the lower index higher. Writes
/// ceil(groups * m / 8) bytes.
/// The groups of one N:M range with the group size M known at compile time (0: m at run time),
/// so the common 2:4 and 4:8 ranks unroll into branch-free compares.
template <int M, typename K>
void nm_groups(const K* w, int64_t groups, int n, int m_runtime, uint8_t* bits) {
  const int m = M ? M : m_runtime;
  constexpr K kNoSign = static_cast<K>(K(-1) >> 1);  // |bits|: drop the sign (no promotion)
  K key[M ? M : 256];                                // m <= 256 (the validator's limit)
  for (int64_t g = 0; g < groups; ++g) {
    const int64_t base = g * m;
    for (int j = 0; j < m; ++j) key[j] = w[base + j] & kNoSign;
    for (int j = 0; j < m; ++j) {
      // rank = how many elements of the group come before j in (key desc, index asc) order.
      int rank = 0;
      for (int k = 0; k < m; ++k) rank += key[k] > key[j] || (key[k] == key[j] && k < j);
      bits[(base + j) >> 3] |= static_cast<uint8_t>((rank < n) << ((base + j) & 7));
    }
  }
}

template <typename K>
void nm_groups_any(const void* w, int64_t groups, int n, int m, uint8_t* bits) {
  const K* k = static_cast<const K*>(w);
  if (m == 4) {
    nm_groups<4>(k, groups, n, m, bits);
  } else if (m == 8) {
    nm_groups<8>(k, groups, n, m, bits);
  } else {
    nm_groups<0>(k, groups, n, m, bits);
  }
}

template <class V>
void nm_mask(const void* w, int elem_size, int64_t groups, int n, int m, uint8_t* bits) {
  std::memset(bits, 0, static_cast<size_t>((groups * m + 7) / 8));
  switch (elem_size) {
    case 2:
      nm_groups_any<uint16_t>(w, groups, n, m, bits);
      break;
    case 4:
      nm_groups_any<uint32_t>(w, groups, n, m, bits);
      break;
    default:
      nm_groups_any<uint64_t>(w, groups, n, m, bits);
  }
}

/// Number of elements of [0, n) whose key equals `threshold`.
template <class V>
int64_t count_key(const void* w, int elem_size, int64_t n, uint64_t threshold) {
  int64_t c = 0;
  for (int64_t i = 0; i < n; ++i) c += magnitude_key(w, elem_size, i) == threshold;
  return c;
}

/// Keeps key > threshold, and the first `ties_kept` elements whose key == threshold (in index
/// order); prunes the rest. Writes ceil(n / 8) bytes.
template <class V>
void threshold_mask(const void* w, int elem_size, int64_t n, uint64_t threshold, int64_t ties_kept,
                    uint8_t* bits) {
  std::memset(bits, 0, static_cast<size_t>((n + 7) / 8));
  for (int64_t i = 0; i < n; ++i) {
    const uint64_t k = magnitude_key(w, elem_size, i);
    bool keep = k > threshold;
    if (k == threshold && ties_kept > 0) {
      keep = true;
      --ties_kept;
    }
    if (keep) bits[i >> 3] |= static_cast<uint8_t>(1u << (i & 7));
  }
}

}  // namespace TORCHSPEED_CPU_ISA_NAMESPACE
}  // namespace torchspeed::kernels::cpu
