// Meta implementations of the fused optimizer steps: validate, change nothing (for FakeTensor
// tracing and torch.library.opcheck); also registered for the sparse keys (see checks.h).
#include <torch/library.h>

#include "ops/optim_checks.h"

namespace torchspeed::ops {
namespace {

void adam_step_meta(at::TensorList params, at::TensorList grads, at::TensorList exp_avgs,
                    at::TensorList exp_avg_sqs, at::TensorList max_exp_avg_sqs,
                    at::TensorList masters, at::TensorList steps, at::TensorList masks,
                    at::TensorList emas, double, double, double, double, double, bool amsgrad, bool,
                    bool, const OptTensor& lr_tensor, const OptTensor& grad_scale,
                    const OptTensor& found_inf, const OptTensor& clip_coef, double) {
  validate_adam_step(params, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, masters, steps, masks,
                     emas, amsgrad, lr_tensor, grad_scale, found_inf, clip_coef);
}

void sgd_step_meta(at::TensorList params, at::TensorList grads, at::TensorList momentum_buffers,
                   at::TensorList masters, at::TensorList masks, at::TensorList emas, double,
                   double momentum, double dampening, double, bool nesterov, bool, bool,
                   const OptTensor& lr_tensor, const OptTensor& grad_scale,
                   const OptTensor& found_inf, const OptTensor& clip_coef, double) {
  validate_sgd_step(params, grads, momentum_buffers, masters, masks, emas, momentum, dampening,
                    nesterov, lr_tensor, grad_scale, found_inf, clip_coef);
}

void lion_step_meta(at::TensorList params, at::TensorList grads, at::TensorList exp_avgs,
                    at::TensorList masters, at::TensorList steps, at::TensorList masks,
                    at::TensorList emas, double, double, double, double, bool,
                    const OptTensor& lr_tensor, const OptTensor& grad_scale,
                    const OptTensor& found_inf, const OptTensor& clip_coef, double) {
  validate_lion_step(params, grads, exp_avgs, masters, steps, masks, emas, lr_tensor, grad_scale,
                     found_inf, clip_coef);
}

void lamb_step_meta(at::TensorList params, at::TensorList grads, at::TensorList exp_avgs,
                    at::TensorList exp_avg_sqs, at::TensorList masters, at::TensorList steps,
                    at::TensorList masks, at::TensorList emas, double, double, double, double,
                    double, bool, const OptTensor& lr_tensor, const OptTensor& grad_scale,
                    const OptTensor& found_inf, const OptTensor& clip_coef, double) {
  validate_lamb_step(params, grads, exp_avgs, exp_avg_sqs, masters, steps, masks, emas, lr_tensor,
                     grad_scale, found_inf, clip_coef);
}

}  // namespace

void register_optim_validators(torch::Library& m) {
  m.impl("adam_step_", &adam_step_meta);
  m.impl("sgd_step_", &sgd_step_meta);
  m.impl("lion_step_", &lion_step_meta);
  m.impl("lamb_step_", &lamb_step_meta);
}

TORCH_LIBRARY_IMPL(torchspeed, Meta, m) { register_optim_validators(m); }
TORCHSPEED_REGISTER_FOR_SPARSE_KEYS(register_optim_validators)

}  // namespace torchspeed::ops
