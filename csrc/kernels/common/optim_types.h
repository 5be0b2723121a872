// Types of the fused optimizer steps shared by the CPU kernels (kernels/cpu), the CUDA kernels
// (kernels/cuda) and the op glue (csrc/ops): the element types, the algorithms, the host-rounded
// hyperparameters, one tensor's pointers and the per-tensor scalars of one step.
//
// Plain data only (no inline code), so the CPU ISA units may include it (see the ODR rule in
// csrc/kernels/README.md), and torch-free, so nvcc and the host compiler may too.
#pragma once

#include <cstdint>

namespace torchspeed::kernels {

/// Element types a kernel can be asked to run on.
enum class DType : int { kFloat = 0, kDouble = 1, kBFloat16 = 2, kHalf = 3 };

/// How a step's moments are stored (Adam/AdamW, Lion, SGD; see kernels/cpu/lowbit_state.h):
///   kFloat     float32 (exp_avg, exp_avg_sq)
///   kBFloat16  bfloat16, written back with stochastic rounding
///   kInt8      int8 codes in blocks of `state_block` elements with one float32 absmax per block:
///              m = sign(c) * (|c| / 127)^2 * absmax (int8 c), v = (c / 255)^4 * absmax (uint8 c)
enum class StateFormat : int { kFloat = 0, kBFloat16 = 1, kInt8 = 2 };

/// The fused optimizer algorithms.
enum class OptimAlgo : int { kAdam = 0, kSgd = 1, kLion = 2, kLamb = 3 };

/// The hyperparameters of one step, as the op glue rounds them once on the host for the CPU and the
/// CUDA kernels alike: float fields are float(value) or float(1.0 - value) computed in double, as
/// torch.optim's for-loop path rounds its Python floats. Values combined with the step count or a
/// device lr stay double.
struct OptimHyper {
  double lr;     // used when there is no lr tensor
  double beta1;  // for 1 - beta1^step, in double as torch.optim does
  double beta2;
  float weight_decay;
  float beta2_f;
  float one_minus_beta1;
  float one_minus_beta2;
  float eps;
  float momentum;             // SGD
  float one_minus_dampening;  // SGD
  float one_minus_ema_decay;  // EMA: ema += (1 - decay) * (param - ema)
  bool amsgrad;
  bool maximize;
  bool decoupled_weight_decay;  // AdamW (true) vs Adam's L2 penalty (false)
  bool nesterov;                // SGD
  bool first_step;              // SGD: the momentum buffer is initialised from the grad
  StateFormat state_format;     // Adam, Lion, SGD: how the moments are stored (else kFloat)
  int32_t state_block;          // kInt8: elements per quantization block (a power of two)
};

/// One parameter (or one contiguous range of it, on the CPU) and its state. Null means absent.
/// State, master and ema are float32 with `numel` elements laid out like the param; param and
/// grad are in their own dtypes; the mask is bit-packed (bit j of byte b = element 8b + j of this
/// range, in the param's memory order; 1 keeps, 0 zeroes), so a CPU range starts on a mask byte.
/// The state tensors, per algorithm:
///   exp_avg         Adam, LAMB, Lion: the first moment; SGD: the momentum buffer
///   exp_avg_sq      Adam, LAMB: the second moment
///   max_exp_avg_sq  Adam with amsgrad: the running maximum of exp_avg_sq
struct OptimTensor {
  void* param;
  const void* grad;
  float* master;  // fp32 master weights: the update happens here, param gets the rounded value
  float* exp_avg;
  float* exp_avg_sq;
  float* max_exp_avg_sq;
  const uint8_t* mask;  // packed pruning mask: the param is zeroed where its bit is 0
  float* ema;           // EMA copy of the (master) param, updated after the step
  float* step;          // one float32 (Adam, Lion, LAMB; CUDA only: the CPU glue reads it itself)
  // Low-bit moments (OptimHyper::state_format != kFloat; exp_avg and exp_avg_sq are then null):
  // bf16 values, or int8 / uint8 codes with one float32 absmax per block (this range starts on a
  // block). `sr_index` is the index of this range's first element in its param and `sr_salt`
  // (the step count and the param's position) seeds bf16's stochastic rounding.
  void* exp_avg_lp;
  void* exp_avg_sq_lp;
  float* exp_avg_absmax;
  float* exp_avg_sq_absmax;
  int64_t sr_index;
  uint32_t sr_salt;
  int64_t numel;
  DType param_dtype;  // kFloat, kBFloat16 or kHalf
  DType grad_dtype;   // kFloat, kBFloat16 or kHalf
};

/// The scalars of one tensor's step, derived from the hyperparameters, the lr, the AMP scale, the
/// clip coefficient and the tensor's step count by step_scalars() (step_scalars.h): on the host
/// for the CPU kernels, by one thread per block on the GPU.
struct StepScalars {
  float lr;
  float grad_scale;             // grads are multiplied by this: AMP 1/scale times clip coefficient
  float param_decay;            // 1 - lr * weight_decay (decoupled decay, Lion)
  float step_size;              // Adam: lr / (1 - beta1^step); LAMB phase 2: lr * trust ratio
  float bias_correction1;       // 1 - beta1^step (LAMB)
  float bias_correction2;       // 1 - beta2^step (LAMB)
  float bias_correction2_sqrt;  // sqrt(1 - beta2^step) (Adam)
};

}  // namespace torchspeed::kernels
