// The dist area's bucket kernel: out = in * scale over one contiguous range, converting between
// fp32, bf16 and fp16 on the way (or fp64 to fp64). One pass fuses the reducer's 1/world_size
// division with the bf16/fp16 compression cast, and the same kernel widens the reduced values back.
#pragma once

#include <type_traits>

#include "kernels/cpu/vec.h"

namespace torchspeed::kernels::cpu {
namespace TORCHSPEED_CPU_ISA_NAMESPACE {

/// V is the float vector type; In/Out the storage types. `in` and `out` may be the same memory
/// (in-place scale) but must not overlap otherwise. Each element is rounded once, to Out.
template <class V, typename In, typename Out>
void scale_cast_range(const In* in, Out* out, float scale, int64_t n) {
  using S = typename V::Scalar;
  constexpr int64_t W = V::kWidth;
  const V vs(scale);
  int64_t i = 0;
  for (; i + 2 * W <= n; i += 2 * W) {
    const V a = V::load(in + i) * vs, b = V::load(in + i + W) * vs;
    a.store(out + i);
    b.store(out + i + W);
  }
  for (; i + W <= n; i += W) (V::load(in + i) * vs).store(out + i);
  for (; i < n; ++i) (S::load(in + i) * S(scale)).store(out + i);
}

/// Double in, double out, in double arithmetic (the fp64 reducer path; scale is exact for a
/// power-of-two world size, and otherwise rounded once from the double 1/world_size).
inline void scale_range_f64(const double* in, double* out, double scale, int64_t n) {
  for (int64_t i = 0; i < n; ++i) out[i] = in[i] * scale;
}

/// The table's entry: dispatches on the (in, out) dtype pair. Returns false for a pair the kernel
/// does not implement (fp64 with anything but fp64); the op's validator rejects those first.
template <class V>
bool scale_cast(DType in_dtype, const void* in, DType out_dtype, void* out, double scale,
                int64_t n) {
  const float s = static_cast<float>(scale);
  auto run = [&](auto* typed_in) {
    using In = std::remove_const_t<std::remove_pointer_t<decltype(typed_in)>>;
    switch (out_dtype) {
      case DType::kFloat:
        scale_cast_range<V, In, float>(typed_in, static_cast<float*>(out), s, n);
        return true;
      case DType::kBFloat16:
        scale_cast_range<V, In, bf16>(typed_in, static_cast<bf16*>(out), s, n);
        return true;
      case DType::kHalf:
        scale_cast_range<V, In, fp16>(typed_in, static_cast<fp16*>(out), s, n);
        return true;
      default:
        return false;
    }
  };
  switch (in_dtype) {
    case DType::kDouble:
      if (out_dtype != DType::kDouble) return false;
      scale_range_f64(static_cast<const double*>(in), static_cast<double*>(out), scale, n);
      return true;
    case DType::kFloat:
      return run(static_cast<const float*>(in));
    case DType::kBFloat16:
      return run(static_cast<const bf16*>(in));
    case DType::kHalf:
      return run(static_cast<const fp16*>(in));
  }
  return false;
}

}  // namespace TORCHSPEED_CPU_ISA_NAMESPACE
}  // namespace torchspeed::kernels::cpu
