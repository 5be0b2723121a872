// The optimizer area's ops: their schemas (a TORCH_LIBRARY_FRAGMENT of the torchspeed library,
// see registration.cpp) and their C++ entry points (declared in <torchspeed/ops/optim.h>), which
// call through the dispatcher. The kernels are registered per dispatch key in ops/cpu, ops/cuda
// and ops/meta; each takes the op's argument struct.
#include "torchspeed/ops/optim.h"

#include <torch/library.h>

#include "ops/checks.h"
#include "ops/optim_checks.h"

TORCH_LIBRARY_FRAGMENT(torchspeed, m) {
  // Global L2 norm (and optionally per-tensor norms) and a found-non-finite flag over a list of
  // tensors in one pass. Outputs are float32 on the tensors' device: total_norm (0-dim),
  // per_tensor_norms ([len(tensors)] if per_tensor else [0]), found_inf (0-dim, 1.0 or 0.0).
  m.def(
      "grad_stats(Tensor[] tensors, bool per_tensor=False) -> "
      "(Tensor total_norm, Tensor per_tensor_norms, Tensor found_inf)");
  // Same, after multiplying every tensor in place by inv_scale (a one-element float32 tensor);
  // the non-finite check looks at the values before unscaling, like
  // torch._amp_foreach_non_finite_check_and_unscale_.
  m.def(
      "grad_stats_unscale_(Tensor(a!)[] tensors, Tensor inv_scale, bool per_tensor=False) -> "
      "(Tensor total_norm, Tensor per_tensor_norms, Tensor found_inf)");

  // ---- Fused optimizer steps --------------------------------------------------------------------
  // One call updates one parameter group. List arguments other than params/grads are either empty
  // (feature off) or have one tensor per param. State (exp_avgs, ..., masters, emas) is float32 and
  // contiguous. `steps` are float32 0-dim tensors as in torch.optim's state; they are incremented
  // by the op. Scalar-valued tensors (lr_tensor, grad_scale, found_inf, clip_coef) are one-element
  // float32 tensors on the params' device, read on the device on CUDA (no host sync):
  //   lr_tensor  overrides lr (capturable / LR-as-tensor)
  //   grad_scale the AMP scale: grads are divided by it (multiplied by 1/scale) in registers
  //   found_inf  when 1.0 the whole step is skipped: params, state and steps untouched
  //   clip_coef  grads are also multiplied by it (global-norm clipping computed by grad_stats)
  // masks: per param a bit-packed pruning mask, uint8 [ceil(numel / 8)] (bit j of byte b = element
  // 8b + j in the param's memory order; torchspeed.prune's format), or an empty tensor for none;
  // the new param is zeroed where the bit is 0, inside the update pass.
  // emas: float32 EMA copies, ema += (1 - ema_decay) * (param - ema) after the update.
  m.def(
      "adam_step_(Tensor(a!)[] params, Tensor[] grads, Tensor(b!)[] exp_avgs, "
      "Tensor(c!)[] exp_avg_sqs, Tensor(d!)[] max_exp_avg_sqs, Tensor(e!)[] masters, "
      "Tensor(f!)[] steps, Tensor[] masks, Tensor(g!)[] emas, *, float lr, float beta1, "
      "float beta2, float eps, float weight_decay, bool amsgrad, bool maximize, "
      "bool decoupled_weight_decay, Tensor? lr_tensor=None, Tensor? grad_scale=None, "
      "Tensor? found_inf=None, Tensor? clip_coef=None, float ema_decay=0.0) -> ()");
  // adam_step_ with low-bit moments (torchspeed.optim's state_dtype; no amsgrad; CPU and CUDA
  // kernels, the same bits). The format is the dtype of exp_avgs, one for the whole call:
  //   bfloat16 exp_avgs and exp_avg_sqs: updated in fp32, written back with stochastic rounding;
  //     exp_avg_absmaxes and exp_avg_sq_absmaxes are empty;
  //   int8 exp_avgs and uint8 exp_avg_sqs: codes in blocks of state_block elements (a power of
  //     two in [8, 4096]) with one float32 absmax per block in exp_avg_absmaxes /
  //     exp_avg_sq_absmaxes (ceil(numel / state_block) elements each); the maps are in
  //     kernels/cpu/lowbit_state.h.
  m.def(
      "adam_lowbit_step_(Tensor(a!)[] params, Tensor[] grads, Tensor(b!)[] exp_avgs, "
      "Tensor(c!)[] exp_avg_sqs, Tensor(d!)[] exp_avg_absmaxes, Tensor(h!)[] exp_avg_sq_absmaxes, "
      "Tensor(e!)[] masters, Tensor(f!)[] steps, Tensor[] masks, Tensor(g!)[] emas, *, "
      "int state_block, float lr, float beta1, float beta2, float eps, float weight_decay, "
      "bool maximize, bool decoupled_weight_decay, Tensor? lr_tensor=None, "
      "Tensor? grad_scale=None, Tensor? found_inf=None, Tensor? clip_coef=None, "
      "float ema_decay=0.0) -> ()");
  // int8 optimizer state (state_dtype "int8"): lowbit_encode turns float32 values (contiguous,
  // any shape) into codes of the same shape (int8, the first moment's map, when is_signed; uint8,
  // the second moment's, otherwise) and one float32 absmax per block of state_block elements (a
  // power of two in [8, 4096]); lowbit_decode is the inverse (the code dtype picks the map). The
  // maps are the fused step's own, element for element.
  m.def(
      "lowbit_encode(Tensor values, bool is_signed=True, int state_block=256) -> "
      "(Tensor codes, Tensor absmax)");
  m.def("lowbit_decode(Tensor codes, Tensor absmax, int state_block=256) -> Tensor");
  // The optimizers' state options, validated once: the moment format ("fp32", "bf16" or "int8")
  // a param of `numel` elements gets (int8 only from min_lowbit_numel elements on).
  m.def(
      "lowbit_state_format(str state_dtype, int numel, int min_lowbit_numel, int state_block) "
      "-> str",
      [](c10::string_view state_dtype, int64_t numel, int64_t min_lowbit_numel,
         int64_t state_block) {
        return torchspeed::lowbit_state_format(std::string(state_dtype), numel, min_lowbit_numel,
                                               state_block);
      });
  // SGD with momentum/dampening/nesterov. first_step: the momentum buffers are (re)initialised
  // from the gradient, as torch.optim does when a param has no buffer yet.
  m.def(
      "sgd_step_(Tensor(a!)[] params, Tensor[] grads, Tensor(b!)[] momentum_buffers, "
      "Tensor(e!)[] masters, Tensor[] masks, Tensor(g!)[] emas, *, float lr, float momentum, "
      "float dampening, float weight_decay, bool nesterov, bool maximize, bool first_step, "
      "Tensor? lr_tensor=None, Tensor? grad_scale=None, Tensor? found_inf=None, "
      "Tensor? clip_coef=None, float ema_decay=0.0) -> ()");
  // sgd_step_ with a low-bit momentum buffer (torchspeed.optim.SGD's state_dtype; momentum != 0;
  // CPU kernels for now), as lion_lowbit_step_: the dtype of momentum_buffers chooses the format,
  // bfloat16 (stochastic rounding) or int8 (the signed map, one float32 absmax per block in
  // momentum_buffer_absmaxes). `steps` (incremented as Adam's) seed the stochastic rounding.
  m.def(
      "sgd_lowbit_step_(Tensor(a!)[] params, Tensor[] grads, Tensor(b!)[] momentum_buffers, "
      "Tensor(d!)[] momentum_buffer_absmaxes, Tensor(e!)[] masters, Tensor(f!)[] steps, "
      "Tensor[] masks, Tensor(g!)[] emas, *, int state_block, float lr, float momentum, "
      "float dampening, float weight_decay, bool nesterov, bool maximize, bool first_step, "
      "Tensor? lr_tensor=None, Tensor? grad_scale=None, Tensor? found_inf=None, "
      "Tensor? clip_coef=None, float ema_decay=0.0) -> ()");
  // Lion (Chen et al. 2023): p -= lr * sign(lerp(m, g, 1 - beta1)); m = lerp(m, g, 1 - beta2);
  // decoupled weight decay p *= 1 - lr * wd.
  m.def(
      "lion_step_(Tensor(a!)[] params, Tensor[] grads, Tensor(b!)[] exp_avgs, "
      "Tensor(e!)[] masters, Tensor(f!)[] steps, Tensor[] masks, Tensor(g!)[] emas, *, float lr, "
      "float beta1, float beta2, float weight_decay, bool maximize, Tensor? lr_tensor=None, "
      "Tensor? grad_scale=None, Tensor? found_inf=None, Tensor? clip_coef=None, "
      "float ema_decay=0.0) -> ()");
  // lion_step_ with a low-bit moment (torchspeed.optim.Lion's state_dtype; CPU kernels for now),
  // as adam_lowbit_step_ with one moment: the dtype of exp_avgs chooses the format, bfloat16
  // (stochastic rounding; exp_avg_absmaxes empty) or int8 (the first moment's signed map, one
  // float32 absmax per block of state_block elements in exp_avg_absmaxes).
  m.def(
      "lion_lowbit_step_(Tensor(a!)[] params, Tensor[] grads, Tensor(b!)[] exp_avgs, "
      "Tensor(d!)[] exp_avg_absmaxes, Tensor(e!)[] masters, Tensor(f!)[] steps, Tensor[] masks, "
      "Tensor(g!)[] emas, *, int state_block, float lr, float beta1, float beta2, "
      "float weight_decay, bool maximize, Tensor? lr_tensor=None, Tensor? grad_scale=None, "
      "Tensor? found_inf=None, Tensor? clip_coef=None, float ema_decay=0.0) -> ()");
  // LAMB (You et al. 2020) with bias correction: u = m_hat / (sqrt(v_hat) + eps) + wd * p,
  // trust = ||p|| / ||u|| per tensor (1 when either is 0), p -= lr * trust * u.
  // phase 0 does the whole step. A param cut into pieces (ZeRO-1's shards) needs the norms of the
  // whole param: phase 1 counts the steps, updates the moments and writes each piece's ||p||^2
  // and ||u||^2 into norms (float64 [n, 2]); the caller sums the rows of each param's pieces
  // (across ranks); phase 2 applies the update with those sums.
  m.def(
      "lamb_step_(Tensor(a!)[] params, Tensor[] grads, Tensor(b!)[] exp_avgs, "
      "Tensor(c!)[] exp_avg_sqs, Tensor(e!)[] masters, Tensor(f!)[] steps, Tensor[] masks, "
      "Tensor(g!)[] emas, *, float lr, float beta1, float beta2, float eps, float weight_decay, "
      "bool maximize, Tensor? lr_tensor=None, Tensor? grad_scale=None, Tensor? found_inf=None, "
      "Tensor? clip_coef=None, float ema_decay=0.0, Tensor(h!)? norms=None, int phase=0) -> ()");
}

