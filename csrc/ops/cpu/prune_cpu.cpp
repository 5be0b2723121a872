// CPU implementation of the prune area's ops (nm_mask, magnitude_mask): validates, then runs the
// ISA kernels (kernels/cpu/prune.h) over ranges that start on a mask byte, in one parallel region.
// magnitude_mask selects its threshold with std::nth_element over the magnitude keys, then the
// kernel builds the mask, splitting the threshold's ties by a prefix count over the ranges.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <algorithm>
#include <vector>

#include "kernels/cpu/dispatch.h"
#include "ops/cpu/mask_ranges.h"
#include "ops/prune_checks.h"

namespace torchspeed::ops {
namespace {

at::Tensor nm_mask_cpu(const NmMaskArgs& a) {
  validate(a);
  const auto& k = mask_kernels(NmMaskArgs::kName);
  const int64_t numel = a.w.numel();
  at::Tensor out = at::empty({packed_mask_bytes(numel)}, a.w.options().dtype(at::kByte));
  const int es = static_cast<int>(a.w.element_size());
  const char* w = static_cast<const char*>(a.w.const_data_ptr());
  uint8_t* o = out.data_ptr<uint8_t>();
  if (a.m == 0 || numel == 0) return out;
  // Ranges of 8 * g groups: they start on a group and on a mask byte.
  const int64_t step = 8 * a.m * std::max<int64_t>(1, kChunkElements / (8 * a.m));
  for_each_range(numel, step, [&](int64_t b, int64_t len) {
    k.nm_mask(w + b * es, es, len / a.m, static_cast<int>(a.n), static_cast<int>(a.m), o + b / 8);
  });
  return out;
}

/// The k-th smallest (1-based) of n keys, reordering them (std::nth_element: expected O(n));
/// `below` gets how many keys are smaller than it.
template <typename K>
K select_key(K* keys, int64_t n, int64_t k, int64_t* below) {
  std::nth_element(keys, keys + (k - 1), keys + n);
  const K t = keys[k - 1];
  int64_t equal_before = 0;  // the k - 1 keys before it are <= t
  for (int64_t i = 0; i < k - 1; ++i) equal_before += keys[i] == t;
  *below = (k - 1) - equal_before;
  return t;
}

at::Tensor magnitude_mask_cpu(const MagnitudeMaskArgs& a) {
  validate(a);
  const auto& k = mask_kernels(MagnitudeMaskArgs::kName);
  const int64_t numel = a.w.numel();
  at::Tensor out = at::empty({packed_mask_bytes(numel)}, a.w.options().dtype(at::kByte));
  if (numel == 0) return out;
  int64_t threshold = -1;  // amount == 0: every key (>= 0) is above it
  int64_t below = 0;       // keys < threshold
  if (a.amount > 0) {
    // The amount-th smallest key: a selection over a scratch copy of the keys (a fresh tensor).
    at::Tensor keys = magnitude_keys(a.w);
    AT_DISPATCH_INTEGRAL_TYPES(keys.scalar_type(), "magnitude_mask", [&] {
      threshold =
          static_cast<int64_t>(select_key(keys.data_ptr<scalar_t>(), numel, a.amount, &below));
    });
  }
  const int es = static_cast<int>(a.w.element_size());
  const char* w = static_cast<const char*>(a.w.const_data_ptr());
  uint8_t* o = out.data_ptr<uint8_t>();
  const int64_t ranges = (numel + kChunkElements - 1) / kChunkElements;
  // The kernels take the key unsigned; -1 (amount == 0) becomes "no element is a tie" below.
  const uint64_t thr = threshold < 0 ? 0 : static_cast<uint64_t>(threshold);
  std::vector<int64_t> ties_before(static_cast<size_t>(ranges) + 1, 0);
  if (threshold >= 0) {
    std::vector<int64_t> per_range(static_cast<size_t>(ranges), 0);
    for_each_range(numel, kChunkElements, [&](int64_t b, int64_t len) {
      per_range[b / kChunkElements] = k.count_key(w + b * es, es, len, thr);
    });
    for (int64_t r = 0; r < ranges; ++r) ties_before[r + 1] = ties_before[r] + per_range[r];
  }
  // The first ties in memory order are kept: all of them but the (amount - below) pruned.
  const int64_t ties_kept = threshold < 0 ? 0 : ties_before[ranges] - (a.amount - below);
  for_each_range(numel, kChunkElements, [&](int64_t b, int64_t len) {
    if (threshold < 0) {  // keep everything
      std::fill(o + b / 8, o + b / 8 + packed_mask_bytes(len), uint8_t{0xff});
      if (len % 8) o[b / 8 + len / 8] = static_cast<uint8_t>((1u << (len % 8)) - 1);
      return;
    }
    const int64_t budget =
        std::clamp<int64_t>(ties_kept - ties_before[b / kChunkElements], 0, int64_t{1} << 62);
    k.threshold_mask(w + b * es, es, len, thr, budget, o + b / 8);
  });
  return out;
}

}  // namespace

TORCH_LIBRARY_IMPL(torchspeed, CPU, m) {
  TORCHSPEED_OP_IMPL(m, NmMaskArgs, nm_mask_cpu);
  TORCHSPEED_OP_IMPL(m, MagnitudeMaskArgs, magnitude_mask_cpu);
}

}  // namespace torchspeed::ops
