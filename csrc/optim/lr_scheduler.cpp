// Learning-rate schedules (include/torchspeed/optim/lr_scheduler.h): one closed-form schedule
// written once as a template over the step's type, so the host path (double) and the device path
// (a tensor, CUDA-graph capturable) compute the same formula; the validator; the WarmupLR driver.
#include "torchspeed/optim/lr_scheduler.h"

#include <ATen/ATen.h>

#include <cmath>
#include <optional>

#include "torchspeed/optim/adam.h"
#include "torchspeed/optim/lamb.h"
#include "torchspeed/optim/lion.h"
#include "torchspeed/optim/sgd.h"

namespace torchspeed::optim {
namespace {

constexpr const char* kName = "torchspeed.optim.lr_scheduler.WarmupLR";
constexpr double kPi = 3.14159265358979323846;

// The few operations the schedule needs, for double and for at::Tensor.
double clamp01(double x) { return x < 0 ? 0 : (x > 1 ? 1 : x); }
at::Tensor clamp01(const at::Tensor& x) { return at::clamp(x, 0.0, 1.0); }
double cos_(double x) { return std::cos(x); }
at::Tensor cos_(const at::Tensor& x) { return at::cos(x); }
double pow_(double base, double e) { return std::pow(base, e); }
at::Tensor pow_(double base, const at::Tensor& e) { return at::pow(base, e); }
double select(bool c, double a, double b) { return c ? a : b; }
at::Tensor select(const at::Tensor& c, const at::Tensor& a, const at::Tensor& b) {
  return at::where(c, a, b);
}

/// The schedule at step t (double or tensor), written once.
template <class T>
T schedule(const T& t, double base, const WarmupLROptions& o) {
  const double w = static_cast<double>(o.warmup_steps());
  const double span = static_cast<double>(o.total_steps() - o.warmup_steps());
  // Warmup: the factor from start_factor (t = 0) to 1 (t = w).
  const T frac = w > 0 ? clamp01(t / (w > 0 ? w : 1.0)) : clamp01(t * 0.0 + 1.0);
  const T factor = o.warmup() == "linear" ? o.start_factor() + (1.0 - o.start_factor()) * frac
                                          : pow_(o.start_factor(), 1.0 - frac);
  const T warm = base * factor;
  // Decay over the remaining steps, from base to eta_min.
  // No decay span (total_steps == warmup_steps): the lr stays at base after the warmup.
  const T u = span > 0 ? clamp01((t - w) / (span > 0 ? span : 1.0)) : t * 0.0;
  T decayed = u * 0.0 + base;
  if (o.decay() == "cosine") {
    decayed = o.eta_min() + (base - o.eta_min()) * (1.0 + cos_(u * kPi)) * 0.5;
  } else if (o.decay() == "linear") {
    decayed = base + (o.eta_min() - base) * u;
  }
  return select(t < w, warm, decayed);
}

/// The lr_tensor field of a torchspeed fused optimizer's group options, or null.
std::optional<torch::Tensor>* lr_tensor_of(torch::optim::OptimizerOptions& o) {
  if (auto* a = dynamic_cast<AdamOptions*>(&o)) return &a->lr_tensor();
  if (auto* a = dynamic_cast<AdamWOptions*>(&o)) return &a->lr_tensor();
  if (auto* a = dynamic_cast<SGDOptions*>(&o)) return &a->lr_tensor();
  if (auto* a = dynamic_cast<LionOptions*>(&o)) return &a->lr_tensor();
  if (auto* a = dynamic_cast<LAMBOptions*>(&o)) return &a->lr_tensor();
  return nullptr;
}

}  // namespace

void validate(const WarmupLROptions& o) {
  TORCH_CHECK_VALUE(o.warmup_steps() >= 0, kName, ": warmup_steps must be >= 0, got ",
                    o.warmup_steps());
  TORCH_CHECK_VALUE(o.total_steps() >= o.warmup_steps(), kName,
                    ": total_steps must be >= warmup_steps (", o.warmup_steps(), "), got ",
                    o.total_steps());
  TORCH_CHECK_VALUE(o.warmup() == "linear" || o.warmup() == "exponential", kName,
                    ": warmup must be 'linear' or 'exponential', got '", o.warmup(), "'");
  TORCH_CHECK_VALUE(o.decay() == "cosine" || o.decay() == "linear" || o.decay() == "constant",
                    kName, ": decay must be 'cosine', 'linear' or 'constant', got '", o.decay(),
                    "'");
  const bool exp = o.warmup() == "exponential";
  TORCH_CHECK_VALUE(
      std::isfinite(o.start_factor()) && (exp ? o.start_factor() > 0 : o.start_factor() >= 0) &&
          o.start_factor() <= 1,
      kName, ": start_factor must be in ", exp ? "(0, 1]" : "[0, 1]", ", got ", o.start_factor());
  TORCH_CHECK_VALUE(std::isfinite(o.eta_min()) && o.eta_min() >= 0, kName,
                    ": eta_min must be finite and >= 0, got ", o.eta_min());
}

double warmup_lr(int64_t t, double base_lr, const WarmupLROptions& o) {
  return schedule(static_cast<double>(t), base_lr, o);
}

at::Tensor warmup_lr(const at::Tensor& t, double base_lr, const WarmupLROptions& o) {
  TORCH_CHECK(t.numel() == 1 && t.is_floating_point(), kName,
              ": the step must be a one-element float tensor, got ", t.scalar_type(), " of shape ",
              t.sizes());
  return schedule(t.to(at::kDouble), base_lr, o).to(at::kFloat);
}

double scaled_lr(double reference_lr, int64_t reference_batch_size, int64_t batch_size,
                 const std::string& rule) {
  TORCH_CHECK_VALUE(
      std::isfinite(reference_lr) && reference_lr >= 0,
      "torchspeed.optim.lr_scheduler.scaled_lr: reference_lr must be finite and >= 0, "
      "got ",
      reference_lr);
  TORCH_CHECK_VALUE(reference_batch_size > 0 && batch_size > 0,
                    "torchspeed.optim.lr_scheduler.scaled_lr: batch sizes must be > 0, got ",
                    reference_batch_size, " and ", batch_size);
  const double ratio = static_cast<double>(batch_size) / static_cast<double>(reference_batch_size);
  if (rule == "linear") return reference_lr * ratio;
  TORCH_CHECK_VALUE(rule == "sqrt",
                    "torchspeed.optim.lr_scheduler.scaled_lr: rule must be 'linear' or "
                    "'sqrt', got '",
                    rule, "'");
  return reference_lr * std::sqrt(ratio);
}

WarmupLR::WarmupLR(torch::optim::Optimizer& optimizer, WarmupLROptions options)
    : optimizer_(optimizer), options_(std::move(options)) {
  validate(options_);
  for (auto& g : optimizer_.param_groups()) base_lrs_.push_back(g.options().get_lr());
  apply();
}

void WarmupLR::step() {
  ++t_;
  // The device counter advances on the device (a captured CUDA graph replays the increment).
  if (t_tensor_.defined()) t_tensor_.add_(1.0);
  apply();
}

void WarmupLR::set_last_step(int64_t t) {
  TORCH_CHECK_VALUE(t >= 0, kName, ": the step must be >= 0, got ", t);
  t_ = t;
  if (t_tensor_.defined()) t_tensor_.fill_(static_cast<double>(t_));
  apply();
}

void WarmupLR::apply() {
  auto& groups = optimizer_.param_groups();
  TORCH_CHECK(groups.size() == base_lrs_.size(), kName,
              ": the optimizer's param groups changed since the scheduler was made");
  last_lr_.clear();
  for (size_t i = 0; i < groups.size(); ++i) {
    const double lr = warmup_lr(t_, base_lrs_[i], options_);
    groups[i].options().set_lr(lr);
    last_lr_.push_back(lr);
    std::optional<torch::Tensor>* lr_tensor = lr_tensor_of(groups[i].options());
    if (lr_tensor && lr_tensor->has_value() && (*lr_tensor)->defined()) {
      // On the lr tensor's device, with tensor ops only: no host value reaches the kernel.
      torch::NoGradGuard no_grad;
      if (!t_tensor_.defined()) {
        t_tensor_ =
            at::full({1}, static_cast<double>(t_), (*lr_tensor)->options().dtype(at::kDouble));
      }
      TORCH_CHECK(t_tensor_.device() == (*lr_tensor)->device(), kName,
                  ": every group's lr_tensor must be on one device (", t_tensor_.device(),
                  "), got ", (*lr_tensor)->device());
      (*lr_tensor)
          ->copy_(warmup_lr(t_tensor_, base_lrs_[i], options_).reshape((*lr_tensor)->sizes()));
    }
  }
}

}  // namespace torchspeed::optim
