// torchspeed::optim::SGD: torch::optim::SGD-style C++ optimizer whose step is one fused
// torchspeed::sgd_step_ call per (param group, bucket), on CPU or CUDA.
//
//   torchspeed::optim::SGD opt(model->parameters(),
//                              torchspeed::optim::SGDOptions(0.1).momentum(0.9).nesterov(true));
#pragma once

#include "torchspeed/optim/fused.h"

/// torch::optim::SGDOptions' fields and defaults (lr is required), plus maximize, then the common
/// tail. The momentum buffer is float32.
#define TORCHSPEED_SGD_OPTIONS(X) \
  X(double, lr, 0.0)              \
  X(double, momentum, 0.0)        \
  X(double, dampening, 0.0)       \
  X(double, weight_decay, 0.0)    \
  X(bool, nesterov, false)        \
  X(bool, maximize, false)        \
  TORCHSPEED_FUSED_OPTIONS_TAIL(X)

/// float32 tensors on the param's device, in its memory layout. `momentum_buffer` is undefined
/// until the first step with momentum (it then starts from the gradient, as in torch); `master` is
/// defined only for low-precision params with master weights, `ema` only with ema_decay.
#define TORCHSPEED_SGD_STATE(X) X(momentum_buffer) X(master) X(ema)

namespace torchspeed::optim {

struct TORCHSPEED_API SGDOptions : public torch::optim::OptimizerCloneableOptions<SGDOptions> {
  TORCHSPEED_OPTIM_OPTIONS_BODY(SGDOptions, TORCHSPEED_SGD_OPTIONS)
};

struct TORCHSPEED_API SGDParamState
    : public torch::optim::OptimizerCloneableParamState<SGDParamState> {
  TORCHSPEED_OPTIM_STATE_BODY(TORCHSPEED_SGD_STATE)
};

/// SGD with momentum, dampening, nesterov and weight decay in one fused kernel per param group.
class TORCHSPEED_API SGD : public FusedOptimizer {
  TORCHSPEED_FUSED_OPTIMIZER_BODY(SGD, SGDOptions)
};

}  // namespace torchspeed::optim
