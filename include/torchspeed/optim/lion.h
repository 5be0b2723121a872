// torchspeed::optim::Lion: a torch::optim-style C++ optimizer (torch::optim does not ship it) whose
// step is one fused torchspeed::lion_step_ call per (param group, master/no-master bucket), on CPU
// or CUDA. Same defaults and semantics as torchspeed.optim.Lion in Python.
//
//   #include <torchspeed/optim.h>
//   torchspeed::optim::Lion opt(model->parameters(),
//                               torchspeed::optim::LionOptions(1e-4).weight_decay(0.1));
//   // an int8 moment (about 1 byte per param instead of 4):
//   torchspeed::optim::Lion small(model->parameters(),
//                                 torchspeed::optim::LionOptions(1e-4).state_dtype("int8"));
#pragma once

#include "torchspeed/optim/fused.h"

/// Lion (Chen et al. 2023), one step being
///   p *= 1 - lr*wd;  p -= lr * sign(lerp(m, g, 1 - beta1));  m = lerp(m, g, 1 - beta2)
/// plus maximize, the low-bit state options of its moment (TORCHSPEED_LOWBIT_STATE_OPTIONS), then
/// the common tail.
#define TORCHSPEED_LION_OPTIONS(X)        \
  X(double, lr, 1e-4)                     \
  X(betas_t, betas, (betas_t{0.9, 0.99})) \
  X(double, weight_decay, 0.0)            \
  X(bool, maximize, false)                \
  TORCHSPEED_LOWBIT_STATE_OPTIONS(X)      \
  TORCHSPEED_FUSED_OPTIONS_TAIL(X)

/// Laid out as torchspeed.optim.Lion's state in Python: float32 tensors on the param's
/// device, in its memory layout; `step` is 0-dim (counted by the kernel), `master` is defined only
/// for low-precision params with master weights, `ema` only with ema_decay. `exp_avg` follows the
/// param's format (state_dtype): float32, bfloat16 ("bf16") or int8 codes laid out like the param
/// with `exp_avg_absmax`, one float32 absmax per block of state_block elements of the param's
/// memory order ("int8"; defined only then).
#define TORCHSPEED_LION_STATE(X) X(step) X(exp_avg) X(master) X(ema) X(exp_avg_absmax)

namespace torchspeed::optim {

struct TORCHSPEED_API LionOptions : public torch::optim::OptimizerCloneableOptions<LionOptions> {
  TORCHSPEED_OPTIM_OPTIONS_BODY(LionOptions, TORCHSPEED_LION_OPTIONS, = 1e-4)
};

struct TORCHSPEED_API LionParamState
    : public torch::optim::OptimizerCloneableParamState<LionParamState> {
  TORCHSPEED_OPTIM_STATE_BODY(TORCHSPEED_LION_STATE)
};

/// Lion with one fused kernel per param group.
class TORCHSPEED_API Lion : public FusedOptimizer {
  TORCHSPEED_FUSED_OPTIMIZER_BODY(Lion, LionOptions, = {})
};

}  // namespace torchspeed::optim
