// Argument checks shared by the fused optimizer ops' CPU, CUDA and Meta implementations: every
// list and scalar tensor is validated before the first element is modified.
#pragma once

#include <ATen/ATen.h>

#include <algorithm>
#include <cstdint>
#include <initializer_list>
#include <optional>
#include <utility>
#include <vector>

#include "kernels/common/optim_types.h"
#include "ops/checks.h"
#include "torchspeed/ops/optim.h"

namespace torchspeed::ops {

/// A per-param list argument: `optional` lists may be empty (feature off).
struct NamedList {
  const char* name;
  at::TensorList list;
  bool optional;
};

inline bool is_param_dtype(at::ScalarType t) {
  return t == at::kFloat || t == at::kBFloat16 || t == at::kHalf;
}

/// The kernels treat every per-param tensor as flat memory, so a state tensor must lie in memory
/// like its param: both contiguous, or the same sizes and strides (e.g. channels_last).
inline bool laid_out_like(const at::Tensor& t, const at::Tensor& p) {
  return (t.is_contiguous() && p.is_contiguous()) ||
         (t.sym_sizes() == p.sym_sizes() && t.sym_strides() == p.sym_strides());
}

/// A copy of `src` in dtype `dtype`, laid out in memory like `p` (same sizes and strides).
inline at::Tensor copy_laid_out_like(const at::Tensor& src, const at::Tensor& p,
                                     at::ScalarType dtype) {
  return at::empty_like(p, p.options().dtype(dtype)).copy_(src);
}

/// The grad in its param's memory layout (itself when it already is).
inline at::Tensor grad_like_param(const at::Tensor& g, const at::Tensor& p) {
  if (laid_out_like(g, p)) return g;
  return copy_laid_out_like(g, p, g.scalar_type());
}

/// Validates params, grads and the float32 state lists of one step.
/// Returns the params' device.
inline at::Device check_optim_args(const char* op, at::TensorList params, at::TensorList grads,
                                   std::initializer_list<NamedList> state) {
  TORCH_CHECK(!params.empty(), "torchspeed.", op,
              ": params must be a non-empty list of tensors, got an empty list");
  const at::Device device = params[0].device();
  TORCH_CHECK(grads.size() == params.size(), "torchspeed.", op,
              ": grads must have one tensor per "
              "param (",
              params.size(), "), got ", grads.size());
  for (size_t i = 0; i < params.size(); ++i) {
    const at::Tensor& p = params[i];
    const at::Tensor& g = grads[i];
    TORCH_CHECK(p.defined() && p.layout() == at::kStrided, "torchspeed.", op, ": params[", i,
                "] must be a dense tensor, got ", p.defined() ? c10::str(p.layout()) : "None");
    TORCH_CHECK(is_param_dtype(p.scalar_type()), "torchspeed.", op, ": params[", i,
                "] must be float32, bfloat16 or float16, got ", p.scalar_type());
    TORCH_CHECK(p.device() == device, "torchspeed.", op, ": params[", i, "] must be on ", device,
                " like params[0], got ", p.device());
    TORCH_CHECK(p.is_non_overlapping_and_dense(), "torchspeed.", op, ": params[", i,
                "] must be contiguous in some memory format (dense, non-overlapping), got sizes ",
                p.sizes(), " and strides ", p.strides());
    TORCH_CHECK(g.defined(), "torchspeed.", op, ": grads[", i, "] must be a tensor, got None");
    TORCH_CHECK(g.layout() == at::kStrided, "torchspeed.", op, ": grads[", i,
                "] must be dense; sparse gradients are not supported, got layout ", g.layout());
    TORCH_CHECK(is_param_dtype(g.scalar_type()), "torchspeed.", op, ": grads[", i,
                "] must be float32, bfloat16 or float16, got ", g.scalar_type());
    TORCH_CHECK(g.device() == device, "torchspeed.", op, ": grads[", i, "] must be on ", device,
                " like params[0], got ", g.device());
    TORCH_CHECK(g.sym_sizes() == p.sym_sizes(), "torchspeed.", op, ": grads[", i,
                "] must have the shape of params[", i, "] ", p.sym_sizes(), ", got ",
                g.sym_sizes());
  }
  for (const NamedList& s : state) {
    if (s.optional && s.list.empty()) continue;
    TORCH_CHECK(s.list.size() == params.size(), "torchspeed.", op, ": ", s.name,
                " must have one tensor per param (", params.size(), ")",
                s.optional ? " or be empty" : "", ", got ", s.list.size());
    for (size_t i = 0; i < params.size(); ++i) {
      const at::Tensor& t = s.list[i];
      TORCH_CHECK(t.defined() && t.layout() == at::kStrided && t.scalar_type() == at::kFloat,
                  "torchspeed.", op, ": ", s.name, "[", i, "] must be a float32 tensor, got ",
                  t.defined() ? c10::str(t.scalar_type(), " ", t.layout()) : std::string("None"));
      TORCH_CHECK(t.device() == device, "torchspeed.", op, ": ", s.name, "[", i, "] must be on ",
                  device, " like params[0], got ", t.device());
      TORCH_CHECK(t.sym_numel() == params[i].sym_numel(), "torchspeed.", op, ": ", s.name, "[", i,
                  "] must have ", params[i].sym_numel(), " elements like params[", i, "], got ",
                  t.sym_numel(), " (shape ", t.sym_sizes(), ")");
      TORCH_CHECK(laid_out_like(t, params[i]), "torchspeed.", op, ": ", s.name, "[", i,
                  "] must be laid out in memory like params[", i,
                  "] (both contiguous, or the same sizes and strides), got sizes ", t.sym_sizes(),
                  " strides ", t.sym_strides(), " for params[", i, "] sizes ",
                  params[i].sym_sizes(), " strides ", params[i].sym_strides());
    }
  }
  return device;
}

/// Checks the per-param `steps` list (one-element float32 tensors on the params' device).
inline void check_steps(const char* op, at::TensorList steps, size_t n, const at::Device& device) {
  TORCH_CHECK(steps.size() == n, "torchspeed.", op, ": steps must have one tensor per param (", n,
              "), got ", steps.size());
  for (size_t i = 0; i < n; ++i) {
    TORCH_CHECK(steps[i].defined() && steps[i].sym_numel() == 1 &&
                    steps[i].scalar_type() == at::kFloat && steps[i].device() == device,
                "torchspeed.", op, ": steps[", i, "] must be a one-element float32 tensor on ",
                device, ", got ",
                steps[i].defined() ? c10::str(steps[i].scalar_type(), " ", steps[i].sym_sizes(),
                                              " on ", steps[i].device())
                                   : std::string("None"));
  }
}

inline void check_masks(const char* op, at::TensorList params, at::TensorList masks) {
  if (masks.empty()) return;
  TORCH_CHECK(masks.size() == params.size(), "torchspeed.", op,
              ": masks must have one tensor per param (", params.size(), ") or be empty, got ",
              masks.size());
  // Bit-packed (torchspeed.prune's format): uint8 [ceil(numel / 8)], bit j of byte b masks element
  // 8b + j of the param in memory order; an empty tensor means no mask for that param.
  for (size_t i = 0; i < masks.size(); ++i) {
    const c10::SymInt bytes = (params[i].sym_numel() + 7) / 8;
    TORCH_CHECK(
        masks[i].defined() && masks[i].layout() == at::kStrided &&
            masks[i].scalar_type() == at::kByte && masks[i].is_contiguous() &&
            (masks[i].sym_numel() == bytes || masks[i].sym_numel() == 0) &&
            masks[i].device() == params[i].device(),
        "torchspeed.", op, ": masks[", i,
        "] must be a bit-packed mask (a contiguous uint8 tensor of ceil(numel / 8) = ", bytes,
        " bytes, or empty for none) on ", params[i].device(), ", got ",
        masks[i].defined()
            ? c10::str(masks[i].scalar_type(), " ", masks[i].sym_sizes(), " on ", masks[i].device())
            : std::string("None"));
  }
}

/// True when two tensors the op writes share memory: a param listed twice (tied weights collected
/// by hand), or params that are views of one storage. The chunks of one call run in parallel, so
/// the CPU and CUDA ops then update the params one after the other in list order, which is what
/// torch.optim's for-loop does. Only for real (CPU/CUDA) tensors: a tensor's span is
/// [data_ptr, data_ptr + numel * itemsize), as the validated tensors are dense.
inline bool writes_overlap(std::initializer_list<at::TensorList> lists) {
  std::vector<std::pair<uintptr_t, uintptr_t>> spans;
  for (const at::TensorList& list : lists) {
    for (const at::Tensor& t : list) {
      if (!t.defined() || t.numel() == 0) continue;
      const auto begin = reinterpret_cast<uintptr_t>(t.const_data_ptr());
      spans.emplace_back(begin, begin + static_cast<uintptr_t>(t.numel() * t.element_size()));
    }
  }
  std::sort(spans.begin(), spans.end());
  uintptr_t end = 0;
  for (const auto& [b, e] : spans) {
    if (b < end) return true;
    end = std::max(end, e);
  }
  return false;
}

// One validator per op, with the op's own argument names; CPU, CUDA and Meta call them first.

/// The scalar tensors every fused step takes (lr_tensor, grad_scale, found_inf, clip_coef).
template <class Args>
inline void check_step_scalars(const char* op, const Args& a, const at::Device& device) {
  const std::pair<const char*, const OptTensor*> scalars[] = {{"lr_tensor", &a.lr_tensor},
                                                              {"grad_scale", &a.grad_scale},
                                                              {"found_inf", &a.found_inf},
                                                              {"clip_coef", &a.clip_coef}};
  for (const auto& [name, t] : scalars) {
    if (t->has_value()) check_scalar_tensor(op, name, **t, device);
  }
}

inline void validate(const AdamStepArgs& a) {
  const char* op = AdamStepArgs::kName;
  const at::Device device = check_optim_args(op, a.params, a.grads,
                                             {{"exp_avgs", a.exp_avgs, false},
                                              {"exp_avg_sqs", a.exp_avg_sqs, false},
                                              {"max_exp_avg_sqs", a.max_exp_avg_sqs, !a.amsgrad},
                                              {"masters", a.masters, true},
                                              {"emas", a.emas, true}});
  check_step_scalars(op, a, device);
  check_steps(op, a.steps, a.params.size(), device);
  check_masks(op, a.params, a.masks);
}

/// The format of a low-bit step's moments (adam_lowbit_step_, lion_lowbit_step_): the dtype of
/// the first moment's first tensor (bfloat16 or int8; float32 otherwise, which the validators
/// refuse).
inline kernels::StateFormat lowbit_moment_format(at::TensorList moments) {
  if (moments.empty() || !moments[0].defined()) return kernels::StateFormat::kFloat;
  switch (moments[0].scalar_type()) {
    case at::kBFloat16:
      return kernels::StateFormat::kBFloat16;
    case at::kChar:
      return kernels::StateFormat::kInt8;
    default:
      return kernels::StateFormat::kFloat;
  }
}

/// A low-bit moment list: `dtype`, one dense tensor per param with its numel and layout.
inline void check_lowbit_list(const char* op, const char* name, at::TensorList list,
                              at::TensorList params, at::ScalarType dtype,
                              const at::Device& device) {
  TORCH_CHECK(list.size() == params.size(), "torchspeed.", op, ": ", name,
              " must have one tensor per param (", params.size(), "), got ", list.size());
  for (size_t i = 0; i < list.size(); ++i) {
    const at::Tensor& t = list[i];
    TORCH_CHECK(t.defined() && t.layout() == at::kStrided && t.scalar_type() == dtype &&
                    t.device() == device,
                "torchspeed.", op, ": ", name, "[", i, "] must be a dense ", dtype, " tensor on ",
                device,
                " (one format for the whole call: the dtype of exp_avgs[0]"
                " chooses it), got ",
                t.defined() ? c10::str(t.scalar_type(), " ", t.layout(), " on ", t.device())
                            : std::string("None"));
    TORCH_CHECK(t.sym_numel() == params[i].sym_numel() && laid_out_like(t, params[i]),
                "torchspeed.", op, ": ", name, "[", i, "] must have the ", params[i].sym_numel(),
                " elements and the memory layout of params[", i, "], got sizes ", t.sym_sizes(),
                " strides ", t.sym_strides());
  }
}

/// The per-block absmax lists of int8 moments: contiguous float32 [ceil(numel / state_block)].
inline void check_absmax_list(const char* op, const char* name, at::TensorList list,
                              at::TensorList params, int64_t block, const at::Device& device) {
  TORCH_CHECK(list.size() == params.size(), "torchspeed.", op, ": ", name,
              " must have one tensor per param (", params.size(), ") with int8 moments, got ",
              list.size());
  for (size_t i = 0; i < list.size(); ++i) {
    const at::Tensor& t = list[i];
    const c10::SymInt blocks = (params[i].sym_numel() + block - 1) / block;
    TORCH_CHECK(t.defined() && t.layout() == at::kStrided && t.scalar_type() == at::kFloat &&
                    t.is_contiguous() && t.sym_numel() == blocks && t.device() == device,
                "torchspeed.", op, ": ", name, "[", i,
                "] must be a contiguous float32 tensor of ceil(", params[i].sym_numel(), " / ",
                block, ") = ", blocks, " elements on ", device, ", got ",
                t.defined() ? c10::str(t.scalar_type(), " ", t.sym_sizes(), " on ", t.device())
                            : std::string("None"));
  }
}

/// The int8 block size rule, one place for the step, encode/decode and the optimizers' options.
inline void check_state_block(const char* op, int64_t state_block) {
  TORCH_CHECK_VALUE(
      state_block >= 8 && state_block <= 4096 && (state_block & (state_block - 1)) == 0,
      "torchspeed.", op, ": state_block must be a power of two in [8, 4096], got ", state_block);
}

/// The optimizers' state options, validated once (Python's torchspeed.optim and the C++ Options
/// both call this): the moment format a param of `numel` elements gets.
inline std::string lowbit_state_format(const char* op, const std::string& state_dtype,
                                       int64_t numel, int64_t min_lowbit_numel,
                                       int64_t state_block) {
  TORCH_CHECK_VALUE(state_dtype == "fp32" || state_dtype == "bf16" || state_dtype == "int8",
                    "torchspeed.", op, ": state_dtype must be one of 'fp32', 'bf16', 'int8', got '",
                    state_dtype, "'");
  TORCH_CHECK_VALUE(min_lowbit_numel >= 0, "torchspeed.", op,
                    ": min_lowbit_numel must be an int >= 0, got ", min_lowbit_numel);
  check_state_block(op, state_block);
  if (state_dtype == "int8" && numel < min_lowbit_numel) return "fp32";
  return state_dtype;
}

inline void validate(const LowbitEncodeArgs& a) {
  const char* op = LowbitEncodeArgs::kName;
  TORCH_CHECK(a.values.defined() && a.values.layout() == at::kStrided &&
                  a.values.scalar_type() == at::kFloat && a.values.is_contiguous(),
              "torchspeed.", op, ": values must be a contiguous float32 tensor, got ",
              a.values.defined() ? c10::str(a.values.scalar_type(), " ", a.values.layout(),
                                            " strides ", a.values.sym_strides())
                                 : std::string("None"));
  check_state_block(op, a.state_block);
}

inline void validate(const LowbitDecodeArgs& a) {
  const char* op = LowbitDecodeArgs::kName;
  TORCH_CHECK(a.codes.defined() && a.codes.layout() == at::kStrided &&
                  (a.codes.scalar_type() == at::kChar || a.codes.scalar_type() == at::kByte) &&
                  a.codes.is_contiguous(),
              "torchspeed.", op,
              ": codes must be a contiguous int8 (first moment) or uint8 (second moment) tensor, "
              "got ",
              a.codes.defined() ? c10::str(a.codes.scalar_type(), " ", a.codes.layout(),
                                           " strides ", a.codes.sym_strides())
                                : std::string("None"));
  check_state_block(op, a.state_block);
  const c10::SymInt blocks = (a.codes.sym_numel() + a.state_block - 1) / a.state_block;
  TORCH_CHECK(a.absmax.defined() && a.absmax.layout() == at::kStrided &&
                  a.absmax.scalar_type() == at::kFloat && a.absmax.is_contiguous() &&
                  a.absmax.sym_numel() == blocks && a.absmax.device() == a.codes.device(),
              "torchspeed.", op, ": absmax must be a contiguous float32 tensor of ceil(",
              a.codes.sym_numel(), " / ", a.state_block, ") = ", blocks, " elements on ",
              a.codes.device(), ", got ",
              a.absmax.defined() ? c10::str(a.absmax.scalar_type(), " ", a.absmax.sym_sizes(),
                                            " on ", a.absmax.device())
                                 : std::string("None"));
}

/// The format of a low-bit step's moments (the list `name`, the first moment), refusing float32
/// ones (they go to `fp32_op`).
inline kernels::StateFormat check_lowbit_moment_format(const char* op, const char* name,
                                                       at::TensorList moments,
                                                       const char* fp32_op) {
  const kernels::StateFormat format = lowbit_moment_format(moments);
  TORCH_CHECK(format != kernels::StateFormat::kFloat, "torchspeed.", op, ": ", name,
              "[0] must be bfloat16 or int8 (float32 moments go to ", fp32_op, "), got ",
              moments.empty() || !moments[0].defined() ? std::string("none")
                                                       : c10::str(moments[0].scalar_type()));
  return format;
}

inline void validate(const AdamLowbitStepArgs& a) {
  const char* op = AdamLowbitStepArgs::kName;
  const at::Device device = check_optim_args(
      op, a.params, a.grads, {{"masters", a.masters, true}, {"emas", a.emas, true}});
  const bool int8 = check_lowbit_moment_format(op, "exp_avgs", a.exp_avgs, "adam_step_") ==
                    kernels::StateFormat::kInt8;
  check_lowbit_list(op, "exp_avgs", a.exp_avgs, a.params, int8 ? at::kChar : at::kBFloat16, device);
  check_lowbit_list(op, "exp_avg_sqs", a.exp_avg_sqs, a.params, int8 ? at::kByte : at::kBFloat16,
                    device);
  if (int8) {
    check_state_block(op, a.state_block);
    check_absmax_list(op, "exp_avg_absmaxes", a.exp_avg_absmaxes, a.params, a.state_block, device);
    check_absmax_list(op, "exp_avg_sq_absmaxes", a.exp_avg_sq_absmaxes, a.params, a.state_block,
                      device);
  } else {
    TORCH_CHECK(a.exp_avg_absmaxes.empty() && a.exp_avg_sq_absmaxes.empty(), "torchspeed.", op,
                ": exp_avg_absmaxes and exp_avg_sq_absmaxes must be empty with bfloat16 moments, "
                "got ",
                a.exp_avg_absmaxes.size(), " and ", a.exp_avg_sq_absmaxes.size(), " tensors");
  }
  check_step_scalars(op, a, device);
  check_steps(op, a.steps, a.params.size(), device);
  check_masks(op, a.params, a.masks);
}

/// The kernels' nesterov rule (sgd_step_, sgd_lowbit_step_).
inline void check_sgd_nesterov(const char* op, bool nesterov, double momentum, double dampening) {
  TORCH_CHECK(!nesterov || (momentum > 0 && dampening == 0), "torchspeed.", op,
              ": nesterov requires momentum > 0 and dampening == 0, got momentum ", momentum,
              " and dampening ", dampening);
}

inline void validate(const SgdStepArgs& a) {
  const char* op = SgdStepArgs::kName;
  const at::Device device =
      check_optim_args(op, a.params, a.grads,
                       {{"momentum_buffers", a.momentum_buffers, a.momentum == 0.0},
                        {"masters", a.masters, true},
                        {"emas", a.emas, true}});
  check_step_scalars(op, a, device);
  check_masks(op, a.params, a.masks);
  check_sgd_nesterov(op, a.nesterov, a.momentum, a.dampening);
}

inline void validate(const SgdLowbitStepArgs& a) {
  const char* op = SgdLowbitStepArgs::kName;
  const at::Device device = check_optim_args(
      op, a.params, a.grads, {{"masters", a.masters, true}, {"emas", a.emas, true}});
  TORCH_CHECK(a.momentum != 0.0, "torchspeed.", op,
              ": momentum must be nonzero (without momentum SGD keeps no buffer: use sgd_step_), "
              "got ",
              a.momentum);
  const bool int8 = check_lowbit_moment_format(op, "momentum_buffers", a.momentum_buffers,
                                               "sgd_step_") == kernels::StateFormat::kInt8;
  check_lowbit_list(op, "momentum_buffers", a.momentum_buffers, a.params,
                    int8 ? at::kChar : at::kBFloat16, device);
  if (int8) {
    check_state_block(op, a.state_block);
    check_absmax_list(op, "momentum_buffer_absmaxes", a.momentum_buffer_absmaxes, a.params,
                      a.state_block, device);
  } else {
    TORCH_CHECK(a.momentum_buffer_absmaxes.empty(), "torchspeed.", op,
                ": momentum_buffer_absmaxes must be empty with bfloat16 buffers, got ",
                a.momentum_buffer_absmaxes.size(), " tensors");
  }
  check_step_scalars(op, a, device);
  check_steps(op, a.steps, a.params.size(), device);
  check_masks(op, a.params, a.masks);
  check_sgd_nesterov(op, a.nesterov, a.momentum, a.dampening);
}

inline void validate(const LionStepArgs& a) {
  const char* op = LionStepArgs::kName;
  const at::Device device = check_optim_args(
      op, a.params, a.grads,
      {{"exp_avgs", a.exp_avgs, false}, {"masters", a.masters, true}, {"emas", a.emas, true}});
  check_step_scalars(op, a, device);
  check_steps(op, a.steps, a.params.size(), device);
  check_masks(op, a.params, a.masks);
}

inline void validate(const LionLowbitStepArgs& a) {
  const char* op = LionLowbitStepArgs::kName;
  const at::Device device = check_optim_args(
      op, a.params, a.grads, {{"masters", a.masters, true}, {"emas", a.emas, true}});
  const bool int8 = check_lowbit_moment_format(op, "exp_avgs", a.exp_avgs, "lion_step_") ==
                    kernels::StateFormat::kInt8;
  check_lowbit_list(op, "exp_avgs", a.exp_avgs, a.params, int8 ? at::kChar : at::kBFloat16, device);
  if (int8) {
    check_state_block(op, a.state_block);
    check_absmax_list(op, "exp_avg_absmaxes", a.exp_avg_absmaxes, a.params, a.state_block, device);
  } else {
    TORCH_CHECK(a.exp_avg_absmaxes.empty(), "torchspeed.", op,
                ": exp_avg_absmaxes must be empty with bfloat16 moments, got ",
                a.exp_avg_absmaxes.size(), " tensors");
  }
  check_step_scalars(op, a, device);
  check_steps(op, a.steps, a.params.size(), device);
  check_masks(op, a.params, a.masks);
}

inline void validate(const LambStepArgs& a) {
  const char* op = LambStepArgs::kName;
  const at::Device device = check_optim_args(op, a.params, a.grads,
                                             {{"exp_avgs", a.exp_avgs, false},
                                              {"exp_avg_sqs", a.exp_avg_sqs, false},
                                              {"masters", a.masters, true},
                                              {"emas", a.emas, true}});
  check_step_scalars(op, a, device);
  check_steps(op, a.steps, a.params.size(), device);
  check_masks(op, a.params, a.masks);
  TORCH_CHECK(a.phase >= 0 && a.phase <= 2, "torchspeed.", op,
              ": phase must be 0 (the whole step), 1 (moments and norms) or 2 (the update), got ",
              a.phase);
  const int64_t n = static_cast<int64_t>(a.params.size());
  if (a.phase == 0) {
    TORCH_CHECK(!a.norms.has_value(), "torchspeed.", op,
                ": norms must be None with phase 0 (the step computes them), got a tensor");
    return;
  }
  const at::Tensor* t = a.norms.has_value() ? &*a.norms : nullptr;
  TORCH_CHECK(t != nullptr && t->scalar_type() == at::kDouble && t->dim() == 2 && t->size(0) == n &&
                  t->size(1) == 2 && t->is_contiguous() && t->device() == device,
              "torchspeed.", op, ": norms must be a contiguous float64 [", n, ", 2] tensor on ",
              device, " with phase ", a.phase, " (per param: ||p||^2, ||u||^2), got ",
              t == nullptr ? std::string("None")
                           : c10::str(t->scalar_type(), " ", t->sizes(), " on ", t->device(),
                                      t->is_contiguous() ? "" : " (not contiguous)"));
}

}  // namespace torchspeed::ops
