// Option and state I/O of the C++ fused optimizers (internal): per options class the field checks
// and the group-merge rule, per state class the checks and placement of loaded tensors, generated
// from the field lists in the public headers (TORCHSPEED_ADAM_OPTIONS, TORCHSPEED_ADAM_STATE, ...).
// Defined in options_io.cpp; the step builders (fused_step_builder.h) and every algorithm use them.
#pragma once

#include <ATen/ATen.h>

#include <optional>
#include <string>

#include "torchspeed/optim/adam.h"
#include "torchspeed/optim/hyperparams.h"
#include "torchspeed/optim/lamb.h"
#include "torchspeed/optim/lion.h"
#include "torchspeed/optim/sgd.h"

namespace torchspeed::optim::detail {

// Every field of `o` through the validator the Python optimizers share (hyperparams.h); `where` is
// "" for the defaults, "param_groups[i]." for a group. On the step path (`at_step`) a device lr
// tensor's value is not read.
#define TORCHSPEED_DECLARE_OPTION_FUNCTIONS(Options)                                    \
  void check_options(const char* optimizer, const std::string& where, const Options& o, \
                     bool at_step);                                                     \
  Options merge_options(const Options& user, const Options& defaults);
TORCHSPEED_DECLARE_OPTION_FUNCTIONS(AdamOptions)
TORCHSPEED_DECLARE_OPTION_FUNCTIONS(AdamWOptions)
TORCHSPEED_DECLARE_OPTION_FUNCTIONS(SGDOptions)
TORCHSPEED_DECLARE_OPTION_FUNCTIONS(LionOptions)
TORCHSPEED_DECLARE_OPTION_FUNCTIONS(LAMBOptions)
#undef TORCHSPEED_DECLARE_OPTION_FUNCTIONS

// Every state tensor must have its param's number of elements (`step` one); loaded state is moved
// to the param's device, float32 and memory layout.
#define TORCHSPEED_DECLARE_STATE_FUNCTIONS(State)                                   \
  void place_state(State& s, const at::Tensor& p);                                  \
  void check_state(const char* optimizer, const std::string& where, const State& s, \
                   const at::Tensor& p);
TORCHSPEED_DECLARE_STATE_FUNCTIONS(AdamParamState)
TORCHSPEED_DECLARE_STATE_FUNCTIONS(SGDParamState)
TORCHSPEED_DECLARE_STATE_FUNCTIONS(LionParamState)
TORCHSPEED_DECLARE_STATE_FUNCTIONS(LAMBParamState)
#undef TORCHSPEED_DECLARE_STATE_FUNCTIONS

bool is_supported_dtype(at::ScalarType t);
bool wants_master(const std::optional<bool>& master_weights, const at::Tensor& p);
// A float32 copy of `src` laid out in memory like the param `p`: the kernels see every per-param
// tensor as flat memory, so a channels_last param gets channels_last state.
at::Tensor like_param(const at::Tensor& src, const at::Tensor& p);
at::Tensor zeros_like_param(const at::Tensor& p);
at::Tensor zero_step(const at::Tensor& p);
std::string group_prefix(size_t g);

// Every field, then SGD's cross-field rule: as torch, the defaults need momentum for nesterov; in
// a group without momentum it is plain SGD.
template <class Options>
void check_all_options(const char* name, const std::string& where, const Options& o,
                       bool at_step = false) {
  check_options(name, where, o, at_step);
  if constexpr (std::is_same_v<Options, SGDOptions>) {
    check_nesterov(name, o.nesterov() && (where.empty() || o.momentum() != 0), o.momentum(),
                   o.dampening());
  }
}

template <typename Options>
void check_all_groups(const char* name, const torch::optim::Optimizer& self, bool at_step = false) {
  const auto& groups = self.param_groups();
  for (size_t g = 0; g < groups.size(); ++g) {
    check_all_options(name, group_prefix(g), static_cast<const Options&>(groups[g].options()),
                      at_step);
  }
}

}  // namespace torchspeed::optim::detail
