// The optimizer area's ops, for C++ callers: one argument struct per op (fields in the schema's
// order and with its names, see csrc/ops/optim.cpp for the schemas and their documentation) and
// one entry point taking it, which calls through the dispatcher (CPU, CUDA or Meta by the tensors'
// device), as torch.ops.torchspeed.<op> does from Python.
//
//   std::vector<at::Tensor> params = ..., grads = ..., m = ..., v = ..., steps = ...;
//   torchspeed::AdamStepArgs a;
//   a.params = params; a.grads = grads; a.exp_avgs = m; a.exp_avg_sqs = v; a.steps = steps;
//   a.lr = 1e-3; a.weight_decay = 1e-2; a.decoupled_weight_decay = true;  // AdamW
//   torchspeed::adam_step_(a);
//
// Struct defaults are the schema's defaults, and torch.optim's where the schema has none.
#pragma once

#include <ATen/core/Tensor.h>

#include <optional>
#include <string>
#include <tuple>

#include "torchspeed/export.h"
#include "torchspeed/ops/args.h"

namespace torchspeed {

using OptTensor = std::optional<at::Tensor>;
using GradStatsTuple = std::tuple<at::Tensor, at::Tensor, at::Tensor>;

// ---- grad_stats, grad_stats_unscale_ ------------------------------------------------------------

#define TORCHSPEED_GRAD_STATS_ARGS(X) \
  X(at::TensorList, tensors, {})      \
  X(bool, per_tensor, false)
TORCHSPEED_OP_ARGS(GradStatsArgs, "grad_stats", GradStatsTuple, TORCHSPEED_GRAD_STATS_ARGS);

#define TORCHSPEED_GRAD_STATS_UNSCALE_ARGS(X) \
  X(at::TensorList, tensors, {})              \
  X(at::Tensor, inv_scale, {})                \
  X(bool, per_tensor, false)
TORCHSPEED_OP_ARGS(GradStatsUnscaleArgs, "grad_stats_unscale_", GradStatsTuple,
                   TORCHSPEED_GRAD_STATS_UNSCALE_ARGS);

// ---- fused optimizer steps ----------------------------------------------------------------------

/// The arguments every fused step ends with: scalar tensors read on the device, and the EMA decay.
#define TORCHSPEED_STEP_TAIL_ARGS(X)     \
  X(OptTensor, lr_tensor, std::nullopt)  \
  X(OptTensor, grad_scale, std::nullopt) \
  X(OptTensor, found_inf, std::nullopt)  \
  X(OptTensor, clip_coef, std::nullopt)  \
  X(double, ema_decay, 0.0)

#define TORCHSPEED_ADAM_STEP_ARGS(X)     \
  X(at::TensorList, params, {})          \
  X(at::TensorList, grads, {})           \
  X(at::TensorList, exp_avgs, {})        \
  X(at::TensorList, exp_avg_sqs, {})     \
  X(at::TensorList, max_exp_avg_sqs, {}) \
  X(at::TensorList, masters, {})         \
  X(at::TensorList, steps, {})           \
  X(at::TensorList, masks, {})           \
  X(at::TensorList, emas, {})            \
  X(double, lr, 1e-3)                    \
  X(double, beta1, 0.9)                  \
  X(double, beta2, 0.999)                \
  X(double, eps, 1e-8)                   \
  X(double, weight_decay, 0.0)           \
  X(bool, amsgrad, false)                \
  X(bool, maximize, false)               \
  X(bool, decoupled_weight_decay, false) \
  TORCHSPEED_STEP_TAIL_ARGS(X)
TORCHSPEED_OP_ARGS(AdamStepArgs, "adam_step_", void, TORCHSPEED_ADAM_STEP_ARGS);

/// Adam/AdamW with low-bit moments (torchspeed.optim's state_dtype "bf16" / "int8"); see the
/// schema in csrc/ops/optim.cpp. No amsgrad.
#define TORCHSPEED_ADAM_LOWBIT_STEP_ARGS(X)  \
  X(at::TensorList, params, {})              \
  X(at::TensorList, grads, {})               \
  X(at::TensorList, exp_avgs, {})            \
  X(at::TensorList, exp_avg_sqs, {})         \
  X(at::TensorList, exp_avg_absmaxes, {})    \
  X(at::TensorList, exp_avg_sq_absmaxes, {}) \
  X(at::TensorList, masters, {})             \
  X(at::TensorList, steps, {})               \
  X(at::TensorList, masks, {})               \
  X(at::TensorList, emas, {})                \
  X(int64_t, state_block, 256)               \
  X(double, lr, 1e-3)                        \
  X(double, beta1, 0.9)                      \
  X(double, beta2, 0.999)                    \
  X(double, eps, 1e-8)                       \
  X(double, weight_decay, 0.0)               \
  X(bool, maximize, false)                   \
  X(bool, decoupled_weight_decay, false)     \
  TORCHSPEED_STEP_TAIL_ARGS(X)
TORCHSPEED_OP_ARGS(AdamLowbitStepArgs, "adam_lowbit_step_", void, TORCHSPEED_ADAM_LOWBIT_STEP_ARGS);

// ---- int8 optimizer state: encode / decode (the step's own maps) -------------------------------

using LowbitCodesTuple = std::tuple<at::Tensor, at::Tensor>;

#define TORCHSPEED_LOWBIT_ENCODE_ARGS(X) \
  X(at::Tensor, values, {})              \
  X(bool, is_signed, true)               \
  X(int64_t, state_block, 256)
TORCHSPEED_OP_ARGS(LowbitEncodeArgs, "lowbit_encode", LowbitCodesTuple,
                   TORCHSPEED_LOWBIT_ENCODE_ARGS);

#define TORCHSPEED_LOWBIT_DECODE_ARGS(X) \
  X(at::Tensor, codes, {})               \
  X(at::Tensor, absmax, {})              \
  X(int64_t, state_block, 256)
TORCHSPEED_OP_ARGS(LowbitDecodeArgs, "lowbit_decode", at::Tensor, TORCHSPEED_LOWBIT_DECODE_ARGS);

#define TORCHSPEED_SGD_STEP_ARGS(X)       \
  X(at::TensorList, params, {})           \
  X(at::TensorList, grads, {})            \
  X(at::TensorList, momentum_buffers, {}) \
  X(at::TensorList, masters, {})          \
  X(at::TensorList, masks, {})            \
  X(at::TensorList, emas, {})             \
  X(double, lr, 1e-3)                     \
  X(double, momentum, 0.0)                \
  X(double, dampening, 0.0)               \
  X(double, weight_decay, 0.0)            \
  X(bool, nesterov, false)                \
  X(bool, maximize, false)                \
  X(bool, first_step, false)              \
  TORCHSPEED_STEP_TAIL_ARGS(X)
TORCHSPEED_OP_ARGS(SgdStepArgs, "sgd_step_", void, TORCHSPEED_SGD_STEP_ARGS);

/// SGD with a low-bit momentum buffer (torchspeed.optim.SGD's state_dtype "bf16" / "int8");
/// see the schema in csrc/ops/optim.cpp.
#define TORCHSPEED_SGD_LOWBIT_STEP_ARGS(X)        \
  X(at::TensorList, params, {})                   \
  X(at::TensorList, grads, {})                    \
  X(at::TensorList, momentum_buffers, {})         \
  X(at::TensorList, momentum_buffer_absmaxes, {}) \
  X(at::TensorList, masters, {})                  \
  X(at::TensorList, steps, {})                    \
  X(at::TensorList, masks, {})                    \
  X(at::TensorList, emas, {})                     \
  X(int64_t, state_block, 256)                    \
  X(double, lr, 1e-3)                             \
  X(double, momentum, 0.0)                        \
  X(double, dampening, 0.0)                       \
  X(double, weight_decay, 0.0)                    \
  X(bool, nesterov, false)                        \
  X(bool, maximize, false)                        \
  X(bool, first_step, false)                      \
  TORCHSPEED_STEP_TAIL_ARGS(X)
TORCHSPEED_OP_ARGS(SgdLowbitStepArgs, "sgd_lowbit_step_", void, TORCHSPEED_SGD_LOWBIT_STEP_ARGS);

#define TORCHSPEED_LION_STEP_ARGS(X) \
  X(at::TensorList, params, {})      \
  X(at::TensorList, grads, {})       \
  X(at::TensorList, exp_avgs, {})    \
  X(at::TensorList, masters, {})     \
  X(at::TensorList, steps, {})       \
  X(at::TensorList, masks, {})       \
  X(at::TensorList, emas, {})        \
  X(double, lr, 1e-4)                \
  X(double, beta1, 0.9)              \
  X(double, beta2, 0.99)             \
  X(double, weight_decay, 0.0)       \
  X(bool, maximize, false)           \
  TORCHSPEED_STEP_TAIL_ARGS(X)
TORCHSPEED_OP_ARGS(LionStepArgs, "lion_step_", void, TORCHSPEED_LION_STEP_ARGS);

/// Lion with a low-bit moment (torchspeed.optim.Lion's state_dtype "bf16" / "int8"); see the
/// schema in csrc/ops/optim.cpp.
#define TORCHSPEED_LION_LOWBIT_STEP_ARGS(X) \
  X(at::TensorList, params, {})             \
  X(at::TensorList, grads, {})              \
  X(at::TensorList, exp_avgs, {})           \
  X(at::TensorList, exp_avg_absmaxes, {})   \
  X(at::TensorList, masters, {})            \
  X(at::TensorList, steps, {})              \
  X(at::TensorList, masks, {})              \
  X(at::TensorList, emas, {})               \
  X(int64_t, state_block, 256)              \
  X(double, lr, 1e-4)                       \
  X(double, beta1, 0.9)                     \
  X(double, beta2, 0.99)                    \
  X(double, weight_decay, 0.0)              \
  X(bool, maximize, false)                  \
  TORCHSPEED_STEP_TAIL_ARGS(X)
TORCHSPEED_OP_ARGS(LionLowbitStepArgs, "lion_lowbit_step_", void, TORCHSPEED_LION_LOWBIT_STEP_ARGS);

#define TORCHSPEED_LAMB_STEP_ARGS(X) \
  X(at::TensorList, params, {})      \
  X(at::TensorList, grads, {})       \
  X(at::TensorList, exp_avgs, {})    \
  X(at::TensorList, exp_avg_sqs, {}) \
  X(at::TensorList, masters, {})     \
  X(at::TensorList, steps, {})       \
  X(at::TensorList, masks, {})       \
  X(at::TensorList, emas, {})        \
  X(double, lr, 1e-3)                \
  X(double, beta1, 0.9)              \
  X(double, beta2, 0.999)            \
  X(double, eps, 1e-6)               \
  X(double, weight_decay, 0.0)       \
  X(bool, maximize, false)           \
  TORCHSPEED_STEP_TAIL_ARGS(X)       \
  X(OptTensor, norms, std::nullopt)  \
  X(int64_t, phase, 0)
TORCHSPEED_OP_ARGS(LambStepArgs, "lamb_step_", void, TORCHSPEED_LAMB_STEP_ARGS);

// ---- entry points (csrc/ops/optim.cpp) ----------------------------------------------------------

/// What grad_stats returns: float32 tensors on the inputs' device.
struct GradStats {
  at::Tensor total_norm;        ///< 0-dim: the L2 norm of all elements of all tensors
  at::Tensor per_tensor_norms;  ///< [n] when per_tensor, else [0]
  at::Tensor found_inf;         ///< 0-dim: 1.0 if any element was inf or NaN, else 0.0
};

/// One read-only pass over `tensors`: global L2 norm, optional per-tensor norms, non-finite flag.
/// An empty list gives norm 0 and found_inf 0 on the CPU, as torch.nn.utils.clip_grad_norm_([]).
TORCHSPEED_API GradStats grad_stats(at::TensorList tensors, bool per_tensor = false);

/// int8 optimizer state of float32 `values` (any shape, contiguous): codes of the same shape
/// (int8, the first moment's map, when is_signed; uint8, the second moment's, otherwise) and one
/// float32 absmax per block of state_block elements; decode is the inverse. The maps are the
/// fused step's own (kernels/cpu/lowbit_state.h), so loading a state and stepping agree exactly.
TORCHSPEED_API LowbitCodesTuple lowbit_encode(const LowbitEncodeArgs& args);
TORCHSPEED_API at::Tensor lowbit_decode(const LowbitDecodeArgs& args);
/// The moment format ("fp32", "bf16" or "int8") a param of `numel` elements gets under these
/// options; refuses an unknown state_dtype, min_lowbit_numel < 0 and a state_block that is not a
/// power of two in [8, 4096] (the one validator of the optimizers' state options).
/// Throws c10::ValueError (ValueError in Python) naming the bad value.
TORCHSPEED_API std::string lowbit_state_format(const std::string& state_dtype, int64_t numel,
                                               int64_t min_lowbit_numel, int64_t state_block);

/// As grad_stats, after multiplying every tensor in place by `inv_scale` (one-element float32
/// tensor on the tensors' device); non-finite values are detected before unscaling.
TORCHSPEED_API GradStats grad_stats_unscale_(at::TensorList tensors, const at::Tensor& inv_scale,
                                             bool per_tensor = false);

/// One fused step over one parameter group, in place (params, state, steps); see the schemas.
TORCHSPEED_API void adam_step_(const AdamStepArgs& args);
TORCHSPEED_API void adam_lowbit_step_(const AdamLowbitStepArgs& args);
TORCHSPEED_API void sgd_step_(const SgdStepArgs& args);
TORCHSPEED_API void sgd_lowbit_step_(const SgdLowbitStepArgs& args);
TORCHSPEED_API void lion_step_(const LionStepArgs& args);
TORCHSPEED_API void lion_lowbit_step_(const LionLowbitStepArgs& args);
TORCHSPEED_API void lamb_step_(const LambStepArgs& args);

}  // namespace torchspeed
