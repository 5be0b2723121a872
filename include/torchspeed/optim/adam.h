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

#include <torch/optim/optimizer.h>
#include <torch/optim/serialize.h>

#include <optional>
#include <tuple>
#include <vector>

#include "torchspeed/export.h"

namespace torchspeed::optim {

/// Options of torchspeed::optim::Adam: torch::optim::AdamOptions' arguments and defaults, plus
///   maximize               ascend instead of descend
///   decoupled_weight_decay AdamW-style decay p *= 1 - lr*wd (default false: L2 added to the grad)
///   master_weights         keep fp32 master copies of bfloat16/float16 params and update those
///                          (nullopt = on for low-precision params, false = update them in place)
///   max_grad_norm          clip the global grad norm (over all groups) to this value in the step
struct TORCHSPEED_API AdamOptions : public torch::optim::OptimizerCloneableOptions<AdamOptions> {
  AdamOptions(double lr = 1e-3);
  TORCH_ARG(double, lr) = 1e-3;
  typedef std::tuple<double, double> betas_t;
  TORCH_ARG(betas_t, betas) = std::make_tuple(0.9, 0.999);
  TORCH_ARG(double, eps) = 1e-8;
  TORCH_ARG(double, weight_decay) = 0;
  TORCH_ARG(bool, amsgrad) = false;
  TORCH_ARG(bool, maximize) = false;
  TORCH_ARG(bool, decoupled_weight_decay) = false;
  TORCH_ARG(std::optional<bool>, master_weights) = std::nullopt;
  TORCH_ARG(std::optional<double>, max_grad_norm) = std::nullopt;

 public:
  void serialize(torch::serialize::InputArchive& archive) override;
  void serialize(torch::serialize::OutputArchive& archive) const override;
  TORCHSPEED_API friend bool operator==(const AdamOptions& lhs, const AdamOptions& rhs);
  double get_lr() const override;
  void set_lr(const double lr) override;
};

/// Options of torchspeed::optim::AdamW: as AdamOptions with decoupled weight decay always on and
/// torch::optim::AdamWOptions' default weight_decay of 1e-2.
struct TORCHSPEED_API AdamWOptions : public torch::optim::OptimizerCloneableOptions<AdamWOptions> {
  AdamWOptions(double lr = 1e-3);
  TORCH_ARG(double, lr) = 1e-3;
  typedef std::tuple<double, double> betas_t;
  TORCH_ARG(betas_t, betas) = std::make_tuple(0.9, 0.999);
  TORCH_ARG(double, eps) = 1e-8;
  TORCH_ARG(double, weight_decay) = 1e-2;
  TORCH_ARG(bool, amsgrad) = false;
  TORCH_ARG(bool, maximize) = false;
  TORCH_ARG(std::optional<bool>, master_weights) = std::nullopt;
  TORCH_ARG(std::optional<double>, max_grad_norm) = std::nullopt;

 public:
  void serialize(torch::serialize::InputArchive& archive) override;
  void serialize(torch::serialize::OutputArchive& archive) const override;
  TORCHSPEED_API friend bool operator==(const AdamWOptions& lhs, const AdamWOptions& rhs);
  double get_lr() const override;
  void set_lr(const double lr) override;
};

/// Per-param state, laid out as torchspeed.optim.Adam's in Python: every tensor is float32 on the
/// param's device; `step` is 0-dim (incremented by the kernel), `master` is defined only for
/// low-precision params with master weights, `max_exp_avg_sq` only with amsgrad.
struct TORCHSPEED_API AdamParamState
    : public torch::optim::OptimizerCloneableParamState<AdamParamState> {
  TORCH_ARG(torch::Tensor, step);
  TORCH_ARG(torch::Tensor, exp_avg);
  TORCH_ARG(torch::Tensor, exp_avg_sq);
  TORCH_ARG(torch::Tensor, max_exp_avg_sq);
  TORCH_ARG(torch::Tensor, master);

 public:
  void serialize(torch::serialize::InputArchive& archive) override;
  void serialize(torch::serialize::OutputArchive& archive) const override;
};
using AdamWParamState = AdamParamState;

/// Adam with one fused kernel per param group; a drop-in for torch::optim::Adam.
class TORCHSPEED_API Adam : public torch::optim::Optimizer {
 public:
  explicit Adam(const std::vector<torch::optim::OptimizerParamGroup>& param_groups,
                AdamOptions defaults = {});
  explicit Adam(std::vector<torch::Tensor> params, AdamOptions defaults = {})
      : Adam({torch::optim::OptimizerParamGroup(std::move(params))}, std::move(defaults)) {}

  torch::Tensor step(LossClosure closure = nullptr) override;
  void save(torch::serialize::OutputArchive& archive) const override;
  void load(torch::serialize::InputArchive& archive) override;
  /// Adds a group, keeping its own options (fields left at their defaults inherit the
  /// optimizer's). Hides torch::optim::Optimizer::add_param_group, which is not virtual and
  /// would replace torchspeed options by the defaults: call it on the torchspeed type.
  void add_param_group(const torch::optim::OptimizerParamGroup& param_group);
};

/// AdamW (decoupled weight decay) with one fused kernel per param group; a drop-in for
/// torch::optim::AdamW.
class TORCHSPEED_API AdamW : public torch::optim::Optimizer {
 public:
  explicit AdamW(const std::vector<torch::optim::OptimizerParamGroup>& param_groups,
                 AdamWOptions defaults = {});
  explicit AdamW(std::vector<torch::Tensor> params, AdamWOptions defaults = {})
      : AdamW({torch::optim::OptimizerParamGroup(std::move(params))}, std::move(defaults)) {}

  torch::Tensor step(LossClosure closure = nullptr) override;
  void save(torch::serialize::OutputArchive& archive) const override;
  void load(torch::serialize::InputArchive& archive) override;
  /// Adds a group, keeping its own options (fields left at their defaults inherit the
  /// optimizer's). Hides torch::optim::Optimizer::add_param_group, which is not virtual and
  /// would replace torchspeed options by the defaults: call it on the torchspeed type.
  void add_param_group(const torch::optim::OptimizerParamGroup& param_group);
};

}  // namespace torchspeed::optim
