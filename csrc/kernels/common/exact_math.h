// IEEE-exact scalar arithmetic for code compiled both by nvcc for the device and by the host
// compiler: on the device the _rn intrinsics forbid contraction into an fma; a host build that
// compares bit for bit with the CPU kernels must use -ffp-contract=off.
//
// Inline code: include it from the op glue, the CUDA kernels and tests, never from a CPU ISA unit
// (the ODR rule in csrc/kernels/README.md).
#pragma once

#include <cmath>

#if defined(__CUDACC__)
#define TORCHSPEED_HD __host__ __device__ __forceinline__
#else
#define TORCHSPEED_HD inline
#endif

namespace torchspeed::kernels {

TORCHSPEED_HD float f_add(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fadd_rn(a, b);
#else
  return a + b;
#endif
}
TORCHSPEED_HD float f_sub(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fsub_rn(a, b);
#else
  return a - b;
#endif
}
TORCHSPEED_HD float f_mul(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fmul_rn(a, b);
#else
  return a * b;
#endif
}
TORCHSPEED_HD float f_div(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fdiv_rn(a, b);
#else
  return a / b;
#endif
}
TORCHSPEED_HD float f_fma(float a, float b, float c) {
#if defined(__CUDA_ARCH__)
  return __fmaf_rn(a, b, c);
#else
  return std::fma(a, b, c);
#endif
}
TORCHSPEED_HD float f_sqrt(float a) {
#if defined(__CUDA_ARCH__)
  return __fsqrt_rn(a);
#else
  return std::sqrt(a);
#endif
}
TORCHSPEED_HD double d_sub(double a, double b) {
#if defined(__CUDA_ARCH__)
  return __dsub_rn(a, b);
#else
  return a - b;
#endif
}
TORCHSPEED_HD double d_mul(double a, double b) {
#if defined(__CUDA_ARCH__)
  return __dmul_rn(a, b);
#else
  return a * b;
#endif
}
TORCHSPEED_HD double d_div(double a, double b) {
#if defined(__CUDA_ARCH__)
  return __ddiv_rn(a, b);
#else
  return a / b;
#endif
}
TORCHSPEED_HD double d_sqrt(double a) {
#if defined(__CUDA_ARCH__)
  return __dsqrt_rn(a);
#else
  return std::sqrt(a);
#endif
}
/// a > b ? a : b: NaN in b yields NaN, NaN in a yields b (as the CPU's max).
TORCHSPEED_HD float max_gt(float a, float b) { return a > b ? a : b; }
/// +1, -1 or 0 (sign(0) = sign(NaN) = 0, as the CPU kernels).
TORCHSPEED_HD float f_sign(float a) { return static_cast<float>((a > 0.f) - (a < 0.f)); }

}  // namespace torchspeed::kernels
