// torchspeed::optim::Adam and AdamW: torch::optim-style C++ optimizers whose step is one fused
// torchspeed::adam_step_ call per (param group, master/no-master bucket), on CPU or CUDA.
//
//   #include <torchspeed/optim.h>
//   torchspeed::optim::AdamW opt(model->parameters(),
//                                torchspeed::optim::AdamWOptions(1e-3).weight_decay(0.01));
//   loss.backward();
//   opt.step();
//   opt.zero_grad();
#pragma once

#include "torchspeed/optim/fused.h"

/// torch::optim::AdamOptions' fields and defaults, plus maximize and decoupled_weight_decay
/// (AdamW-style decay p *= 1 - lr*wd; default false: L2 added to the grad), then the common tail.
#define TORCHSPEED_ADAM_OPTIONS(X)         \
  X(double, lr, 1e-3)                      \
  X(betas_t, betas, (betas_t{0.9, 0.999})) \
  X(double, eps, 1e-8)                     \
  X(double, weight_decay, 0.0)             \
  X(bool, amsgrad, false)                  \
  X(bool, maximize, false)                 \
  X(bool, decoupled_weight_decay, false)   \
  TORCHSPEED_FUSED_OPTIONS_TAIL(X)

/// As Adam's with decoupled weight decay always on and torch::optim::AdamWOptions' default
/// weight_decay of 1e-2.
#define TORCHSPEED_ADAMW_OPTIONS(X)        \
  X(double, lr, 1e-3)                      \
  X(betas_t, betas, (betas_t{0.9, 0.999})) \
  X(double, eps, 1e-8)                     \
  X(double, weight_decay, 1e-2)            \
  X(bool, amsgrad, false)                  \
  X(bool, maximize, false)                 \
  TORCHSPEED_FUSED_OPTIONS_TAIL(X)

/// Laid out as torchspeed.optim.Adam's state in Python: float32 tensors on the param's device, in
/// its memory layout; `step` is 0-dim (incremented by the kernel), `master` is defined only for
/// low-precision params with master weights, `max_exp_avg_sq` only with amsgrad, `ema` only with
/// ema_decay.
#define TORCHSPEED_ADAM_STATE(X) X(step) X(exp_avg) X(exp_avg_sq) X(max_exp_avg_sq) X(master) X(ema)

namespace torchspeed::optim {

struct TORCHSPEED_API AdamOptions : public torch::optim::OptimizerCloneableOptions<AdamOptions> {
  TORCHSPEED_OPTIM_OPTIONS_BODY(AdamOptions, TORCHSPEED_ADAM_OPTIONS, = 1e-3)
};

struct TORCHSPEED_API AdamWOptions : public torch::optim::OptimizerCloneableOptions<AdamWOptions> {
  TORCHSPEED_OPTIM_OPTIONS_BODY(AdamWOptions, TORCHSPEED_ADAMW_OPTIONS, = 1e-3)
};

struct TORCHSPEED_API AdamParamState
    : public torch::optim::OptimizerCloneableParamState<AdamParamState> {
  TORCHSPEED_OPTIM_STATE_BODY(TORCHSPEED_ADAM_STATE)
};
using AdamWParamState = AdamParamState;

/// Adam with one fused kernel per param group; a drop-in for torch::optim::Adam.
class TORCHSPEED_API Adam : public FusedOptimizer {
  TORCHSPEED_FUSED_OPTIMIZER_BODY(Adam, AdamOptions, = {})
};

/// AdamW (decoupled weight decay) with one fused kernel per param group; a drop-in for
/// torch::optim::AdamW.
class TORCHSPEED_API AdamW : public FusedOptimizer {
  TORCHSPEED_FUSED_OPTIMIZER_BODY(AdamW, AdamWOptions, = {})
};

}  // namespace torchspeed::optim
