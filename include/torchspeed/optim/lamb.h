// torchspeed::optim::LAMB: a torch::optim-style C++ optimizer (torch::optim does not ship it) whose
// step is one fused torchspeed::lamb_step_ call per (param group, master/no-master bucket), on CPU
// or CUDA. Same defaults and semantics as torchspeed.optim.LAMB in Python.
//
//   #include <torchspeed/optim.h>
//   torchspeed::optim::LAMB lamb(model->parameters(),
//                                torchspeed::optim::LAMBOptions(1e-3).weight_decay(0.01));
#pragma once

#include "torchspeed/optim/fused.h"

/// LAMB (You et al. 2020) with bias correction, one step being
///   u = m_hat / (sqrt(v_hat) + eps) + wd * p;  p -= lr * trust * u
/// with the per-tensor trust ratio trust = ||p|| / ||u|| (1 when either is 0); plus maximize, then
/// the common tail.
#define TORCHSPEED_LAMB_OPTIONS(X)         \
  X(double, lr, 1e-3)                      \
  X(betas_t, betas, (betas_t{0.9, 0.999})) \
  X(double, eps, 1e-6)                     \
  X(double, weight_decay, 0.0)             \
  X(bool, maximize, false)                 \
  TORCHSPEED_FUSED_OPTIONS_TAIL(X)

/// Laid out as torchspeed.optim.LAMB's state in Python: float32 tensors on the param's device, in
/// its memory layout; `step` is 0-dim (counted by the kernel), `master` is defined only for
/// low-precision params with master weights, `ema` only with ema_decay.
#define TORCHSPEED_LAMB_STATE(X) X(step) X(exp_avg) X(exp_avg_sq) X(master) X(ema)

namespace torchspeed::optim {

struct TORCHSPEED_API LAMBOptions : public torch::optim::OptimizerCloneableOptions<LAMBOptions> {
  TORCHSPEED_OPTIM_OPTIONS_BODY(LAMBOptions, TORCHSPEED_LAMB_OPTIONS, = 1e-3)
};

struct TORCHSPEED_API LAMBParamState
    : public torch::optim::OptimizerCloneableParamState<LAMBParamState> {
  TORCHSPEED_OPTIM_STATE_BODY(TORCHSPEED_LAMB_STATE)
};

/// LAMB with one fused kernel per param group (the trust ratio per tensor, in the same call).
class TORCHSPEED_API LAMB : public FusedOptimizer {
  TORCHSPEED_FUSED_OPTIMIZER_BODY(LAMB, LAMBOptions, = {})

 public:
  /// Half of a step over params that are pieces of larger ones (torchspeed::dist::ZeroOptimizer,
  /// where a param's trust ratio needs the norms of all of its pieces, on every rank). Phase 1
  /// counts the steps, updates the moments and returns the params that had a grad with float64
  /// [n, 2] rows of their ||p||^2 and ||u||^2 (on their device). The caller sums the rows of each
  /// whole param's pieces; phase 2 applies the update with those sums (`norms` row i for
  /// `params[i]`, the params phase 1 returned). Nothing may change the params, grads or state in
  /// between. Python: LAMB._sharded_step.
  std::pair<std::vector<torch::Tensor>, torch::Tensor> sharded_step_phase1(
      const GradScaling& scaling = {});
  void sharded_step_phase2(const std::vector<torch::Tensor>& params, const torch::Tensor& norms,
                           const GradScaling& scaling = {});
};

}  // namespace torchspeed::optim
