// The one validator of every optimizer hyperparameter, used by the C++ optimizers and (through
// torchspeed._C.optim) by the Python ones, so both accept and reject exactly the same values.
//
//   torchspeed::optim::check_hyperparameter("Adam", "lr", 1e-3);           // ok
//   torchspeed::optim::check_hyperparameter("Adam", "betas[1]", 1.0);      // throws
//   c10::ValueError
#pragma once

#include <string>

#include "torchspeed/export.h"

namespace torchspeed::optim {

/// Checks one hyperparameter value and throws c10::ValueError (ValueError in Python) naming the
/// optimizer, the argument and the value when it is out of range. `name` is the argument's name,
/// optionally prefixed by where it lives ("param_groups[1].lr"); the rule is chosen by the part
/// after the last '.':
///   lr, eps, weight_decay, momentum       finite in float32 and >= 0
///   dampening                             finite in float32
///   betas[0], betas[1]                    in [0, 1)
///   max_grad_norm                         >= 0 (0 zeroes the grads, as clip_grad_norm_(..., 0))
///   ema_decay                             in [0, 1]
/// The kernels compute in float32, so a value that rounds to inf there (e.g. lr=1e39) is rejected.
TORCHSPEED_API void check_hyperparameter(const std::string& optimizer, const std::string& name,
                                         double value);

/// SGD's cross-field rule, as torch.optim.SGD's: nesterov needs momentum > 0 and dampening == 0.
TORCHSPEED_API void check_nesterov(const std::string& optimizer, bool nesterov, double momentum,
                                   double dampening);

}  // namespace torchspeed::optim
