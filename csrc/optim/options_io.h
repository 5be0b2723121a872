// Option and state I/O of the C++ fused optimizers (internal): per options class the field checks
// and the group-merge rule, per state class the checks and placement of loaded tensors, generated
// from the field lists in the public headers (TORCHSPEED_ADAM_OPTIONS, TORCHSPEED_ADAM_STATE, ...).
// Defined in options_io.cpp; the step builders (fused_step_builder.h) and every algorithm use them.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <optional>
#include <string>
#include <type_traits>
#include <vector>

#include "torchspeed/ops/optim.h"
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

// Every state tensor must have its param's number of elements (`step` one; an `*_absmax` is checked
// with its format by load_in_format); loaded state is moved to the param's device and memory
// layout, in float32 (Adam's low-bit moment codes keep their dtype and memory order).
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

// ---- low-bit moments (Adam, AdamW, Lion, SGD: state_dtype, min_lowbit_numel, state_block) -----

// The state options through their one validator, torchspeed::lowbit_state_format (its message,
// prefixed by the optimizer and `where`, as Python words it), then: amsgrad needs "fp32".
void check_state_options(const char* optimizer, const std::string& where,
                         const std::string& state_dtype, int64_t min_lowbit_numel,
                         int64_t state_block, bool amsgrad);

// A moment format: "fp32", "bf16", "int8" (an enum on the step path, which runs per param), or
// none yet (a state without moments). The first three index the step's op calls.
enum class MomentFormat : uint8_t { kFp32 = 0, kBf16 = 1, kInt8 = 2, kNone = 3 };
MomentFormat format_named(const std::string& name);
const char* format_name(MomentFormat format);

// The format new or loaded moments of `p` get in a group (the validator's answer).
template <class Options>
MomentFormat moment_format(const Options& o, const at::Tensor& p) {
  return format_named(::torchspeed::lowbit_state_format(o.state_dtype(), p.numel(),
                                                        o.min_lowbit_numel(), o.state_block()));
}

// The state classes with low-bit moments, each as Python's `_lowbit_moments`: its moments in the
// op's order (Adam: exp_avg, exp_avg_sq; Lion: exp_avg; SGD: momentum_buffer), each with its
// absmax and whether its map is signed. The first one's dtype is the stored format.
template <class State>
constexpr bool kHasLowbitMoments = false;
template <>
inline constexpr bool kHasLowbitMoments<AdamParamState> = true;
template <>
inline constexpr bool kHasLowbitMoments<LionParamState> = true;
template <>
inline constexpr bool kHasLowbitMoments<SGDParamState> = true;

// The format of a state's stored moments, by its first moment's dtype (kNone when it has none
// yet).
template <class State>
MomentFormat stored_format(const State& s);

// Sets s's moments (and, for int8, their absmaxes) in `format`, from float32 moments laid out
// like `p` (in the moments' order; an empty list: zeros), encoded as the step encodes
// (lowbit_encode, bf16 rounds to nearest).
template <class State>
void set_moments(State& s, const at::Tensor& p, MomentFormat format, int64_t state_block,
                 const std::vector<at::Tensor>& values = {});

// A loaded state (already placed on the param's device) checked as Python checks it (an int8
// state's code dtypes and sizes, ceil(numel / state_block) finite absmaxes >= 0; one format for
// all moments) and, when `format` is not kNone, converted to it: the param's format in its group.
// `saved_block`: the state_block the loaded int8 codes were made with (their saved group's); codes
// of another block or memory layout are decoded with it and converted from float32.
template <class State>
void load_in_format(const char* optimizer, const std::string& where, State& s, const at::Tensor& p,
                    MomentFormat format, int64_t state_block, int64_t saved_block);

// Whether an options class has the low-bit state options.
template <class Options>
constexpr bool kHasStateOptions =
    std::is_same_v<Options, AdamOptions> || std::is_same_v<Options, AdamWOptions> ||
    std::is_same_v<Options, LionOptions> || std::is_same_v<Options, SGDOptions>;

// A load never changes an optimizer's state options (state_dtype, min_lowbit_numel, state_block),
// as Python's `_kept_on_load`: the loaded moments are converted to them instead. Restores them
// from the group's options before the load.
template <class Options>
void keep_on_load(Options& loaded, const Options& own) {
  if constexpr (kHasStateOptions<Options>) {
    loaded.state_dtype(own.state_dtype());
    loaded.min_lowbit_numel(own.min_lowbit_numel());
    loaded.state_block(own.state_block());
  }
}

// The state_block a loaded group's options record (before keep_on_load): the block of its int8
// codes, checked as the option is (`where`: "saved param_groups[g]."); 0 without state options.
template <class Options>
int64_t saved_state_block(const char* optimizer, const std::string& where, const Options& saved) {
  if constexpr (kHasStateOptions<Options>) {
    check_state_options(optimizer, where, "int8", 0, saved.state_block(), false);
    return saved.state_block();
  } else {
    return 0;
  }
}

// The load-time format hook of load_checked, as Python's LowbitMoments._load_state: the state
// checked, then its moments converted to the group's format when the group has moments (SGD:
// momentum != 0); SGD keeps `step` only beside a low-bit buffer (SGD._load_state). `saved_block`:
// saved_state_block of the loaded group.
template <class State, class Options>
void load_in_group_format(const char* optimizer, const std::string& where, State& s,
                          const at::Tensor& p, const Options& o, int64_t saved_block) {
  if constexpr (kHasLowbitMoments<State>) {
    bool active = true;
    if constexpr (std::is_same_v<State, SGDParamState>) active = o.momentum() != 0;
    load_in_format(optimizer, where, s, p, active ? moment_format(o, p) : MomentFormat::kNone,
                   o.state_block(), saved_block);
    if constexpr (std::is_same_v<State, SGDParamState>) {
      const MomentFormat stored = stored_format(s);
      if (stored == MomentFormat::kFp32 || stored == MomentFormat::kNone) s.step(at::Tensor());
    }
  }
}

// Every field, then the cross-field rules: SGD's (as torch, the defaults need momentum for
// nesterov; in a group without momentum it is plain SGD) and the state options (amsgrad: Adam's).
template <class Options>
void check_all_options(const char* name, const std::string& where, const Options& o,
                       bool at_step = false) {
  check_options(name, where, o, at_step);
  if constexpr (std::is_same_v<Options, SGDOptions>) {
    check_nesterov(name, o.nesterov() && (where.empty() || o.momentum() != 0), o.momentum(),
                   o.dampening());
  }
  if constexpr (std::is_same_v<Options, AdamOptions> || std::is_same_v<Options, AdamWOptions>) {
    check_state_options(name, where, o.state_dtype(), o.min_lowbit_numel(), o.state_block(),
                        o.amsgrad());
  } else if constexpr (kHasStateOptions<Options>) {
    check_state_options(name, where, o.state_dtype(), o.min_lowbit_numel(), o.state_block(),
                        /*amsgrad=*/false);
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
