// torchspeed::optim::Lion and LAMB: torch::optim-style C++ optimizers (torch::optim ships neither)
// whose step is one fused torchspeed::lion_step_ / lamb_step_ call per (param group,
// master/no-master bucket), on CPU or CUDA. Same defaults and semantics as torchspeed.optim.Lion /
// LAMB in Python.
//
//   #include <torchspeed/optim.h>
//   torchspeed::optim::Lion opt(model->parameters(),
//                               torchspeed::optim::LionOptions(1e-4).weight_decay(0.1));
//   torchspeed::optim::LAMB lamb(model->parameters(),
//                                torchspeed::optim::LAMBOptions(1e-3).weight_decay(0.01));
#pragma once

#include "torchspeed/optim/fused.h"

/// Lion (Chen et al. 2023), one step being
///   p *= 1 - lr*wd;  p -= lr * sign(lerp(m, g, 1 - beta1));  m = lerp(m, g, 1 - beta2)
/// plus maximize, then the common tail.
#define TORCHSPEED_LION_OPTIONS(X)        \
  X(double, lr, 1e-4)                     \
  X(betas_t, betas, (betas_t{0.9, 0.99})) \
  X(double, weight_decay, 0.0)            \
  X(bool, maximize, false)                \
  TORCHSPEED_FUSED_OPTIONS_TAIL(X)

/// LAMB (You et al. 2020) with bias correction, one step being
///   u = m_hat / (sqrt(v_hat) + eps) + wd * p;  p -= lr * trust * u
/// with the per-tensor trust ratio trust = ||p|| / ||u|| (1 when either is 0); plus maximize, then
/// the common tail.
#define TORCHSPEED_LAMB_OPTIONS(X)         \
  X(double, lr, 1e-3)                      \
  X(betas_t, betas, (betas_t{0.9, 0.999})) \
  X(double, eps, 1e-6)                     \
  X(double, weight_decay, 0.0)             \
  X(bool, maximize, false)                 \
  TORCHSPEED_FUSED_OPTIONS_TAIL(X)

/// Laid out as torchspeed.optim.Lion's / LAMB's state in Python: float32 tensors on the param's
/// device, in its memory layout; `step` is 0-dim (counted by the kernel), `master` is defined only
/// for low-precision params with master weights, `ema` only with ema_decay.
#define TORCHSPEED_LION_STATE(X) X(step) X(exp_avg) X(master) X(ema)
#define TORCHSPEED_LAMB_STATE(X) X(step) X(exp_avg) X(exp_avg_sq) X(master) X(ema)

namespace torchspeed::optim {

struct TORCHSPEED_API LionOptions : public torch::optim::OptimizerCloneableOptions<LionOptions> {
  TORCHSPEED_OPTIM_OPTIONS_BODY(LionOptions, TORCHSPEED_LION_OPTIONS, = 1e-4)
};

struct TORCHSPEED_API LionParamState
    : public torch::optim::OptimizerCloneableParamState<LionParamState> {
  TORCHSPEED_OPTIM_STATE_BODY(TORCHSPEED_LION_STATE)
};

struct TORCHSPEED_API LAMBOptions : public torch::optim::OptimizerCloneableOptions<LAMBOptions> {
  TORCHSPEED_OPTIM_OPTIONS_BODY(LAMBOptions, TORCHSPEED_LAMB_OPTIONS, = 1e-3)
};

struct TORCHSPEED_API LAMBParamState
    : public torch::optim::OptimizerCloneableParamState<LAMBParamState> {
  TORCHSPEED_OPTIM_STATE_BODY(TORCHSPEED_LAMB_STATE)
};

/// Lion with one fused kernel per param group.
class TORCHSPEED_API Lion : public FusedOptimizer {
  TORCHSPEED_FUSED_OPTIMIZER_BODY(Lion, LionOptions, = {})
};

/// LAMB with one fused kernel per param group (the trust ratio per tensor, in the same call).
class TORCHSPEED_API LAMB : public FusedOptimizer {
  TORCHSPEED_FUSED_OPTIMIZER_BODY(LAMB, LAMBOptions, = {})
};

}  // namespace torchspeed::optim
