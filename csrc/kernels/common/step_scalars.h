// The per-tensor scalars of one fused optimizer step, one definition for both devices: the CPU op
// calls step_scalars() on the host for each tensor, the CUDA kernel on the device (thread 0 of each
// block) from the device lr, scale, clip coefficient and step. Both therefore round alike.
//
// Inline code: not for the CPU ISA units (see exact_math.h).
#pragma once

#include "kernels/common/exact_math.h"
#include "kernels/common/optim_types.h"

namespace torchspeed::kernels {

/// lr: the lr tensor's value or hyper.lr; scale: the AMP grad scale (1 without); clip: the clip
/// coefficient (1 without); step: the already incremented step count (has_step false for SGD).
/// LAMB's phase 2 passes the tensor's ||p||^2 and ||u||^2 for the trust ratio.
TORCHSPEED_HD StepScalars step_scalars(const OptimHyper& h, double lr, float scale, float clip,
                                       bool has_step, float step, bool lamb_phase2 = false,
                                       double p_sumsq = 0.0, double u_sumsq = 0.0) {
  StepScalars s;
  // As GradScaler's unscale: float(1 / double(scale)).
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

}  // namespace torchspeed::kernels
