// Learning-rate schedules: warmup (linear or exponential) then cosine, linear decay or constant,
// computed in closed form for a step t (one formula, for a host double and for a device tensor),
// and the linear-scaling rule. torchspeed.optim.lr_scheduler.WarmupLR calls the same functions.
//
//   torchspeed::optim::WarmupLR sched(opt, torchspeed::optim::WarmupLROptions(500, 10000));
//   for (...) { opt.step(); sched.step(); }
//   // A fused optimizer with lr_tensor: the lr is written on the device (CUDA-graph friendly):
//   //   auto lr = torch::zeros({1}, cuda); opts.lr_tensor(lr); ... sched.step() writes lr.
#pragma once

#include <torch/arg.h>
#include <torch/optim/optimizer.h>

#include <cstdint>
#include <string>
#include <vector>

#include "torchspeed/export.h"

namespace torchspeed::optim {

/// The schedule: for t < warmup_steps the factor goes from start_factor to 1 (linearly, as
/// torch's LinearLR, or geometrically); then over the remaining total_steps - warmup_steps steps
/// the lr goes from base to eta_min (half a cosine, as CosineAnnealingLR; or a straight line), or
/// stays at base ("constant"). After total_steps it stays at its last value.
struct TORCHSPEED_API WarmupLROptions {
  WarmupLROptions(int64_t warmup_steps, int64_t total_steps)
      : warmup_steps_(warmup_steps), total_steps_(total_steps) {}
  TORCH_ARG(int64_t, warmup_steps);
  TORCH_ARG(int64_t, total_steps);
  TORCH_ARG(std::string, warmup) = "linear";  // "linear" or "exponential"
  TORCH_ARG(std::string, decay) = "cosine";   // "cosine", "linear" or "constant"
  TORCH_ARG(double, start_factor) = 1.0 / 3;  // torch.optim.lr_scheduler.LinearLR's default
  TORCH_ARG(double, eta_min) = 0.0;           // CosineAnnealingLR's default
};

/// The one validator (Python's WarmupLR calls it too): c10::Error naming the argument.
TORCHSPEED_API void validate(const WarmupLROptions& o);

/// The lr at step t for a group whose base lr is base_lr.
TORCHSPEED_API double warmup_lr(int64_t t, double base_lr, const WarmupLROptions& o);
/// The same on the device: `t` a one-element tensor (any float dtype, on the lr's device);
/// returns a one-element float32 tensor there, with tensor ops only (no host sync, capturable).
TORCHSPEED_API at::Tensor warmup_lr(const at::Tensor& t, double base_lr, const WarmupLROptions& o);

/// The linear-scaling rule (Goyal et al.): the lr for a global batch, given a reference lr at a
/// reference batch; rule "sqrt" scales by the square root instead (often used with Adam).
TORCHSPEED_API double scaled_lr(double reference_lr, int64_t reference_batch_size,
                                int64_t batch_size, const std::string& rule = "linear");

/// Drives any torch::optim optimizer's groups (their `lr` option); a torchspeed fused optimizer
/// whose group has `lr_tensor` set gets it written on the device too. step() after each
/// optimizer step, as in Python; construction applies step 0 and reads the base lrs from the
/// groups, so on resume make the scheduler before loading the optimizer's state, then
/// set_last_step(saved step) (torch's Python schedulers have the same rule).
class TORCHSPEED_API WarmupLR {
 public:
  WarmupLR(torch::optim::Optimizer& optimizer, WarmupLROptions options);
  void step();
  /// The lrs applied last, one per group.
  const std::vector<double>& get_last_lr() const { return last_lr_; }
  int64_t last_step() const { return t_; }
  /// Resume: applies step t (what last_step() returned when the checkpoint was taken).
  void set_last_step(int64_t t);

 private:
  void apply();
  torch::optim::Optimizer& optimizer_;
  WarmupLROptions options_;
  std::vector<double> base_lrs_;
  std::vector<double> last_lr_;
  at::Tensor t_tensor_;  // the step on the device, when a group has lr_tensor
  int64_t t_ = 0;
};

}  // namespace torchspeed::optim
