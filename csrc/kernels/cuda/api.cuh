// Host-side API of the torch-free CUDA kernel layer: plain structs of raw device pointers and the
// launch functions the op glue (csrc/ops/cuda) calls. Includable by a host C++ compiler.
//
//   kernels::cuda::GradStatsTensor t{ptr, numel, kernels::cuda::DType::kFloat};
//   cudaError_t e = kernels::cuda::grad_stats(&t, 1, nullptr, workspace, total, nullptr,
//                                             found_inf, stream);
//
// Every function only enqueues work on `stream` (kernels and cudaMemsetAsync): nothing waits for
// the device, nothing copies from or to the host, so it is safe under
// torch.cuda.set_sync_debug_mode("error") and inside CUDA graph capture. Errors are the launch
// errors (cudaGetLastError after each launch); the caller turns them into exceptions.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace torchspeed::kernels::cuda {

/// Element types a kernel can be asked to run on (same values as kernels::cpu::DType).
enum class DType : int { kFloat = 0, kDouble = 1, kBFloat16 = 2, kHalf = 3 };

// ---- grad_stats ---------------------------------------------------------------------------------

/// One contiguous tensor of a grad_stats call. Its position in the array is its index in the
/// per-tensor outputs. numel == 0 is allowed (skipped).
struct GradStatsTensor {
  void* data;
  int64_t numel;
  DType dtype;
};

/// Sum of squares per tensor and a non-finite flag in one pass (and, when inv_scale is set, an
/// in-place multiply by *inv_scale in the same pass; the flag looks at the values before it).
///   workspace         `count` doubles of device memory (zeroed here)
///   total_norm        1 float: sqrt of the sum over all tensors
///   per_tensor_norms  `count` floats or null
///   found_inf         1 float: set to 0 here, then 1.0 by any block that saw inf/NaN
cudaError_t grad_stats(const GradStatsTensor* tensors, int64_t count, const float* inv_scale,
                       double* workspace, float* total_norm, float* per_tensor_norms,
                       float* found_inf, cudaStream_t stream);

// ---- fused optimizer steps ----------------------------------------------------------------------

enum class OptimAlgo : int { kAdam = 0, kSgd = 1, kLion = 2, kLamb = 3 };

/// One parameter and its state. Null pointers mean "absent"; state, master, mask and ema are
/// contiguous float32 with `numel` elements, param and grad contiguous in their dtype.
struct OptimTensor {
  void* param;
  const void* grad;
  float* master;
  float* state0;  // Adam/LAMB: exp_avg; SGD: momentum_buffer; Lion: exp_avg
  float* state1;  // Adam/LAMB: exp_avg_sq
  float* state2;  // Adam: max_exp_avg_sq (amsgrad)
  const float* mask;
  float* ema;
  float* step;  // one float32 on the device (Adam, Lion, LAMB); null for SGD
  int64_t numel;
  DType param_dtype;  // kFloat, kBFloat16 or kHalf
  DType grad_dtype;   // kFloat, kBFloat16 or kHalf
};

/// Hyperparameters of one step, rounded exactly as the CPU op rounds them (see
/// csrc/ops/cpu/optim_cpu.cpp): float fields are float(python value) or float(1.0 - value)
/// computed in double on the host; values the kernel combines with the device step or the device
/// lr stay double.
struct OptimHyper {
  double lr;     // used when lr_tensor is null
  double beta1;  // for 1 - beta1^step, in double as torch.optim does
  double beta2;
  float weight_decay;
  float beta2_f;
  float one_minus_beta1;
  float one_minus_beta2;
  float eps;
  float momentum;
  float one_minus_dampening;
  float one_minus_ema_decay;
  bool amsgrad;
  bool maximize;
  bool decoupled_weight_decay;
  bool nesterov;
  bool first_step;
  // One-element float32 device tensors, or null.
  const float* lr_tensor;
  const float* grad_scale;  // grads are multiplied by float(1.0 / double(*grad_scale))
  const float* found_inf;   // != 0: nothing is written, steps are not incremented
  const float* clip_coef;   // grads are also multiplied by it
};

/// One fused step over all `count` params of a group: increments the steps on the device (unless
/// *found_inf != 0), then runs the update: one launch per 24 tensors / 320 chunks of 64K elements
/// (4 blocks per chunk) and per (param dtype, grad dtype) pair present. LAMB runs phase 1 (moments
/// + norms) over all tensors, then phase 2 (trust-ratio update); `lamb_workspace` is 2 * count
/// doubles of device memory (zeroed here), null for the other algorithms.
cudaError_t optim_step(OptimAlgo algo, const OptimTensor* tensors, int64_t count,
                       const OptimHyper& hyper, double* lamb_workspace, cudaStream_t stream);

}  // namespace torchspeed::kernels::cuda