namespace torchspeed {
namespace {

GradStats to_stats(GradStatsTuple t) {
  return {std::move(std::get<0>(t)), std::move(std::get<1>(t)), std::move(std::get<2>(t))};
}

// An empty list has no tensor for the dispatcher to pick a kernel by: answer here, as
// torch.nn.utils.clip_grad_norm_([]) does (norm 0, nothing non-finite), on `device`.
GradStats empty_stats(const at::Device& device) {
  const auto opts = at::TensorOptions().dtype(at::kFloat).device(device);
  return {at::zeros({}, opts), at::empty({0}, opts), at::zeros({}, opts)};
}

}  // namespace

GradStats grad_stats(at::TensorList tensors, bool per_tensor) {
  if (tensors.empty()) return empty_stats(at::kCPU);
  return to_stats(op_args::call(GradStatsArgs{tensors, per_tensor}));
}

GradStats grad_stats_unscale_(at::TensorList tensors, const at::Tensor& inv_scale,
                              bool per_tensor) {
  if (tensors.empty()) {
    ops::check_scalar_tensor(GradStatsUnscaleArgs::kName, "inv_scale", inv_scale,
                             inv_scale.device());
    return empty_stats(inv_scale.device());
  }
  return to_stats(op_args::call(GradStatsUnscaleArgs{tensors, inv_scale, per_tensor}));
}

void adam_step_(const AdamStepArgs& args) { op_args::call(args); }
void adam_lowbit_step_(const AdamLowbitStepArgs& args) { op_args::call(args); }
LowbitCodesTuple lowbit_encode(const LowbitEncodeArgs& args) { return op_args::call(args); }
at::Tensor lowbit_decode(const LowbitDecodeArgs& args) { return op_args::call(args); }
std::string lowbit_state_format(const std::string& state_dtype, int64_t numel,
                                int64_t min_lowbit_numel, int64_t state_block) {
  return ops::lowbit_state_format("lowbit_state_format", state_dtype, numel, min_lowbit_numel,
                                  state_block);
}
void sgd_step_(const SgdStepArgs& args) { op_args::call(args); }
void sgd_lowbit_step_(const SgdLowbitStepArgs& args) { op_args::call(args); }
void lion_step_(const LionStepArgs& args) { op_args::call(args); }
void lion_lowbit_step_(const LionLowbitStepArgs& args) { op_args::call(args); }
void lamb_step_(const LambStepArgs& args) { op_args::call(args); }

}  // namespace torchspeed
