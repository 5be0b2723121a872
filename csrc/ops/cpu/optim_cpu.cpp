// CPU implementation of the fused optimizer steps (adam_step_, sgd_step_, lion_step_,
// lamb_step_): one driver validates, handles the AMP/clip/found_inf scalars and the step counts,
// then runs the ISA kernel over chunks of all params in one parallel region.
#include <ATen/ATen.h>
#include <torch/library.h>

#include <cmath>
#include <optional>
#include <vector>

#include "kernels/cpu/dispatch.h"
#include "ops/cpu/chunking.h"
#include "ops/optim_checks.h"

namespace torchspeed::ops {
namespace {

using kernels::cpu::OptimChunk;
using kernels::cpu::OptimFn;
using kernels::cpu::OptimScalars;

enum class Algo { kAdam, kSgd, kLion, kLamb };

/// Everything one fused step call needs; lists that a feature does not use are empty.
struct StepArgs {
  const char* op;
  Algo algo;
  at::TensorList params, grads, state0, state1, state2, masters, steps, masks, emas;
  const OptTensor* lr_tensor;
  const OptTensor* grad_scale;
  const OptTensor* found_inf;
  const OptTensor* clip_coef;
  double lr;
  double ema_decay;
  double beta1 = 0.0;  // in double: torch computes 1 - beta^step from the Python float
  double beta2 = 0.0;
};

float read_scalar(const OptTensor* t, float fallback) {
  return (t && t->has_value()) ? (*t)->item<float>() : fallback;
}

void* offset(const at::Tensor& t, int64_t begin) {
  return t.numel() == 0 ? nullptr : static_cast<char*>(t.data_ptr()) + begin * t.element_size();
}

float* offset_f32(at::TensorList list, size_t i, int64_t begin) {
  return list.empty() ? nullptr : list[i].data_ptr<float>() + begin;
}

OptimChunk make_chunk(const StepArgs& a, const std::vector<at::Tensor>& grads, const Chunk& c) {
  const size_t i = c.tensor;
  return OptimChunk{offset(a.params[i], c.begin),
                    kernel_dtype(a.params[i].scalar_type()),
                    offset_f32(a.masters, i, c.begin),
                    offset(grads[i], c.begin),
                    kernel_dtype(grads[i].scalar_type()),
                    offset_f32(a.state0, i, c.begin),
                    offset_f32(a.state1, i, c.begin),
                    offset_f32(a.state2, i, c.begin),
                    a.masks.empty() ? nullptr : a.masks[i].data_ptr<float>() + c.begin,
                    offset_f32(a.emas, i, c.begin),
                    c.length};
}

void run_step(const StepArgs& a, OptimScalars base);

at::TensorList element(at::TensorList list, size_t i) {
  return list.empty() ? list : list.slice(i, 1);
}

/// run_step one param at a time, in list order (see writes_overlap). first_step holds for every
/// occurrence of a param listed twice: torch.optim.SGD also reads all buffers before updating.
void run_step_sequentially(const StepArgs& a, const OptimScalars& base) {
  for (size_t i = 0; i < a.params.size(); ++i) {
    StepArgs one = a;
    for (at::TensorList* list : {&one.params, &one.grads, &one.state0, &one.state1, &one.state2,
                                 &one.masters, &one.steps, &one.masks, &one.emas}) {
      *list = element(*list, i);
    }
    run_step(one, base);
  }
}

/// Runs one fused step. `base` holds the hyperparameters; per-tensor bias corrections are filled
/// in from each param's step count.
void run_step(const StepArgs& a, OptimScalars base) {
  if (a.params.size() > 1 &&
      writes_overlap({a.params, a.state0, a.state1, a.state2, a.masters, a.steps, a.emas})) {
    run_step_sequentially(a, base);
    return;
  }
  const auto& table = *rethrow_as_torch_error(a.op, [] { return &kernels::cpu::cpu_kernels(); });
  // AMP: a step whose grads hold inf/NaN changes nothing, not even the step counts.
  if (read_scalar(a.found_inf, 0.f) != 0.f) return;

  const double lr =
      (a.lr_tensor && a.lr_tensor->has_value()) ? (*a.lr_tensor)->item<double>() : a.lr;
  const float scale = read_scalar(a.grad_scale, 1.f);
  // Same rounding as GradScaler's unscale: float(1 / double(scale)).
  const float inv_scale = static_cast<float>(1.0 / static_cast<double>(scale));
  base.grad_scale = inv_scale * read_scalar(a.clip_coef, 1.f);
  base.lr = static_cast<float>(lr);
  base.param_decay = static_cast<float>(1.0 - lr * base.weight_decay);
  base.ema_decay = static_cast<float>(a.ema_decay);
  base.one_minus_ema_decay = static_cast<float>(1.0 - a.ema_decay);

  const size_t n = a.params.size();
  std::vector<OptimScalars> scalars(n, base);
  for (size_t i = 0; i < n && !a.steps.empty(); ++i) {
    // Validated one-element float32 CPU tensors: updated through the pointer, as torch's
    // `step += 1` does in float32, without two dispatcher calls per param.
    float* step_ptr = a.steps[i].data_ptr<float>();
    *step_ptr += 1.f;
    const double step = *step_ptr;
    const double bc1 = 1.0 - std::pow(a.beta1, step);
    const double bc2 = 1.0 - std::pow(a.beta2, step);
    scalars[i].bias_correction1 = static_cast<float>(bc1);
    scalars[i].bias_correction2 = static_cast<float>(bc2);
    scalars[i].bias_correction2_sqrt = static_cast<float>(std::sqrt(bc2));
    scalars[i].step_size = static_cast<float>(lr / bc1);
  }

  std::vector<at::Tensor> grads(a.grads.begin(), a.grads.end());
  for (size_t i = 0; i < n; ++i) grads[i] = grad_like_param(grads[i], a.params[i]);
  const std::vector<at::Tensor> params(a.params.begin(), a.params.end());
  const std::vector<Chunk> chunks = make_chunks(params);

  OptimFn fn = nullptr;
  switch (a.algo) {
    case Algo::kAdam:
      fn = table.optim.adam;
      break;
    case Algo::kSgd:
      fn = table.optim.sgd;
      break;
    case Algo::kLion:
      fn = table.optim.lion;
      break;
    case Algo::kLamb:
      fn = table.optim.lamb_phase1;
      break;
  }
  if (a.algo != Algo::kLamb) {
    parallel_over_chunks(chunks, [&](const Chunk& c, size_t) {
      fn(make_chunk(a, grads, c), scalars[c.tensor], nullptr, nullptr);
    });
    return;
  }
  // LAMB: phase 1 updates the moments and returns ||p||^2 and ||u||^2 per chunk; the per-tensor
  // trust ratio then scales phase 2.
  std::vector<double> p_sq(chunks.size()), u_sq(chunks.size());
  parallel_over_chunks(chunks, [&](const Chunk& c, size_t k) {
    fn(make_chunk(a, grads, c), scalars[c.tensor], &p_sq[k], &u_sq[k]);
  });
  std::vector<double> p_norm(n, 0.0), u_norm(n, 0.0);
  for (size_t k = 0; k < chunks.size(); ++k) {
    p_norm[chunks[k].tensor] += p_sq[k];
    u_norm[chunks[k].tensor] += u_sq[k];
  }
  for (size_t i = 0; i < n; ++i) {
    const double w = std::sqrt(p_norm[i]), u = std::sqrt(u_norm[i]);
    const double trust = (w > 0 && u > 0) ? w / u : 1.0;
    scalars[i].step_size = static_cast<float>(lr * trust);
  }
  parallel_over_chunks(chunks, [&](const Chunk& c, size_t) {
    table.optim.lamb_phase2(make_chunk(a, grads, c), scalars[c.tensor], nullptr, nullptr);
  });
}

}  // namespace

void adam_step_cpu(at::TensorList params, at::TensorList grads, at::TensorList exp_avgs,
                   at::TensorList exp_avg_sqs, at::TensorList max_exp_avg_sqs,
                   at::TensorList masters, at::TensorList steps, at::TensorList masks,
                   at::TensorList emas, double lr, double beta1, double beta2, double eps,
                   double weight_decay, bool amsgrad, bool maximize, bool decoupled_weight_decay,
                   const OptTensor& lr_tensor, const OptTensor& grad_scale,
                   const OptTensor& found_inf, const OptTensor& clip_coef, double ema_decay) {
  const char* op = "adam_step_";
  validate_adam_step(params, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, masters, steps, masks,
                     emas, amsgrad, lr_tensor, grad_scale, found_inf, clip_coef);
  OptimScalars s{};
  s.weight_decay = static_cast<float>(weight_decay);
  s.beta1 = static_cast<float>(beta1);
  s.beta2 = static_cast<float>(beta2);
  s.one_minus_beta1 = static_cast<float>(1.0 - beta1);
  s.one_minus_beta2 = static_cast<float>(1.0 - beta2);
  s.eps = static_cast<float>(eps);
  s.amsgrad = amsgrad;
  s.maximize = maximize;
  s.decoupled_weight_decay = decoupled_weight_decay;
  run_step({op, Algo::kAdam, params, grads, exp_avgs, exp_avg_sqs,
            amsgrad ? max_exp_avg_sqs : at::TensorList(), masters, steps, masks, emas, &lr_tensor,
            &grad_scale, &found_inf, &clip_coef, lr, ema_decay, beta1, beta2},
           s);
}

void sgd_step_cpu(at::TensorList params, at::TensorList grads, at::TensorList momentum_buffers,
                  at::TensorList masters, at::TensorList masks, at::TensorList emas, double lr,
                  double momentum, double dampening, double weight_decay, bool nesterov,
                  bool maximize, bool first_step, const OptTensor& lr_tensor,
                  const OptTensor& grad_scale, const OptTensor& found_inf,
                  const OptTensor& clip_coef, double ema_decay) {
  const char* op = "sgd_step_";
  validate_sgd_step(params, grads, momentum_buffers, masters, masks, emas, momentum, dampening,
                    nesterov, lr_tensor, grad_scale, found_inf, clip_coef);
  OptimScalars s{};
  s.weight_decay = static_cast<float>(weight_decay);
  s.momentum = static_cast<float>(momentum);
  s.one_minus_dampening = static_cast<float>(1.0 - dampening);
  s.nesterov = nesterov;
  s.maximize = maximize;
  s.first_step = first_step;
  run_step({op,
            Algo::kSgd,
            params,
            grads,
            momentum_buffers,
            {},
            {},
            masters,
            {},
            masks,
            emas,
            &lr_tensor,
            &grad_scale,
            &found_inf,
            &clip_coef,
            lr,
            ema_decay},
           s);
}

void lion_step_cpu(at::TensorList params, at::TensorList grads, at::TensorList exp_avgs,
                   at::TensorList masters, at::TensorList steps, at::TensorList masks,
                   at::TensorList emas, double lr, double beta1, double beta2, double weight_decay,
                   bool maximize, const OptTensor& lr_tensor, const OptTensor& grad_scale,
                   const OptTensor& found_inf, const OptTensor& clip_coef, double ema_decay) {
  const char* op = "lion_step_";
  validate_lion_step(params, grads, exp_avgs, masters, steps, masks, emas, lr_tensor, grad_scale,
                     found_inf, clip_coef);
  OptimScalars s{};
  s.weight_decay = static_cast<float>(weight_decay);
  s.beta1 = static_cast<float>(beta1);
  s.beta2 = static_cast<float>(beta2);
  s.one_minus_beta1 = static_cast<float>(1.0 - beta1);
  s.one_minus_beta2 = static_cast<float>(1.0 - beta2);
  s.maximize = maximize;
  run_step({op,
            Algo::kLion,
            params,
            grads,
            exp_avgs,
            {},
            {},
            masters,
            steps,
            masks,
            emas,
            &lr_tensor,
            &grad_scale,
            &found_inf,
            &clip_coef,
            lr,
            ema_decay,
            beta1,
            beta2},
           s);
}

void lamb_step_cpu(at::TensorList params, at::TensorList grads, at::TensorList exp_avgs,
                   at::TensorList exp_avg_sqs, at::TensorList masters, at::TensorList steps,
                   at::TensorList masks, at::TensorList emas, double lr, double beta1, double beta2,
                   double eps, double weight_decay, bool maximize, const OptTensor& lr_tensor,
                   const OptTensor& grad_scale, const OptTensor& found_inf,
                   const OptTensor& clip_coef, double ema_decay) {
  const char* op = "lamb_step_";
  validate_lamb_step(params, grads, exp_avgs, exp_avg_sqs, masters, steps, masks, emas, lr_tensor,
                     grad_scale, found_inf, clip_coef);
  OptimScalars s{};
  s.weight_decay = static_cast<float>(weight_decay);
  s.beta1 = static_cast<float>(beta1);
  s.beta2 = static_cast<float>(beta2);
  s.one_minus_beta1 = static_cast<float>(1.0 - beta1);
  s.one_minus_beta2 = static_cast<float>(1.0 - beta2);
  s.eps = static_cast<float>(eps);
  s.maximize = maximize;
  run_step({op,
            Algo::kLamb,
            params,
            grads,
            exp_avgs,
            exp_avg_sqs,
            {},
            masters,
            steps,
            masks,
            emas,
            &lr_tensor,
            &grad_scale,
            &found_inf,
            &clip_coef,
            lr,
            ema_decay,
            beta1,
            beta2},
           s);
}

TORCH_LIBRARY_IMPL(torchspeed, CPU, m) {
  m.impl("adam_step_", &adam_step_cpu);
  m.impl("sgd_step_", &sgd_step_cpu);
  m.impl("lion_step_", &lion_step_cpu);
  m.impl("lamb_step_", &lamb_step_cpu);
}

}  // namespace torchspeed::ops
