// torchspeed::optim::SGD: torch::optim::SGD-style C++ optimizer whose step is one fused
// torchspeed::sgd_step_ call per (param group, bucket), on CPU or CUDA.
//
//   torchspeed::optim::SGD opt(model->parameters(),
//                              torchspeed::optim::SGDOptions(0.1).momentum(0.9).nesterov(true));
#pragma once

#include "torchspeed/optim/fused.h"

/// torch::optim::SGDOptions' fields and defaults (lr is required), plus maximize, the low-bit state
/// options of the momentum buffer (TORCHSPEED_LOWBIT_STATE_OPTIONS; they matter only with
/// momentum != 0), then the common tail.
#define TORCHSPEED_SGD_OPTIONS(X)    \
  X(double, lr, 0.0)                 \
  X(double, momentum, 0.0)           \
  X(double, dampening, 0.0)          \
  X(double, weight_decay, 0.0)       \
  X(bool, nesterov, false)           \
  X(bool, maximize, false)           \
  TORCHSPEED_LOWBIT_STATE_OPTIONS(X) \
  TORCHSPEED_FUSED_OPTIONS_TAIL(X)

/// Laid out as torchspeed.optim.SGD's state in Python: tensors on the param's device, in its memory
/// layout. `momentum_buffer` is undefined until the first step with momentum (it then starts from
/// the gradient, as in torch); it follows the param's format (state_dtype): float32, bfloat16
/// ("bf16") or int8 codes with `momentum_buffer_absmax`, one float32 absmax per block of
/// state_block elements of the param's memory order ("int8"). A low-bit buffer comes with a 0-dim
/// float32 `step` (it seeds bf16's stochastic rounding); a float32 one has none, as torch's.
/// `master` is defined only for low-precision params with master weights, `ema` only with
/// ema_decay.
#define TORCHSPEED_SGD_STATE(X) \
  X(momentum_buffer) X(master) X(ema) X(momentum_buffer_absmax) X(step)

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
