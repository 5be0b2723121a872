// Per-element math of the low-bit optimizer steps as __host__ __device__ functions: optim_lowbit.cu
// runs them on the GPU, and tests/cpp/test_cuda_math_host.cpp (a host build with -ffp-contract=off)
// compares them bit for bit with the CPU kernels (kernels/cpu/optim.h), whose operation order they
// mirror.
//   adam_lowbit_step_ (two moments; adam_bf16_range / adam_int8_range): adam_lowbit_moments, then
//     adam_lowbit_param with the bias correction as a multiplication by its inverse, then the
//     stochastic bf16 rounding or the int8 codes (rounded to nearest;
//     kernels/common/lowbit_codes.h).
//   lion_lowbit_step_ / sgd_lowbit_step_ (one signed moment; signed_moment_bf16_range /
//     signed_moment_int8_range): the fp32 step's lion_element / sgd_element (optim_math.cuh) on the
//     dequantized moment, then the bf16 rounding (the high 16 bits of the element's hash) or the
//     int8 codes rounded stochastically (its low 20 bits).
#pragma once

#include <cstdint>

#include "kernels/common/exact_math.h"
#include "kernels/common/lowbit_codes.h"
#include "kernels/common/optim_types.h"
#include "kernels/cuda/optim_math.cuh"

