// The quant area's int8 kernels: affine quantize q = clamp(round_even(x * inv_scale) + zero_point,
// -128, 127) (NaN gives 127), dequantize x = (q - zero_point) * scale and fake quantize (both, with
// the clamp mask), over one contiguous segment that shares its (scale, zero_point). fp32 arithmetic
// for every input dtype (bf16/fp16 are widened first), so the result equals torch's reference
// formula on x.float() bit for bit.
#pragma once

#include <type_traits>

#include "kernels/cpu/vec.h"

namespace torchspeed::kernels::cpu {
namespace TORCHSPEED_CPU_ISA_NAMESPACE {

template <class V, typename In>
void quantize_segment(const In* x, int8_t* q, int64_t n, float inv_scale, float zero_point) {
  using S = typename V::Scalar;
  constexpr int64_t W = V::kWidth;
  // Clamped from above first: min(NaN, hi) is hi (vec.h's min returns b unless a < b), so NaN
  // gives 127, as torch.quantize_per_tensor does; inf and -inf saturate at 127 and -128.
  auto body = [&](auto vx, auto inv, auto zp, auto lo, auto hi) {
    return max(min(round_even(vx * inv) + zp, hi), lo);
  };
  const V inv(inv_scale), zp(zero_point), lo(-128.f), hi(127.f);
  int64_t i = 0;
  for (; i + W <= n; i += W) body(V::load(x + i), inv, zp, lo, hi).store(q + i);
  for (; i < n; ++i) {
    body(S::load(x + i), S(inv_scale), S(zero_point), S(-128.f), S(127.f)).store(q + i);
  }
}

template <class V>
void dequantize_segment(const int8_t* q, float* out, int64_t n, float scale, float zero_point) {
  using S = typename V::Scalar;
  constexpr int64_t W = V::kWidth;
  const V vs(scale), zp(zero_point);
  int64_t i = 0;
  for (; i + W <= n; i += W) ((V::load(q + i) - zp) * vs).store(out + i);
  for (; i < n; ++i) ((S::load(q + i) - S(zero_point)) * S(scale)).store(out + i);
}

/// Fake quantization of one segment sharing (scale, zero_point), in fp32 for every input dtype:
///   v = round_even(x * inv_scale) + zp,  c = clamp(v, qmin, qmax)
///   y = (c - zp) * scale (stored in x's dtype),  mask = (v == c), i.e. qmin <= v <= qmax
/// (v - c is 0 exactly when v is in range; NaN x gives c = qmin and mask 0, as torch's cast does).
/// The mask is written as bytes 0/1 (a bool tensor's storage).
template <class V, typename In>
void fake_quantize_segment(const In* x, In* y, uint8_t* mask, int64_t n, float scale,
                           float inv_scale, float zero_point, float qmin, float qmax) {
  using S = typename V::Scalar;
  constexpr int64_t W = V::kWidth;
  auto body = [&](auto vx, auto s, auto inv, auto zp, auto lo, auto hi, auto one, auto* yp,
                  uint8_t* mp) {
    const auto v = round_even(vx * inv) + zp;
    const auto c = min(max(v, lo), hi);
    ((c - zp) * s).store(yp);
    (one - select_nonzero(v - c, one)).store(reinterpret_cast<int8_t*>(mp));
  };
  const V vs(scale), inv(inv_scale), zp(zero_point), lo(qmin), hi(qmax), one(1.f);
  int64_t i = 0;
  for (; i + W <= n; i += W) body(V::load(x + i), vs, inv, zp, lo, hi, one, y + i, mask + i);
  for (; i < n; ++i) {
    body(S::load(x + i), S(scale), S(inv_scale), S(zero_point), S(qmin), S(qmax), S(1.f), y + i,
         mask + i);
  }
}

/// out = grad * mask over one segment (mask bytes 0 / 1 read as float 0 / 1): the STE backward.
template <class V, typename T>
void fake_quantize_backward_segment(const T* grad, const uint8_t* mask, T* out, int64_t n) {
  using S = typename V::Scalar;
  constexpr int64_t W = V::kWidth;
  const auto* m = reinterpret_cast<const int8_t*>(mask);
  int64_t i = 0;
  for (; i + W <= n; i += W) (V::load(grad + i) * V::load(m + i)).store(out + i);
  for (; i < n; ++i) (S::load(grad + i) * S::load(m + i)).store(out + i);
}

/// The table's entries: quantize dispatches on the input dtype (fp32, bf16, fp16); false for
/// another (the op's validator rejects it first).
template <class V>
bool quantize_int8(DType in_dtype, const void* x, int8_t* q, int64_t n, float inv_scale,
                   float zero_point) {
  switch (in_dtype) {
    case DType::kFloat:
      quantize_segment<V>(static_cast<const float*>(x), q, n, inv_scale, zero_point);
      return true;
    case DType::kBFloat16:
      quantize_segment<V>(static_cast<const bf16*>(x), q, n, inv_scale, zero_point);
      return true;
    case DType::kHalf:
      quantize_segment<V>(static_cast<const fp16*>(x), q, n, inv_scale, zero_point);
      return true;
    default:
      return false;
  }
}

template <class V>
void dequantize_int8(const int8_t* q, float* out, int64_t n, float scale, float zero_point) {
  dequantize_segment<V>(q, out, n, scale, zero_point);
}

template <class V>
bool fake_quantize(DType dtype, const void* x, void* y, uint8_t* mask, int64_t n, float scale,
                   float inv_scale, float zero_point, float quant_min, float quant_max) {
  switch (dtype) {
    case DType::kFloat:
      fake_quantize_segment<V>(static_cast<const float*>(x), static_cast<float*>(y), mask, n, scale,
                               inv_scale, zero_point, quant_min, quant_max);
      return true;
    case DType::kBFloat16:
      fake_quantize_segment<V>(static_cast<const bf16*>(x), static_cast<bf16*>(y), mask, n, scale,
                               inv_scale, zero_point, quant_min, quant_max);
      return true;
    case DType::kHalf:
      fake_quantize_segment<V>(static_cast<const fp16*>(x), static_cast<fp16*>(y), mask, n, scale,
                               inv_scale, zero_point, quant_min, quant_max);
      return true;
    default:
      return false;
  }
}

template <class V>
bool fake_quantize_backward(DType dtype, const void* grad, const uint8_t* mask, void* out,
                            int64_t n) {
  switch (dtype) {
    case DType::kFloat:
      fake_quantize_backward_segment<V>(static_cast<const float*>(grad), mask,
                                        static_cast<float*>(out), n);
      return true;
    case DType::kBFloat16:
      fake_quantize_backward_segment<V>(static_cast<const bf16*>(grad), mask,
                                        static_cast<bf16*>(out), n);
      return true;
    case DType::kHalf:
      fake_quantize_backward_segment<V>(static_cast<const fp16*>(grad), mask,
                                        static_cast<fp16*>(out), n);
      return true;
    default:
      return false;
  }
}

}  // namespace TORCHSPEED_CPU_ISA_NAMESPACE
}  // namespace torchspeed::kernels::cpu
