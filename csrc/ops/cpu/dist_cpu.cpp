// CPU implementation of torchspeed::scale_cast_: validates, then runs the ISA kernel
// (kernels/cpu/dist_bucket.h) over 64K-element chunks in one parallel region.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <algorithm>
#include <atomic>

#include "kernels/cpu/dispatch.h"
#include "ops/cpu/chunking.h"
#include "ops/dist_checks.h"

namespace torchspeed::ops {
namespace {

void scale_cast_cpu(const ScaleCastArgs& a) {
  validate(a);
  const char* op = ScaleCastArgs::kName;
  const auto& table = *rethrow_as_torch_error(op, [] { return &kernels::cpu::cpu_kernels(); });
  const int64_t n = a.src.numel();
  if (n == 0) return;
  const auto in_dtype = kernel_dtype(a.src.scalar_type());
  const auto out_dtype = kernel_dtype(a.out.scalar_type());
  const char* in = static_cast<const char*>(a.src.data_ptr());
  char* out = static_cast<char*>(a.out.data_ptr());
  const int64_t in_size = a.src.element_size(), out_size = a.out.element_size();
  std::atomic<bool> ok{true};
  at::parallel_for(0, (n + kChunkElements - 1) / kChunkElements, 1, [&](int64_t b, int64_t e) {
    for (int64_t c = b; c < e; ++c) {
      const int64_t begin = c * kChunkElements;
      const int64_t len = std::min(kChunkElements, n - begin);
      if (!table.dist.scale_cast(in_dtype, in + begin * in_size, out_dtype, out + begin * out_size,
                                 a.scale, len)) {
        ok = false;
      }
    }
  });
  TORCH_INTERNAL_ASSERT(ok, "torchspeed.", op, ": the validator let through ", a.src.scalar_type(),
                        " -> ", a.out.scalar_type());
}

}  // namespace

TORCH_LIBRARY_IMPL(torchspeed, CPU, m) { TORCHSPEED_OP_IMPL(m, ScaleCastArgs, scale_cast_cpu); }

}  // namespace torchspeed::ops