namespace torchspeed::kernels::cuda {

/// 1 / sqrt(1 - beta2^step): computed once per tensor, as the CPU kernels do once per range.
TORCHSPEED_HD float adam_lowbit_inv_bc2(const StepScalars& s) {
  return f_div(1.f, s.bias_correction2_sqrt);
}

/// adam_lowbit_moments: the new fp32 moments from the old ones. g: the scaled grad (scale_grad);
/// p: the param's fp32 value (the master when there is one) before the step.
TORCHSPEED_HD void adam_lowbit_moments(const OptimHyper& h, float g, float p, float& m, float& v) {
  if (h.weight_decay != 0.f && !h.decoupled_weight_decay) g = f_fma(p, h.weight_decay, g);
  m = f_fma(h.one_minus_beta1, f_sub(g, m), m);
  v = f_fma(f_mul(h.one_minus_beta2, g), g, f_mul(v, h.beta2_f));
}

/// adam_lowbit_param: the new param (before the mask) from its old value and the new moments.
TORCHSPEED_HD float adam_lowbit_param(const OptimHyper& h, const StepScalars& s, float inv_bc2,
                                      float p, float m, float v) {
  if (h.weight_decay != 0.f && h.decoupled_weight_decay) p = f_mul(p, s.param_decay);
  const float denom = f_fma(f_sqrt(v), inv_bc2, h.eps);
  return f_add(p, f_div(f_mul(-s.step_size, m), denom));
}

/// adam_bf16_range for one element: m, v are the stored bf16 moments (widened, exact); p: in, the
/// param's fp32 value, out, the new one (before the mask); m_out, v_out: the new moments' bf16
/// bits, rounded stochastically with the element's noise (lowbit_sr_noise of its index in the
/// param and the tensor's salt): m takes the high 16 bits, v the low 16.
TORCHSPEED_HD void adam_bf16_element(const OptimHyper& h, const StepScalars& s, float inv_bc2,
                                     uint32_t noise, float g, float& p, float m, float v,
                                     uint16_t& m_out, uint16_t& v_out) {
  adam_lowbit_moments(h, g, p, m, v);
  p = adam_lowbit_param(h, s, inv_bc2, p, m, v);
  m_out = lowbit_bf16_stochastic(m, noise >> 16);
  v_out = lowbit_bf16_stochastic(v, noise & 0xFFFFu);
}

// ---- int8: per block, three phases --------------------------------------------------------------
// 1. adam_int8_moments for every element: dequantize with the block's old absmaxes, update the
//    moments (kept in fp32), fold them into the block's running absmaxes (lowbit_absmax_m / _v,
//    from +0; NaN skipped, so the result is the same in any order: the GPU reduces a block over
//    its threads, the CPU over vector lanes);
// 2. the block's new absmaxes are written as they are (inf included), and their inverses taken
//    (lowbit_inverse: 0 for an all-zero or non-finite block, whose codes are then 0);
// 3. adam_int8_finish for every element: the param update from the fp32 moments, the new codes.

TORCHSPEED_HD void adam_int8_moments(const OptimHyper& h, float g, float p, int8_t m_code,
                                     uint8_t v_code, float m_absmax, float v_absmax, float& m,
                                     float& v, float& m_acc, float& v_acc) {
  m = lowbit_decode_m(m_code, m_absmax);
  v = lowbit_decode_v(v_code, v_absmax);
  adam_lowbit_moments(h, g, p, m, v);
  m_acc = lowbit_absmax_m(m_acc, m);
  v_acc = lowbit_absmax_v(v_acc, v);
}

TORCHSPEED_HD void adam_int8_finish(const OptimHyper& h, const StepScalars& s, float inv_bc2,
                                    float m_inv, float v_inv, float m, float v, float& p,
                                    int8_t& m_code, uint8_t& v_code) {
  p = adam_lowbit_param(h, s, inv_bc2, p, m, v);
  m_code = lowbit_encode_m(m, m_inv);
  v_code = lowbit_encode_v(v, v_inv);
}

// ---- one signed moment: Lion's exp_avg, SGD's momentum buffer ---------------------------------
// kAlgo: OptimAlgo::kLion or OptimAlgo::kSgd (with momentum: the op refuses a low-bit SGD without).

/// The fp32 step of one element: p (the param's fp32 value) and m (the moment, dequantized) in,
/// the new ones (p before the mask) out. SGD's first step ignores m (the buffer starts as the
/// grad).
template <OptimAlgo kAlgo>
TORCHSPEED_HD void signed_moment_update(const OptimHyper& h, const StepScalars& s, float g,
                                        float& p, float& m) {
  static_assert(kAlgo == OptimAlgo::kLion || kAlgo == OptimAlgo::kSgd,
                "one signed low-bit moment: Lion or SGD");
  if constexpr (kAlgo == OptimAlgo::kLion) {
    lion_element(h, s, g, p, m);
  } else {
    sgd_element(h, s, g, p, m);
  }
}

/// signed_moment_bf16_range for one element: m is the stored bf16 moment (widened, exact); p as
/// in signed_moment_update; m_out: the new moment's bf16 bits, rounded stochastically with the high
/// 16 bits of the element's noise (lowbit_sr_noise), as Adam's first moment.
template <OptimAlgo kAlgo>
TORCHSPEED_HD void signed_moment_bf16_element(const OptimHyper& h, const StepScalars& s,
                                              uint32_t noise, float g, float& p, float m,
                                              uint16_t& m_out) {
  signed_moment_update<kAlgo>(h, s, g, p, m);
  m_out = lowbit_bf16_stochastic(m, noise >> 16);
}

// int8, per block, in two phases (the param does not depend on the new absmax):
// 1. signed_moment_int8_update for every element: dequantize with the block's old absmax, step
//    (the param is final here), fold the new moment into the block's running absmax (from +0, NaN
//    skipped: the same in any order);
// 2. the block's new absmax is written as it is, its inverse taken (lowbit_inverse), and
//    signed_moment_int8_code gives every element's code, rounded stochastically with the low 20
//    bits of its noise.

template <OptimAlgo kAlgo>
TORCHSPEED_HD void signed_moment_int8_update(const OptimHyper& h, const StepScalars& s, float g,
                                             float& p, int8_t code, float absmax, float& m,
                                             float& acc) {
  m = lowbit_decode_m(code, absmax);
  signed_moment_update<kAlgo>(h, s, g, p, m);
  acc = lowbit_absmax_m(acc, m);
}

TORCHSPEED_HD int8_t signed_moment_int8_code(float m, float inv, uint32_t noise) {
  return lowbit_encode_m_stochastic(m, inv, noise & 0xFFFFFu);
}

}  // namespace torchspeed::kernels::cuda
