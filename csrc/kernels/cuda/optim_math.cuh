// Per-element math and per-tensor scalars of the fused optimizer steps, as __host__ __device__
// functions: optim.cu runs them on the GPU, and a host build (g++, -ffp-contract=off) can compare
// them bit for bit with the CPU kernel templates in kernels/cpu/optim.h, which they mirror line by
// line (same operation order, fma exactly where the CPU calls fma, IEEE-rounded ops elsewhere).
#pragma once

#include <cmath>
#include <cstdint>

#include "kernels/cuda/api.cuh"

#if defined(__CUDACC__)
#define TORCHSPEED_HD __host__ __device__ __forceinline__
#else
#define TORCHSPEED_HD inline
#endif

namespace torchspeed::kernels::cuda {

// ---- IEEE-exact arithmetic: never contracted into an fma by the compiler
// ------------------------- On the device the _rn intrinsics forbid contraction; the host build
// must use -ffp-contract=off.

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
/// a > b ? a : b (as the CPU's max, including which operand a NaN yields).
TORCHSPEED_HD float max_gt(float a, float b) { return a > b ? a : b; }
/// +1, -1 or 0 (sign(0) = sign(NaN) = 0, as the CPU kernels).
TORCHSPEED_HD float f_sign(float a) { return static_cast<float>((a > 0.f) - (a < 0.f)); }

// ---- per-tensor scalars
// ----------------------------------------------------------------------------

/// Per-block scalars, as OptimScalars on the CPU.
struct BlockScalars {
  float lr;
  float grad_scale;  // AMP 1/scale times the clip coefficient
  float param_decay;
  float step_size;
  float bias_correction1;
  float bias_correction2;
  float bias_correction2_sqrt;
};

/// What run_step() in ops/cpu/optim_cpu.cpp derives on the host, from the device values:
/// lr (lr_tensor or the float lr), scale (grad_scale or 1), clip (clip_coef or 1), step (already
/// incremented; has_step false for SGD). LAMB phase 2 also passes the tensor's ||p||^2, ||u||^2.
TORCHSPEED_HD BlockScalars block_scalars(const OptimHyper& h, double lr, float scale, float clip,
                                         bool has_step, float step, bool lamb_phase2,
                                         double p_sumsq, double u_sumsq) {
  BlockScalars s;
  const float inv_scale = static_cast<float>(d_div(1.0, static_cast<double>(scale)));
  s.grad_scale = f_mul(inv_scale, clip);
  s.lr = static_cast<float>(lr);
  s.param_decay = static_cast<float>(d_sub(1.0, d_mul(lr, static_cast<double>(h.weight_decay))));
  s.step_size = 0.f;
  s.bias_correction1 = s.bias_correction2 = s.bias_correction2_sqrt = 1.f;
  if (has_step) {
    const double t = static_cast<double>(step);
    const double bc1 = d_sub(1.0, ::pow(h.beta1, t));
    const double bc2 = d_sub(1.0, ::pow(h.beta2, t));
    s.bias_correction1 = static_cast<float>(bc1);
    s.bias_correction2 = static_cast<float>(bc2);
    s.bias_correction2_sqrt = static_cast<float>(d_sqrt(bc2));
    s.step_size = static_cast<float>(d_div(lr, bc1));
  }
  if (lamb_phase2) {
    const double w = d_sqrt(p_sumsq), u = d_sqrt(u_sumsq);
    const double trust = (w > 0 && u > 0) ? d_div(w, u) : 1.0;
    s.step_size = static_cast<float>(d_mul(lr, trust));
  }
  return s;
}

// ---- per element
// -----------------------------------------------------------------------------------

/// load_grad: scaled (AMP unscale x clip coefficient) and negated for maximize.
TORCHSPEED_HD float scale_grad(const OptimHyper& h, const BlockScalars& s, float g) {
  if (s.grad_scale != 1.f) g = f_mul(g, s.grad_scale);
  return h.maximize ? -g : g;
}

/// adam_range. vmax: in, the stored max_exp_avg_sq; out, the new one (amsgrad only).
TORCHSPEED_HD void adam_element(const OptimHyper& h, const BlockScalars& s, float g, float& p,
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
TORCHSPEED_HD void sgd_element(const OptimHyper& h, const BlockScalars& s, float g, float& p,
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
TORCHSPEED_HD void lion_element(const OptimHyper& h, const BlockScalars& s, float g, float& p,
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
TORCHSPEED_HD float lamb_update(const OptimHyper& h, const BlockScalars& s, float m, float v,
                                float p) {
  const float m_hat = f_div(m, s.bias_correction1);
  const float v_hat = f_div(v, s.bias_correction2);
  return f_fma(h.weight_decay, p, f_div(m_hat, f_add(f_sqrt(v_hat), h.eps)));
}

/// lamb_phase2_range: p -= lr * trust * u (step_size carries lr * trust).
TORCHSPEED_HD float lamb_apply(const OptimHyper& h, const BlockScalars& s, float m, float v,
                               float p) {
  return f_fma(lamb_update(h, s, m, v, p), -s.step_size, p);
}

/// store_param: the pruning mask zeroes the param where mask == 0.
TORCHSPEED_HD float apply_mask(float mask, float p) { return mask != 0.f ? p : 0.f; }

/// store_param: ema += (1 - ema_decay) * (param - ema).
TORCHSPEED_HD float ema_update(const OptimHyper& h, float p, float ema) {
  return f_fma(h.one_minus_ema_decay, f_sub(p, ema), ema);
}

}  // namespace torchspeed::kernels::cuda
