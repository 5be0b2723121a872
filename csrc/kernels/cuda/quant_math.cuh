// Per-element math of the quant area's CUDA kernels (quant_fake_quant.cu, quant_int8_linear.cu), as
// __host__ __device__ functions: the kernels run them on the GPU, and
// tests/cpp/test_cuda_math_host.cpp (a host build with -ffp-contract=off) compares them bit for bit
// with the CPU formulas: the ISA kernel templates (kernels/cpu/quant.h, scalar lanes) for
// fake-quant, and the contract of kernels/cuda/api.cuh for the int8 Linear (row scale, row
// quantization, epilogue). Every operation is one IEEE-rounded fp32 op, none is contracted.
#pragma once

#include <cfloat>
#include <cmath>
#include <cstdint>

#include "kernels/common/exact_math.h"

namespace torchspeed::kernels::cuda {

/// Round to the nearest integer, ties to even (torch.round, std::nearbyint in the default mode).
TORCHSPEED_HD float round_half_even(float a) {
#if defined(__CUDA_ARCH__)
  return rintf(a);
#else
  return std::nearbyint(a);
#endif
}

/// a < b ? a : b (NaN in a yields b, as the CPU's min).
TORCHSPEED_HD float min_lt(float a, float b) { return a < b ? a : b; }

// ---- fake-quant ---------------------------------------------------------------------------------

/// One element of fake_quantize: returns y in fp32 and sets `in_range` (the STE mask):
///   v = round_half_even(x * inv_scale) + zero_point, c = clamp(v, qmin, qmax)
///   y = (c - zero_point) * scale, in_range = (v == c)
/// (kernels/cpu/quant.h's fake_quantize_segment, operation for operation.)
TORCHSPEED_HD float fake_quant_element(float x, float scale, float inv_scale, float zero_point,
                                       float qmin, float qmax, bool& in_range) {
  const float v = f_add(round_half_even(f_mul(x, inv_scale)), zero_point);
  const float c = min_lt(max_gt(v, qmin), qmax);
  in_range = f_sub(v, c) == 0.f;
  return f_mul(f_sub(c, zero_point), scale);
}

// ---- the int8 Linear (api.cuh: quantize_rows_int8, int8_linear) ---------------------------------

/// |x| for the row absmax, with inf or NaN mapped to +inf, so that a max reduction (max_gt, which
/// drops NaN) still sees them and row_scale_int8 turns the row's scale into NaN.
TORCHSPEED_HD float absmax_operand(float x) {
#if defined(__CUDA_ARCH__)
  const float a = fabsf(x);
#else
  const float a = std::fabs(x);
#endif
  return a <= FLT_MAX ? a : INFINITY;
}

/// scale = absmax / 127 (fp32 division), 1 when absmax == 0, NaN when the row held inf or NaN.
TORCHSPEED_HD float row_scale_int8(float absmax) {
  if (absmax == 0.f) return 1.f;
  if (!(absmax <= FLT_MAX)) return NAN;
  return f_div(absmax, 127.f);
}

/// q = clamp(round_half_even(x * inv_scale), -127, 127), inv_scale = 1 / scale in fp32. (NaN
/// lanes, only in rows whose scale is NaN, give -127: unspecified by the contract.)
TORCHSPEED_HD int8_t quantize_row_element(float x, float inv_scale) {
  const float q = min_lt(max_gt(round_half_even(f_mul(x, inv_scale)), -127.f), 127.f);
  return static_cast<int8_t>(static_cast<int32_t>(q));
}

/// out = act(float(acc) * (a_scale * w_scale) + bias) in fp32, unfused; `has_bias` false skips the
/// addition; ReLU is v < 0 ? 0 : v (NaN passes through, as torch.relu).
TORCHSPEED_HD float int8_linear_epilogue(int32_t acc, float a_scale, float w_scale, float bias,
                                         bool has_bias, bool relu) {
  float v = f_mul(static_cast<float>(acc), f_mul(a_scale, w_scale));
  if (has_bias) v = f_add(v, bias);
  if (relu && v < 0.f) v = 0.f;
  return v;
}

}  // namespace torchspeed::kernels::cuda
