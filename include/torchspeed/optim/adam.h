// torchspeed::optim::Adam and AdamW: torch::optim-style C++ optimizers whose step is one fused
// torchspeed::adam_step_ call per (param group, master/no-master bucket), on CPU or CUDA, and one
// adam_lowbit_step_ call per low-bit moment format (state_dtype "bf16" / "int8"; the CUDA kernel is
// not yet run on a GPU).
//
//   #include <torchspeed/optim.h>
//   torchspeed::optim::AdamW opt(model->parameters(),
//                                torchspeed::optim::AdamWOptions(1e-3).weight_decay(0.01));
//   loss.backward();
//   opt.step();
//   opt.zero_grad();
//   // int8 moments (about 2 bytes per param instead of 8):
//   torchspeed::optim::AdamW small(model->parameters(),
//                                  torchspeed::optim::AdamWOptions(1e-3).state_dtype("int8"));
#pragma once

#include <cstdint>
#include <string>

#include "torchspeed/optim/fused.h"

/// torch::optim::AdamOptions' fields and defaults, plus maximize and decoupled_weight_decay
/// (AdamW-style decay p *= 1 - lr*wd; default false: L2 added to the grad), the low-bit state
/// options (TORCHSPEED_LOWBIT_STATE_OPTIONS; not with amsgrad), then the common tail.
#define TORCHSPEED_ADAM_OPTIONS(X)         \
  X(double, lr, 1e-3)                      \
  X(betas_t, betas, (betas_t{0.9, 0.999})) \
  X(double, eps, 1e-8)                     \
  X(double, weight_decay, 0.0)             \
  X(bool, amsgrad, false)                  \
  X(bool, maximize, false)                 \
  X(bool, decoupled_weight_decay, false)   \
  TORCHSPEED_LOWBIT_STATE_OPTIONS(X)       \
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
  TORCHSPEED_LOWBIT_STATE_OPTIONS(X)       \
  TORCHSPEED_FUSED_OPTIONS_TAIL(X)

/// Laid out as torchspeed.optim.Adam's state in Python: float32 tensors on the param's device, in
/// its memory layout; `step` is 0-dim (incremented by the kernel), `master` is defined only for
/// low-precision params with master weights, `max_exp_avg_sq` only with amsgrad, `ema` only with
/// ema_decay. The moments follow the param's format (state_dtype): float32; bfloat16 ("bf16");
/// or ("int8") int8 `exp_avg` and uint8 `exp_avg_sq` codes laid out like the param, with
/// `exp_avg_absmax` / `exp_avg_sq_absmax` one float32 absmax per block of state_block elements
/// of the param's memory order (contiguous, ceil(numel / state_block) elements; defined only
/// then).
#define TORCHSPEED_ADAM_STATE(X) \
  X(step)                        \
  X(exp_avg) X(exp_avg_sq) X(max_exp_avg_sq) X(master) X(ema) X(exp_avg_absmax) X(exp_avg_sq_absmax)

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

/// Adam with one fused kernel per param group; a drop-in for torch::optim::Adam. With a low-bit
/// state_dtype a group's float32-moment params (under min_lowbit_numel) and its low-bit ones go to
/// adam_step_ and adam_lowbit_step_ respectively; every call is validated before any runs.
class TORCHSPEED_API Adam : public FusedOptimizer {
  TORCHSPEED_FUSED_OPTIMIZER_BODY(Adam, AdamOptions, = {})
};

/// AdamW (decoupled weight decay) with one fused kernel per param group; a drop-in for
/// torch::optim::AdamW.
class TORCHSPEED_API AdamW : public FusedOptimizer {
  TORCHSPEED_FUSED_OPTIMIZER_BODY(AdamW, AdamWOptions, = {})
};

}  // namespace torchspeed::optim
