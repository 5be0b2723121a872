// grad_stats kernel template: sum of squares and a non-finite flag over one contiguous range,
// optionally unscaling in place, in one read (and at most one write) of the data.
#pragma once

#include "kernels/cpu/vec.h"

namespace torchspeed::kernels::cpu {
namespace TORCHSPEED_CPU_ISA_NAMESPACE {

/// V is the vector type (VecAvx512, VecAvx2, ScalarVec<float> or ScalarVec<double>), T the
/// storage type. Each fp32 accumulator lane sums at most 64 squares before the partial sums are
/// added into a double, so the result is accurate to ~1e-7 relative for any length and ISA.
template <class V, typename T>
void grad_stats_range(T* data, int64_t n, const float* inv_scale, GradStatsPartial* out) {
  using S = typename V::Scalar;
  constexpr int64_t W = V::kWidth;
  constexpr int64_t kFlush = 4 * 64 * W;  // 4 accumulators x 64 values per lane
  const bool unscale = inv_scale != nullptr;
  const float scale = unscale ? *inv_scale : 1.f;
  const V vscale(scale);
  // x - x is 0 for finite x and NaN for inf/NaN: summing it flags non-finite values without a
  // branch or a compare in the loop (the build never uses -ffast-math).
  V nonfinite(0.f);
  double sumsq = 0.0;
  int64_t i = 0;
  while (n - i >= W) {
    const int64_t stop = i + ((n - i < kFlush ? n - i : kFlush) / W) * W;
    V acc0(0.f), acc1(0.f), acc2(0.f), acc3(0.f);
    for (; i + 4 * W <= stop; i += 4 * W) {
      V x0 = V::load(data + i), x1 = V::load(data + i + W);
      V x2 = V::load(data + i + 2 * W), x3 = V::load(data + i + 3 * W);
      nonfinite = nonfinite + ((x0 - x0) + (x1 - x1)) + ((x2 - x2) + (x3 - x3));
      if (unscale) {
        x0 = x0 * vscale, x1 = x1 * vscale, x2 = x2 * vscale, x3 = x3 * vscale;
        x0.store(data + i), x1.store(data + i + W);
        x2.store(data + i + 2 * W), x3.store(data + i + 3 * W);
      }
      acc0 = fma(x0, x0, acc0), acc1 = fma(x1, x1, acc1);
      acc2 = fma(x2, x2, acc2), acc3 = fma(x3, x3, acc3);
    }
    for (; i < stop; i += W) {
      V x = V::load(data + i);
      nonfinite = nonfinite + (x - x);
      if (unscale) {
        x = x * vscale;
        x.store(data + i);
      }
      acc0 = fma(x, x, acc0);
    }
    sumsq += ((acc0 + acc1) + (acc2 + acc3)).reduce_add();
  }
  // Tail: the same arithmetic, one lane at a time.
  S tail_nonfinite(0.f);
  for (; i < n; ++i) {
    S x = S::load(data + i);
    tail_nonfinite = tail_nonfinite + (x - x);
    if (unscale) {
      x = x * S(scale);
      x.store(data + i);
    }
    sumsq += (x * x).reduce_add();
  }
  out->sumsq = sumsq;
  out->nonfinite = std::isnan(nonfinite.reduce_add()) || std::isnan(tail_nonfinite.reduce_add());
}

/// The table entry: picks the storage type. Doubles run one lane at a time in every ISA.
template <class V>
void grad_stats(DType dtype, void* data, int64_t n, const float* inv_scale, GradStatsPartial* out) {
  switch (dtype) {
    case DType::kFloat:
      return grad_stats_range<V>(static_cast<float*>(data), n, inv_scale, out);
    case DType::kBFloat16:
      return grad_stats_range<V>(static_cast<bf16*>(data), n, inv_scale, out);
    case DType::kHalf:
      return grad_stats_range<V>(static_cast<fp16*>(data), n, inv_scale, out);
    case DType::kDouble:
      return grad_stats_range<ScalarVec<double>>(static_cast<double*>(data), n, inv_scale, out);
  }
}

}  // namespace TORCHSPEED_CPU_ISA_NAMESPACE
}  // namespace torchspeed::kernels::cpu
