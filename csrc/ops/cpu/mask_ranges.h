// What the CPU kernels over packed masks share (ops/cpu/mask_cpu.cpp, ops/cpu/prune_cpu.cpp): the
// ISA table's mask kernels and a parallel loop over ranges that start on a mask byte.
#pragma once

#include <ATen/Parallel.h>

#include <algorithm>
#include <cstdint>

#include "kernels/cpu/dispatch.h"
#include "ops/checks.h"
#include "ops/cpu/chunking.h"

namespace torchspeed::ops {

static_assert(kChunkElements % 8 == 0, "ranges must start on a mask byte");

/// The ISA table's packed-mask kernels (pack, unpack, apply and the prune area's selection).
inline const kernels::cpu::PruneKernels& mask_kernels(const char* op) {
  return rethrow_as_torch_error(op, [] { return &kernels::cpu::cpu_kernels(); })->prune;
}

/// fn(begin, length) over [0, total) in ranges of `step` elements (a multiple of 8), in parallel.
template <class F>
inline void for_each_range(int64_t total, int64_t step, F&& fn) {
  if (total == 0) return;
  const int64_t ranges = (total + step - 1) / step;
  const int64_t grain = std::max<int64_t>(1, kSerialElements / step);
  at::parallel_for(0, ranges, grain, [&](int64_t b, int64_t e) {
    for (int64_t r = b; r < e; ++r) fn(r * step, std::min(step, total - r * step));
  });
}

}  // namespace torchspeed::ops
