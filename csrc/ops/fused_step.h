// One fused optimizer step, independent of the device: built once from an op's argument struct
// (validated, hyperparameters rounded as torch.optim rounds them), then run by the CPU
// (ops/cpu/optim_cpu.cpp) or the CUDA (ops/cuda/optim_cuda.cpp) kernel driver.
#pragma once

#include <ATen/ATen.h>

#include <cstddef>
#include <cstdint>
#include <vector>

#include "kernels/common/optim_types.h"
#include "torchspeed/ops/optim.h"

namespace torchspeed::ops {

struct FusedStep {
  const char* op;
  kernels::OptimAlgo algo;
  // One tensor per param, or empty when the algorithm or the call does not use the list.
  at::TensorList params, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, masters, steps, masks, emas;
  // int8 moments (Adam, Lion, SGD): one float32 absmax per block of hyper.state_block elements.
  at::TensorList exp_avg_absmaxes, exp_avg_sq_absmaxes;
  const OptTensor* lr_tensor;
  const OptTensor* grad_scale;
  const OptTensor* found_inf;
  const OptTensor* clip_coef;
  kernels::OptimHyper hyper;
  // LAMB's phases (lamb_step_): 0 the whole step; 1 the moments and each tensor's squared norms
  // into lamb_norms (float64 [n, 2]); 2 the update with the norms lamb_norms holds.
  int64_t lamb_phase = 0;
  const OptTensor* lamb_norms = nullptr;

  /// True when two tensors the step writes share memory (see writes_overlap in optim_checks.h):
  /// the drivers then step the params one after the other, in list order, as torch.optim does.
  bool writes_overlap() const;
  /// The step of params[i] alone.
  FusedStep element(size_t i) const;
  /// The grads, each in its param's memory layout (itself when it already is).
  std::vector<at::Tensor> grads_like_params() const;
  /// The kernels' view of params[i] and its state from element `begin` for `length` elements
  /// (the whole tensor: 0, numel), with `grad` from grads_like_params(); null for what is absent.
  kernels::OptimTensor tensor(size_t i, const at::Tensor& grad, int64_t begin,
                              int64_t length) const;
};

/// Validates the op's arguments (every list, every scalar tensor, before anything is written) and
/// returns the step. The struct must outlive the result.
FusedStep fused_step(const AdamStepArgs& a);
FusedStep fused_step(const AdamLowbitStepArgs& a);
FusedStep fused_step(const SgdStepArgs& a);
FusedStep fused_step(const SgdLowbitStepArgs& a);
FusedStep fused_step(const LionStepArgs& a);
FusedStep fused_step(const LionLowbitStepArgs& a);
FusedStep fused_step(const LambStepArgs& a);

}  // namespace torchspeed::ops
