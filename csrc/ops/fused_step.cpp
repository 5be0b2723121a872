// Builds a FusedStep from each fused optimizer op's arguments; see fused_step.h.
#include "ops/fused_step.h"

#include "ops/optim_checks.h"

namespace torchspeed::ops {
namespace {

using kernels::OptimAlgo;
using kernels::OptimHyper;

/// The step with the lists and hyperparameters every algorithm has.
template <class Args>
FusedStep common(const Args& a, OptimAlgo algo) {
  validate(a);
  FusedStep s{};
  s.op = Args::kName;
  s.algo = algo;
  s.params = a.params;
  s.grads = a.grads;
  s.masters = a.masters;
  s.masks = a.masks;
  s.emas = a.emas;
  s.lr_tensor = &a.lr_tensor;
  s.grad_scale = &a.grad_scale;
  s.found_inf = &a.found_inf;
  s.clip_coef = &a.clip_coef;
  OptimHyper& h = s.hyper;
  h.lr = a.lr;
  h.weight_decay = static_cast<float>(a.weight_decay);
  h.one_minus_ema_decay = static_cast<float>(1.0 - a.ema_decay);
  h.maximize = a.maximize;
  return s;
}

void set_betas(OptimHyper& h, double beta1, double beta2) {
  h.beta1 = beta1;
  h.beta2 = beta2;
  h.beta2_f = static_cast<float>(beta2);
  h.one_minus_beta1 = static_cast<float>(1.0 - beta1);
  h.one_minus_beta2 = static_cast<float>(1.0 - beta2);
}

at::TensorList element_of(at::TensorList list, size_t i) {
  return list.empty() ? list : list.slice(i, 1);
}

// Elements [begin, ...) of tensor i of `list`; null when the list is empty or the tensor is.
void* at_element(at::TensorList list, size_t i, int64_t begin) {
  if (list.empty() || list[i].numel() == 0) return nullptr;
  return static_cast<char*>(list[i].data_ptr()) + begin * list[i].element_size();
}
float* f32_at(at::TensorList list, size_t i, int64_t begin) {
  return static_cast<float*>(at_element(list, i, begin));
}

}  // namespace

FusedStep fused_step(const AdamStepArgs& a) {
  FusedStep s = common(a, OptimAlgo::kAdam);
  s.exp_avgs = a.exp_avgs;
  s.exp_avg_sqs = a.exp_avg_sqs;
  if (a.amsgrad) s.max_exp_avg_sqs = a.max_exp_avg_sqs;
  s.steps = a.steps;
  set_betas(s.hyper, a.beta1, a.beta2);
  s.hyper.eps = static_cast<float>(a.eps);
  s.hyper.amsgrad = a.amsgrad;
  s.hyper.decoupled_weight_decay = a.decoupled_weight_decay;
  return s;
}

FusedStep fused_step(const AdamLowbitStepArgs& a) {
  FusedStep s = common(a, OptimAlgo::kAdam);
  s.exp_avgs = a.exp_avgs;
  s.exp_avg_sqs = a.exp_avg_sqs;
  s.exp_avg_absmaxes = a.exp_avg_absmaxes;
  s.exp_avg_sq_absmaxes = a.exp_avg_sq_absmaxes;
  s.steps = a.steps;
  set_betas(s.hyper, a.beta1, a.beta2);
  s.hyper.eps = static_cast<float>(a.eps);
  s.hyper.decoupled_weight_decay = a.decoupled_weight_decay;
  s.hyper.state_format = lowbit_moment_format(a.exp_avgs);
  s.hyper.state_block = static_cast<int32_t>(a.state_block);
  return s;
}

/// SGD's hyperparameters, from either SGD op.
template <class Args>
FusedStep sgd_common(const Args& a) {
  FusedStep s = common(a, OptimAlgo::kSgd);
  if (a.momentum != 0.0) s.exp_avgs = a.momentum_buffers;
  s.hyper.momentum = static_cast<float>(a.momentum);
  s.hyper.one_minus_dampening = static_cast<float>(1.0 - a.dampening);
  s.hyper.nesterov = a.nesterov;
  s.hyper.first_step = a.first_step;
  return s;
}

FusedStep fused_step(const SgdStepArgs& a) { return sgd_common(a); }

FusedStep fused_step(const SgdLowbitStepArgs& a) {
  FusedStep s = sgd_common(a);
  s.exp_avg_absmaxes = a.momentum_buffer_absmaxes;
  s.steps = a.steps;
  s.hyper.state_format = lowbit_moment_format(a.momentum_buffers);
  s.hyper.state_block = static_cast<int32_t>(a.state_block);
  return s;
}

FusedStep fused_step(const LionStepArgs& a) {
  FusedStep s = common(a, OptimAlgo::kLion);
  s.exp_avgs = a.exp_avgs;
  s.steps = a.steps;
  set_betas(s.hyper, a.beta1, a.beta2);
  return s;
}

FusedStep fused_step(const LionLowbitStepArgs& a) {
  FusedStep s = common(a, OptimAlgo::kLion);
  s.exp_avgs = a.exp_avgs;
  s.exp_avg_absmaxes = a.exp_avg_absmaxes;
  s.steps = a.steps;
  set_betas(s.hyper, a.beta1, a.beta2);
  s.hyper.state_format = lowbit_moment_format(a.exp_avgs);
  s.hyper.state_block = static_cast<int32_t>(a.state_block);
  return s;
}

FusedStep fused_step(const LambStepArgs& a) {
  FusedStep s = common(a, OptimAlgo::kLamb);
  s.exp_avgs = a.exp_avgs;
  s.exp_avg_sqs = a.exp_avg_sqs;
  s.steps = a.steps;
  set_betas(s.hyper, a.beta1, a.beta2);
  s.hyper.eps = static_cast<float>(a.eps);
  s.lamb_phase = a.phase;
  s.lamb_norms = &a.norms;
  return s;
}

bool FusedStep::writes_overlap() const {
  return params.size() > 1 &&
         ops::writes_overlap({params, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, masters, steps, emas,
                              exp_avg_absmaxes, exp_avg_sq_absmaxes});
}

FusedStep FusedStep::element(size_t i) const {
  FusedStep one = *this;
  for (at::TensorList* list : {&one.params, &one.grads, &one.exp_avgs, &one.exp_avg_sqs,
                               &one.max_exp_avg_sqs, &one.masters, &one.steps, &one.masks,
                               &one.emas, &one.exp_avg_absmaxes, &one.exp_avg_sq_absmaxes}) {
    *list = element_of(*list, i);
  }
  return one;
}

std::vector<at::Tensor> FusedStep::grads_like_params() const {
  std::vector<at::Tensor> out(grads.begin(), grads.end());
  for (size_t i = 0; i < out.size(); ++i) out[i] = grad_like_param(out[i], params[i]);
  return out;
}

kernels::OptimTensor FusedStep::tensor(size_t i, const at::Tensor& grad, int64_t begin,
                                       int64_t length) const {
  kernels::OptimTensor t{};
  t.param = at_element(params, i, begin);
  t.grad = t.param == nullptr
               ? nullptr
               : static_cast<const char*>(grad.const_data_ptr()) + begin * grad.element_size();
  t.master = f32_at(masters, i, begin);
  if (hyper.state_format == kernels::StateFormat::kFloat) {
    t.exp_avg = f32_at(exp_avgs, i, begin);
    t.exp_avg_sq = f32_at(exp_avg_sqs, i, begin);
  } else {
    t.exp_avg_lp = at_element(exp_avgs, i, begin);
    t.exp_avg_sq_lp = at_element(exp_avg_sqs, i, begin);
    t.sr_index = begin;
  }
  if (hyper.state_format == kernels::StateFormat::kInt8) {
    // A range starts on a block: its absmaxes from begin / block on.
    TORCH_INTERNAL_ASSERT(begin % hyper.state_block == 0, "torchspeed.", op,
                          ": a range must start on a quantization block");
    t.exp_avg_absmax = f32_at(exp_avg_absmaxes, i, begin / hyper.state_block);
    t.exp_avg_sq_absmax = f32_at(exp_avg_sq_absmaxes, i, begin / hyper.state_block);
  }
  t.max_exp_avg_sq = f32_at(max_exp_avg_sqs, i, begin);
  // The packed mask (uint8 [ceil(numel / 8)], or empty = no mask): ranges start on a byte.
  TORCH_INTERNAL_ASSERT(begin % 8 == 0, "torchspeed.", op, ": a range must start on a mask byte");
  t.mask = masks.empty() || masks[i].numel() == 0
               ? nullptr
               : static_cast<const uint8_t*>(masks[i].const_data_ptr()) + begin / 8;
  t.ema = f32_at(emas, i, begin);
  t.step = f32_at(steps, i, 0);
  t.numel = length;
  t.param_dtype = kernel_dtype(params[i].scalar_type());
  t.grad_dtype = kernel_dtype(grad.scalar_type());
  return t;
}

}  // namespace torchspeed::ops
