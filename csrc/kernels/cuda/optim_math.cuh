// Per-element math of the fused optimizer steps, as __host__ __device__ functions: optim.cu runs
// them on the GPU, and tests/cpp/test_cuda_math_host.cpp (a host build with -ffp-contract=off)
// compares them bit for bit with the CPU kernel templates in kernels/cpu/optim.h, which they mirror
// line by line (same operation order, fma exactly where the CPU calls fma, IEEE-rounded ops
// elsewhere). The per-tensor scalars come from kernels/common/step_scalars.h, as on the CPU.
#pragma once

#include "kernels/common/exact_math.h"
#include "kernels/common/optim_types.h"

namespace torchspeed::kernels::cuda {

// ---- per element --------------------------------------------------------------------------------

/// load_grad: scaled (AMP unscale x clip coefficient) and negated for maximize.
TORCHSPEED_HD float scale_grad(const OptimHyper& h, const StepScalars& s, float g) {
  if (s.grad_scale != 1.f) g = f_mul(g, s.grad_scale);
  return h.maximize ? -g : g;
}

/// adam_range. vmax: in, the stored max_exp_avg_sq; out, the new one (amsgrad only).
TORCHSPEED_HD void adam_element(const OptimHyper& h, const StepScalars& s, float g, float& p,
                                float& m, float& v, float& vmax) {
  if (h.weight_decay != 0.f) {
    if (h.decoupled_weight_decay) {
      p = f_mul(p, s.param_decay);  // param.mul_(1 - lr * wd)
    } else {
      g = f_fma(p, h.weight_decay, g);  // grad.add(param, alpha=wd)
    }
  }
  m = f_fma(h.one_minus_beta1, f_sub(g, m), m);                    // exp_avg.lerp_(grad, 1 - b1)
  v = f_fma(f_mul(h.one_minus_beta2, g), g, f_mul(v, h.beta2_f));  // mul_(b2).addcmul_(g, g, 1-b2)
  float v_used = v;
  if (h.amsgrad) v_used = vmax = max_gt(vmax, v);
  const float denom = f_add(f_div(f_sqrt(v_used), s.bias_correction2_sqrt), h.eps);
  p = f_add(p, f_div(f_mul(-s.step_size, m), denom));  // addcdiv_(exp_avg, denom, -step_size)
}

/// sgd_range. buf: in, the stored momentum buffer (ignored on the first step); out, the new one.
TORCHSPEED_HD void sgd_element(const OptimHyper& h, const StepScalars& s, float g, float& p,
                               float& buf) {
  if (h.weight_decay != 0.f) g = f_fma(p, h.weight_decay, g);
  if (h.momentum != 0.f) {
    buf = h.first_step ? g  // first step: buffer = clone(grad)
                       : f_fma(g, h.one_minus_dampening, f_mul(buf, h.momentum));
    g = h.nesterov ? f_fma(buf, h.momentum, g) : buf;
  }
  p = f_fma(g, -s.lr, p);
}

/// lion_range.
TORCHSPEED_HD void lion_element(const OptimHyper& h, const StepScalars& s, float g, float& p,
                                float& m) {
  if (h.weight_decay != 0.f) p = f_mul(p, s.param_decay);
  const float direction = f_sign(f_fma(h.one_minus_beta1, f_sub(g, m), m));
  p = f_fma(direction, -s.lr, p);
  m = f_fma(h.one_minus_beta2, f_sub(g, m), m);  // m = lerp(m, g, 1 - b2)
}

/// lamb_phase1_range's moment update.
TORCHSPEED_HD void lamb_moments(const OptimHyper& h, float g, float& m, float& v) {
  m = f_fma(h.one_minus_beta1, f_sub(g, m), m);
  v = f_fma(f_mul(h.one_minus_beta2, g), g, f_mul(v, h.beta2_f));
}

/// LAMB's raw update u = m_hat / (sqrt(v_hat) + eps) + wd * p from the updated moments.
TORCHSPEED_HD float lamb_update(const OptimHyper& h, const StepScalars& s, float m, float v,
                                float p) {
  const float m_hat = f_div(m, s.bias_correction1);
  const float v_hat = f_div(v, s.bias_correction2);
  return f_fma(h.weight_decay, p, f_div(m_hat, f_add(f_sqrt(v_hat), h.eps)));
}

/// lamb_phase2_range: p -= lr * trust * u (step_size carries lr * trust).
TORCHSPEED_HD float lamb_apply(const OptimHyper& h, const StepScalars& s, float m, float v,
                               float p) {
  return f_fma(lamb_update(h, s, m, v, p), -s.step_size, p);
}

/// store_param: the pruning mask zeroes the param where its bit is 0.
TORCHSPEED_HD float apply_mask(bool keep, float p) { return keep ? p : 0.f; }
/// Bit i of a packed mask (bit j of byte b = element 8b + j).
TORCHSPEED_HD bool mask_bit(const uint8_t* bits, int64_t i) {
  return (bits[i >> 3] >> (i & 7)) & 1u;
}

/// store_param: ema += (1 - ema_decay) * (param - ema).
TORCHSPEED_HD float ema_update(const OptimHyper& h, float p, float ema) {
  return f_fma(h.one_minus_ema_decay, f_sub(p, ema), ema);
}

}  // namespace torchspeed::kernels::cuda
