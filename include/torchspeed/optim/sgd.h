// torchspeed::optim::SGD: torch::optim::SGD-style C++ optimizer whose step is one fused
// torchspeed::sgd_step_ call per (param group, bucket), on CPU or CUDA.
//
//   torchspeed::optim::SGD opt(model->parameters(),
//                              torchspeed::optim::SGDOptions(0.1).momentum(0.9).nesterov(true));
#pragma once

#include <torch/optim/optimizer.h>
#include <torch/optim/serialize.h>

#include <optional>
#include <vector>

#include "torchspeed/export.h"

namespace torchspeed::optim {

/// torch::optim::SGDOptions' arguments and defaults (lr is required), plus maximize,
/// master_weights (nullopt = fp32 masters for bfloat16/float16 params) and max_grad_norm (clip the
/// global grad norm inside the step). The momentum buffer is float32.
struct TORCHSPEED_API SGDOptions : public torch::optim::OptimizerCloneableOptions<SGDOptions> {
  SGDOptions(double lr);
  TORCH_ARG(double, lr);
  TORCH_ARG(double, momentum) = 0;
  TORCH_ARG(double, dampening) = 0;
  TORCH_ARG(double, weight_decay) = 0;
  TORCH_ARG(bool, nesterov) = false;
  TORCH_ARG(bool, maximize) = false;
  TORCH_ARG(std::optional<bool>, master_weights) = std::nullopt;
  TORCH_ARG(std::optional<double>, max_grad_norm) = std::nullopt;

 public:
  void serialize(torch::serialize::InputArchive& archive) override;
  void serialize(torch::serialize::OutputArchive& archive) const override;
  TORCHSPEED_API friend bool operator==(const SGDOptions& lhs, const SGDOptions& rhs);
  double get_lr() const override;
  void set_lr(const double lr) override;
};

/// Per-param state: float32 tensors on the param's device. `momentum_buffer` is undefined until
/// the first step with momentum (it then starts from the gradient, as in torch); `master` is
/// defined only for low-precision params with master weights.
struct TORCHSPEED_API SGDParamState
    : public torch::optim::OptimizerCloneableParamState<SGDParamState> {
  TORCH_ARG(torch::Tensor, momentum_buffer);
  TORCH_ARG(torch::Tensor, master);

 public:
  void serialize(torch::serialize::InputArchive& archive) override;
  void serialize(torch::serialize::OutputArchive& archive) const override;
};

/// SGD with momentum, dampening, nesterov and weight decay in one fused kernel per param group.
class TORCHSPEED_API SGD : public torch::optim::Optimizer {
 public:
  explicit SGD(const std::vector<torch::optim::OptimizerParamGroup>& param_groups,
               SGDOptions defaults);
  explicit SGD(std::vector<torch::Tensor> params, SGDOptions defaults)
      : SGD({torch::optim::OptimizerParamGroup(std::move(params))}, std::move(defaults)) {}

  torch::Tensor step(LossClosure closure = nullptr) override;
  void save(torch::serialize::OutputArchive& archive) const override;
  void load(torch::serialize::InputArchive& archive) override;
  /// Adds a group, keeping its own options (fields left at their defaults inherit the
  /// optimizer's). Hides torch::optim::Optimizer::add_param_group, which is not virtual and
  /// would replace torchspeed options by the defaults: call it on the torchspeed type.
  void add_param_group(const torch::optim::OptimizerParamGroup& param_group);
};

}  // namespace torchspeed::optim
