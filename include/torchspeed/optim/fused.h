// What the fused C++ optimizers (Adam, AdamW, SGD, Lion, LAMB) share: the base class with the
// GradScaler-style step, and the macros that declare each options and state class from one field
// list. Every per-field function (==, save, load, the param-group merge, the load-time checks) is
// generated from the same lists in csrc/optim/options_io.cpp, so a field added to a list is
// everywhere at once.
#pragma once

#include <torch/arg.h>
#include <torch/optim/optimizer.h>
#include <torch/serialize/archive.h>

#include <cstdint>
#include <optional>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "torchspeed/export.h"
#include "torchspeed/profile/profile.h"

namespace torchspeed::optim {

using betas_t = std::tuple<double, double>;

/// torch.amp.GradScaler's two tensors for one step, as the Python optimizers take them
/// (`_step_supports_amp_scaling`): grads are divided by grad_scale inside the step, and when
/// found_inf is nonzero the step changes nothing, not even the step counts. One-element float32
/// tensors on the params' device, or undefined (no scaling / nothing found).
struct GradScaling {
  torch::Tensor grad_scale;
  torch::Tensor found_inf;
};

/// The base of every torchspeed C++ optimizer: a torch::optim::Optimizer whose step() is one
/// fused op call per (param group, master/no-master bucket), on CPU or CUDA.
class TORCHSPEED_API FusedOptimizer : public torch::optim::Optimizer {
 public:
  using torch::optim::Optimizer::Optimizer;

  torch::Tensor step(LossClosure closure = nullptr) override {
    return step(GradScaling{}, std::move(closure));
  }
  /// A step with GradScaler's scale and found_inf: scaler.scale(loss).backward(), then
  /// opt.step({scaler_scale, found_inf}) instead of unscale_ + step (the grads are unscaled in
  /// registers; nothing is written when found_inf != 0).
  torch::Tensor step(const GradScaling& scaling, LossClosure closure = nullptr) {
    TORCHSPEED_PHASE("torchspeed.optim.step", ::torchspeed::profile::Phase::Optimizer);
    return fused_step(closure, scaling);
  }

 protected:
  virtual torch::Tensor fused_step(const LossClosure& closure, const GradScaling& scaling) = 0;
};

}  // namespace torchspeed::optim

/// The low-bit state options of Adam, AdamW, Lion and SGD (their moments' storage), as the Python
/// optimizers' keyword arguments (docs/OPTIM.md, "Low-bit optimizer state"; CPU kernels, and a
/// CUDA kernel not yet run on a GPU):
///   state_dtype       "fp32" (float32 moments), "bf16" (bfloat16 moments, stochastic rounding)
///                     or "int8" (int8/uint8 codes, one float32 absmax per block)
///   min_lowbit_numel  params with fewer elements keep float32 moments under "int8"
///   state_block       elements per int8 block, a power of two in [8, 4096]
/// All three are checked by torchspeed::lowbit_state_format, the validator Python uses too.
#define TORCHSPEED_LOWBIT_STATE_OPTIONS(X) \
  X(std::string, state_dtype, "fp32")      \
  X(int64_t, min_lowbit_numel, 4096)       \
  X(int64_t, state_block, 256)

/// The options every fused optimizer has after its own (X(type, name, default) each):
///   master_weights  keep fp32 master copies of bfloat16/float16 params and update those
///                   (nullopt = on for low-precision params, false = update them in place)
///   max_grad_norm   clip each group's grad norm to this value inside the step (clip_grad_norm_)
///   ema_decay       keep an fp32 EMA copy of every param (state "ema"), updated in the step:
///                   ema += (1 - ema_decay) * (param - ema)
///   lr_tensor       a one-element float tensor that overrides lr, read on the device at each step
///                   (an LR schedule that writes a tensor in place, CUDA graphs); saved by value
#define TORCHSPEED_FUSED_OPTIONS_TAIL(X)                \
  X(std::optional<bool>, master_weights, std::nullopt)  \
  X(std::optional<double>, max_grad_norm, std::nullopt) \
  X(std::optional<double>, ema_decay, std::nullopt)     \
  X(std::optional<torch::Tensor>, lr_tensor, std::nullopt)

#define TORCHSPEED_OPTIM_DECLARE_OPTION(type, name, init) TORCH_ARG(type, name) = init;
#define TORCHSPEED_OPTIM_DECLARE_STATE(name) TORCH_ARG(torch::Tensor, name);

/// The body of an options struct: its fields from LIST, the constructor taking lr, and what
/// torch::optim::OptimizerOptions requires.
/// `...` is lr's default argument (`= 1e-3`), empty when lr is required (SGD).
#define TORCHSPEED_OPTIM_OPTIONS_BODY(Options, LIST, ...)                        \
  Options(double lr __VA_ARGS__);                                                \
  using betas_t = ::torchspeed::optim::betas_t;                                  \
  LIST(TORCHSPEED_OPTIM_DECLARE_OPTION)                                          \
                                                                                 \
 public:                                                                         \
  void serialize(torch::serialize::InputArchive& archive) override;              \
  void serialize(torch::serialize::OutputArchive& archive) const override;       \
  TORCHSPEED_API friend bool operator==(const Options& lhs, const Options& rhs); \
  double get_lr() const override;                                                \
  void set_lr(const double lr) override;

/// The body of a per-param state struct: one float32 tensor per name in LIST.
#define TORCHSPEED_OPTIM_STATE_BODY(LIST)                           \
  LIST(TORCHSPEED_OPTIM_DECLARE_STATE)                              \
                                                                    \
 public:                                                            \
  void serialize(torch::serialize::InputArchive& archive) override; \
  void serialize(torch::serialize::OutputArchive& archive) const override;

/// The body of an optimizer class. `...` is the defaults' default argument (`= {}`), empty when
/// the options have a required argument (SGD's lr).
#define TORCHSPEED_FUSED_OPTIMIZER_BODY(Cls, Options, ...)                                   \
 public:                                                                                     \
  explicit Cls(const std::vector<torch::optim::OptimizerParamGroup>& param_groups,           \
               Options defaults __VA_ARGS__);                                                \
  explicit Cls(std::vector<torch::Tensor> params, Options defaults __VA_ARGS__)              \
      : Cls({torch::optim::OptimizerParamGroup(std::move(params))}, std::move(defaults)) {}  \
  void save(torch::serialize::OutputArchive& archive) const override;                        \
  void load(torch::serialize::InputArchive& archive) override;                               \
  /** Adds a group, keeping its own options (fields left at their defaults inherit the       \
      optimizer's). Hides torch::optim::Optimizer::add_param_group, which is not virtual and \
      would replace torchspeed options by the defaults: call it on the torchspeed type. */   \
  void add_param_group(const torch::optim::OptimizerParamGroup& param_group);                \
                                                                                             \
 protected:                                                                                  \
  torch::Tensor fused_step(const LossClosure& closure, const GradScaling& scaling) override;
