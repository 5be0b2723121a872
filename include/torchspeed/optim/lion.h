// torchspeed::optim::Lion and LAMB: torch::optim-style C++ optimizers (torch::optim ships neither)
// whose step is one fused torchspeed::lion_step_ / lamb_step_ call per (param group,
// master/no-master bucket), on CPU or CUDA. Same defaults and semantics as torchspeed.optim.Lion /
// LAMB in Python.
//
//   #include <torchspeed/optim.h>
//   torchspeed::optim::Lion opt(model->parameters(),
//                               torchspeed::optim::LionOptions(1e-4).weight_decay(0.1));
//   torchspeed::optim::LAMB lamb(model->parameters(),
//                                torchspeed::optim::LAMBOptions(1e-3).weight_decay(0.01));
#pragma once

#include <torch/optim/optimizer.h>
#include <torch/optim/serialize.h>

#include <optional>
#include <tuple>
#include <vector>

#include "torchspeed/export.h"

namespace torchspeed::optim {

/// Options of torchspeed::optim::Lion (Chen et al. 2023), one step being
///   p *= 1 - lr*wd;  p -= lr * sign(lerp(m, g, 1 - beta1));  m = lerp(m, g, 1 - beta2)
/// plus
///   maximize               ascend instead of descend
///   master_weights         keep fp32 master copies of bfloat16/float16 params and update those
///                          (nullopt = on for low-precision params, false = update them in place)
///   max_grad_norm          clip the global grad norm (over all groups) to this value in the step
struct TORCHSPEED_API LionOptions : public torch::optim::OptimizerCloneableOptions<LionOptions> {
  LionOptions(double lr = 1e-4);
  TORCH_ARG(double, lr) = 1e-4;
  typedef std::tuple<double, double> betas_t;
  TORCH_ARG(betas_t, betas) = std::make_tuple(0.9, 0.99);
  TORCH_ARG(double, weight_decay) = 0;
  TORCH_ARG(bool, maximize) = false;
  TORCH_ARG(std::optional<bool>, master_weights) = std::nullopt;
  TORCH_ARG(std::optional<double>, max_grad_norm) = std::nullopt;

 public:
  void serialize(torch::serialize::InputArchive& archive) override;
  void serialize(torch::serialize::OutputArchive& archive) const override;
  TORCHSPEED_API friend bool operator==(const LionOptions& lhs, const LionOptions& rhs);
  double get_lr() const override;
  void set_lr(const double lr) override;
};

/// Per-param state of Lion, laid out as torchspeed.optim.Lion's in Python: float32 tensors on the
/// param's device; `step` is 0-dim (counted by the kernel), `master` is defined only for
/// low-precision params with master weights.
struct TORCHSPEED_API LionParamState
    : public torch::optim::OptimizerCloneableParamState<LionParamState> {
  TORCH_ARG(torch::Tensor, step);
  TORCH_ARG(torch::Tensor, exp_avg);
  TORCH_ARG(torch::Tensor, master);

 public:
  void serialize(torch::serialize::InputArchive& archive) override;
  void serialize(torch::serialize::OutputArchive& archive) const override;
};

/// Options of torchspeed::optim::LAMB (You et al. 2020) with bias correction, one step being
///   u = m_hat / (sqrt(v_hat) + eps) + wd * p;  p -= lr * trust * u
/// with the per-tensor trust ratio trust = ||p|| / ||u|| (1 when either is 0); plus maximize,
/// master_weights and max_grad_norm as in LionOptions.
struct TORCHSPEED_API LAMBOptions : public torch::optim::OptimizerCloneableOptions<LAMBOptions> {
  LAMBOptions(double lr = 1e-3);
  TORCH_ARG(double, lr) = 1e-3;
  typedef std::tuple<double, double> betas_t;
  TORCH_ARG(betas_t, betas) = std::make_tuple(0.9, 0.999);
  TORCH_ARG(double, eps) = 1e-6;
  TORCH_ARG(double, weight_decay) = 0;
  TORCH_ARG(bool, maximize) = false;
  TORCH_ARG(std::optional<bool>, master_weights) = std::nullopt;
  TORCH_ARG(std::optional<double>, max_grad_norm) = std::nullopt;

 public:
  void serialize(torch::serialize::InputArchive& archive) override;
  void serialize(torch::serialize::OutputArchive& archive) const override;
  TORCHSPEED_API friend bool operator==(const LAMBOptions& lhs, const LAMBOptions& rhs);
  double get_lr() const override;
  void set_lr(const double lr) override;
};

/// Per-param state of LAMB, laid out as torchspeed.optim.LAMB's in Python: float32 tensors on the
/// param's device; `step` is 0-dim (counted by the kernel), `master` is defined only for
/// low-precision params with master weights.
struct TORCHSPEED_API LAMBParamState
    : public torch::optim::OptimizerCloneableParamState<LAMBParamState> {
  TORCH_ARG(torch::Tensor, step);
  TORCH_ARG(torch::Tensor, exp_avg);
  TORCH_ARG(torch::Tensor, exp_avg_sq);
  TORCH_ARG(torch::Tensor, master);

 public:
  void serialize(torch::serialize::InputArchive& archive) override;
  void serialize(torch::serialize::OutputArchive& archive) const override;
};

/// Lion with one fused kernel per param group.
class TORCHSPEED_API Lion : public torch::optim::Optimizer {
 public:
  explicit Lion(const std::vector<torch::optim::OptimizerParamGroup>& param_groups,
                LionOptions defaults = {});
  explicit Lion(std::vector<torch::Tensor> params, LionOptions defaults = {})
      : Lion({torch::optim::OptimizerParamGroup(std::move(params))}, std::move(defaults)) {}

  torch::Tensor step(LossClosure closure = nullptr) override;
  void save(torch::serialize::OutputArchive& archive) const override;
  void load(torch::serialize::InputArchive& archive) override;
  /// Adds a group, keeping its own options (fields left at their defaults inherit the
  /// optimizer's). Hides torch::optim::Optimizer::add_param_group, which is not virtual and
  /// would replace torchspeed options by the defaults: call it on the torchspeed type.
  void add_param_group(const torch::optim::OptimizerParamGroup& param_group);
};

/// LAMB with one fused call per param group (the per-tensor norms are computed inside the op).
class TORCHSPEED_API LAMB : public torch::optim::Optimizer {
 public:
  explicit LAMB(const std::vector<torch::optim::OptimizerParamGroup>& param_groups,
                LAMBOptions defaults = {});
  explicit LAMB(std::vector<torch::Tensor> params, LAMBOptions defaults = {})
      : LAMB({torch::optim::OptimizerParamGroup(std::move(params))}, std::move(defaults)) {}

  torch::Tensor step(LossClosure closure = nullptr) override;
  void save(torch::serialize::OutputArchive& archive) const override;
  void load(torch::serialize::InputArchive& archive) override;
  /// Adds a group, keeping its own options (fields left at their defaults inherit the
  /// optimizer's). Hides torch::optim::Optimizer::add_param_group, which is not virtual and
  /// would replace torchspeed options by the defaults: call it on the torchspeed type.
  void add_param_group(const torch::optim::OptimizerParamGroup& param_group);
};

}  // namespace torchspeed::optim
