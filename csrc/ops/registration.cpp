// Every torchspeed op schema, in one place; implementations register per dispatch key in
// ops/cpu, ops/cuda and ops/meta.
#include <torch/library.h>

TORCH_LIBRARY(torchspeed, m) {
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

  // ---- Fused optimizer steps ----------------------------------------------------------------
  // One call updates one parameter group. List arguments other than params/grads are either empty
  // (feature off) or have one tensor per param. State (exp_avgs, ..., masters, emas) is float32 and
  // contiguous. `steps` are float32 0-dim tensors as in torch.optim's state; they are incremented
  // by the op. Scalar-valued tensors (lr_tensor, grad_scale, found_inf, clip_coef) are one-element
  // float32 tensors on the params' device, read on the device on CUDA (no host sync):
  //   lr_tensor  overrides lr (capturable / LR-as-tensor)
  //   grad_scale the AMP scale: grads are divided by it (multiplied by 1/scale) in registers
  //   found_inf  when 1.0 the whole step is skipped: params, state and steps untouched
  //   clip_coef  grads are also multiplied by it (global-norm clipping computed by grad_stats)
  // masks: float32 {0,1} per param; the new param is zeroed where mask == 0 (pruning).
  // emas: float32 EMA copies, ema += (1 - ema_decay) * (param - ema) after the update.
  m.def(
      "adam_step_(Tensor(a!)[] params, Tensor[] grads, Tensor(b!)[] exp_avgs, "
      "Tensor(c!)[] exp_avg_sqs, Tensor(d!)[] max_exp_avg_sqs, Tensor(e!)[] masters, "
      "Tensor(f!)[] steps, Tensor[] masks, Tensor(g!)[] emas, *, float lr, float beta1, "
      "float beta2, float eps, float weight_decay, bool amsgrad, bool maximize, "
      "bool decoupled_weight_decay, Tensor? lr_tensor=None, Tensor? grad_scale=None, "
      "Tensor? found_inf=None, Tensor? clip_coef=None, float ema_decay=0.0) -> ()");
  // SGD with momentum/dampening/nesterov. first_step: the momentum buffers are (re)initialised
  // from the gradient, as torch.optim does when a param has no buffer yet.
  m.def(
      "sgd_step_(Tensor(a!)[] params, Tensor[] grads, Tensor(b!)[] momentum_buffers, "
      "Tensor(e!)[] masters, Tensor[] masks, Tensor(g!)[] emas, *, float lr, float momentum, "
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
  // LAMB (You et al. 2020) with bias correction: u = m_hat / (sqrt(v_hat) + eps) + wd * p,
  // trust = ||p|| / ||u|| per tensor (1 when either is 0), p -= lr * trust * u.
  m.def(
      "lamb_step_(Tensor(a!)[] params, Tensor[] grads, Tensor(b!)[] exp_avgs, "
      "Tensor(c!)[] exp_avg_sqs, Tensor(e!)[] masters, Tensor(f!)[] steps, Tensor[] masks, "
      "Tensor(g!)[] emas, *, float lr, float beta1, float beta2, float eps, float weight_decay, "
      "bool maximize, Tensor? lr_tensor=None, Tensor? grad_scale=None, Tensor? found_inf=None, "
      "Tensor? clip_coef=None, float ema_decay=0.0) -> ()");
}
