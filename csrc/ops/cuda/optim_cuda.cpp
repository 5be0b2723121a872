// CUDA implementation of the fused optimizer steps (adam_step_, sgd_step_, lion_step_,
// lamb_step_): validates with the shared checks, then hands raw pointers and the host
// hyperparameters (rounded as the CPU op rounds them) to kernels/cuda/optim.cu on the current
// stream. lr_tensor, grad_scale, found_inf, clip_coef and the steps are only read on the device:
// no .item(), no host sync, CUDA-graph capturable.
#include <ATen/ATen.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/library.h>

#include <optional>
#include <vector>

#include "kernels/cuda/api.cuh"
#include "ops/optim_checks.h"

namespace torchspeed::ops {
namespace {

namespace kc = kernels::cuda;

kc::DType cuda_kernel_dtype(at::ScalarType t) {
  switch (t) {
    case at::kBFloat16:
      return kc::DType::kBFloat16;
    case at::kHalf:
      return kc::DType::kHalf;
    case at::kDouble:
      return kc::DType::kDouble;
    default:
      return kc::DType::kFloat;
  }
}

/// The lists of one step call; lists a feature does not use are empty.
struct CudaStepArgs {
  const char* op;
  kc::OptimAlgo algo;
  at::TensorList params, grads, state0, state1, state2, masters, steps, masks, emas;
  const OptTensor* lr_tensor;
  const OptTensor* grad_scale;
  const OptTensor* found_inf;
  const OptTensor* clip_coef;
};

float* f32_or_null(at::TensorList list, size_t i) {
  return list.empty() || list[i].numel() == 0 ? nullptr : list[i].data_ptr<float>();
}

const float* scalar_ptr(const OptTensor* t) {
  return (t && t->has_value()) ? (*t)->data_ptr<float>() : nullptr;
}

void run_cuda_step(const CudaStepArgs& a, kc::OptimHyper hyper);

/// run_cuda_step one param at a time, in list order, when written tensors share memory (see
/// writes_overlap); first_step holds for every occurrence of a repeated param, as in torch.
void run_cuda_step_sequentially(const CudaStepArgs& a, const kc::OptimHyper& hyper) {
  for (size_t i = 0; i < a.params.size(); ++i) {
    CudaStepArgs one = a;
    for (at::TensorList* list : {&one.params, &one.grads, &one.state0, &one.state1, &one.state2,
                                 &one.masters, &one.steps, &one.masks, &one.emas}) {
      if (!list->empty()) *list = list->slice(i, 1);
    }
    run_cuda_step(one, hyper);
  }
}

/// Everything is validated before this runs (validate_*_step); it only checks the device kind.
void run_cuda_step(const CudaStepArgs& a, kc::OptimHyper hyper) {
  const at::Device device = a.params[0].device();
  TORCH_CHECK(device.is_cuda(), "torchspeed.", a.op, ": params must be on a CUDA device, got ",
              device);
  if (a.params.size() > 1 &&
      writes_overlap({a.params, a.state0, a.state1, a.state2, a.masters, a.steps, a.emas})) {
    run_cuda_step_sequentially(a, hyper);
    return;
  }
  const c10::cuda::CUDAGuard guard(device);

  // The scalar tensors are one-element float32 tensors on the device: keep a contiguous handle
  // alive for the pointers (a no-op for the usual contiguous 0-dim / [1] tensors).
  std::vector<at::Tensor> keep;
  auto scalar = [&](const OptTensor* t) -> const float* {
    if (!t || !t->has_value()) return nullptr;
    keep.push_back((*t)->contiguous());
    return keep.back().data_ptr<float>();
  };
  hyper.lr_tensor = scalar(a.lr_tensor);
  hyper.grad_scale = scalar(a.grad_scale);
  hyper.found_inf = scalar(a.found_inf);
  hyper.clip_coef = scalar(a.clip_coef);

  const size_t n = a.params.size();
  std::vector<at::Tensor> grads(a.grads.begin(), a.grads.end());
  for (size_t i = 0; i < n; ++i) grads[i] = grad_like_param(grads[i], a.params[i]);
  std::vector<kc::OptimTensor> list(n);
  for (size_t i = 0; i < n; ++i) {
    const at::Tensor& p = a.params[i];
    const bool empty = p.numel() == 0;
    list[i].param = empty ? nullptr : p.data_ptr();
    list[i].grad = empty ? nullptr : grads[i].data_ptr();
    list[i].master = f32_or_null(a.masters, i);
    list[i].state0 = f32_or_null(a.state0, i);
    list[i].state1 = f32_or_null(a.state1, i);
    list[i].state2 = f32_or_null(a.state2, i);
    list[i].mask = a.masks.empty() || empty ? nullptr : a.masks[i].data_ptr<float>();
    list[i].ema = f32_or_null(a.emas, i);
    list[i].step = a.steps.empty() ? nullptr : a.steps[i].data_ptr<float>();
    list[i].numel = p.numel();
    list[i].param_dtype = cuda_kernel_dtype(p.scalar_type());
    list[i].grad_dtype = cuda_kernel_dtype(grads[i].scalar_type());
  }
  at::Tensor lamb_workspace;
  if (a.algo == kc::OptimAlgo::kLamb) {
    lamb_workspace = at::empty({static_cast<int64_t>(2 * n)},
                               at::TensorOptions().dtype(at::kDouble).device(device));
  }
  const cudaError_t err =
      kc::optim_step(a.algo, list.data(), static_cast<int64_t>(n), hyper,
                     lamb_workspace.defined() ? lamb_workspace.data_ptr<double>() : nullptr,
                     c10::cuda::getCurrentCUDAStream(device.index()).stream());
  TORCH_CHECK(err == cudaSuccess, "torchspeed.", a.op,
              ": CUDA kernel launch failed: ", cudaGetErrorString(err));
}

/// The host-rounded hyperparameters, exactly as adam_step_cpu & co. fill OptimScalars.
kc::OptimHyper base_hyper(double lr, double weight_decay, double ema_decay) {
  kc::OptimHyper h{};
  h.lr = lr;
  h.weight_decay = static_cast<float>(weight_decay);
  h.one_minus_ema_decay = static_cast<float>(1.0 - ema_decay);
  return h;
}

void set_betas(kc::OptimHyper& h, double beta1, double beta2) {
  h.beta1 = beta1;
  h.beta2 = beta2;
  h.beta2_f = static_cast<float>(beta2);
  h.one_minus_beta1 = static_cast<float>(1.0 - beta1);
  h.one_minus_beta2 = static_cast<float>(1.0 - beta2);
}

void adam_step_cuda(at::TensorList params, at::TensorList grads, at::TensorList exp_avgs,
                    at::TensorList exp_avg_sqs, at::TensorList max_exp_avg_sqs,
                    at::TensorList masters, at::TensorList steps, at::TensorList masks,
                    at::TensorList emas, double lr, double beta1, double beta2, double eps,
                    double weight_decay, bool amsgrad, bool maximize, bool decoupled_weight_decay,
                    const OptTensor& lr_tensor, const OptTensor& grad_scale,
                    const OptTensor& found_inf, const OptTensor& clip_coef, double ema_decay) {
  validate_adam_step(params, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, masters, steps, masks,
                     emas, amsgrad, lr_tensor, grad_scale, found_inf, clip_coef);
  kc::OptimHyper h = base_hyper(lr, weight_decay, ema_decay);
  set_betas(h, beta1, beta2);
  h.eps = static_cast<float>(eps);
  h.amsgrad = amsgrad;
  h.maximize = maximize;
  h.decoupled_weight_decay = decoupled_weight_decay;
  run_cuda_step({"adam_step_", kc::OptimAlgo::kAdam, params, grads, exp_avgs, exp_avg_sqs,
                 amsgrad ? max_exp_avg_sqs : at::TensorList(), masters, steps, masks, emas,
                 &lr_tensor, &grad_scale, &found_inf, &clip_coef},
                h);
}

void sgd_step_cuda(at::TensorList params, at::TensorList grads, at::TensorList momentum_buffers,
                   at::TensorList masters, at::TensorList masks, at::TensorList emas, double lr,
                   double momentum, double dampening, double weight_decay, bool nesterov,
                   bool maximize, bool first_step, const OptTensor& lr_tensor,
                   const OptTensor& grad_scale, const OptTensor& found_inf,
                   const OptTensor& clip_coef, double ema_decay) {
  validate_sgd_step(params, grads, momentum_buffers, masters, masks, emas, momentum, dampening,
                    nesterov, lr_tensor, grad_scale, found_inf, clip_coef);
  kc::OptimHyper h = base_hyper(lr, weight_decay, ema_decay);
  h.momentum = static_cast<float>(momentum);
  h.one_minus_dampening = static_cast<float>(1.0 - dampening);
  h.nesterov = nesterov;
  h.maximize = maximize;
  h.first_step = first_step;
  run_cuda_step({"sgd_step_",
                 kc::OptimAlgo::kSgd,
                 params,
                 grads,
                 momentum != 0.0 ? momentum_buffers : at::TensorList(),
                 {},
                 {},
                 masters,
                 {},
                 masks,
                 emas,
                 &lr_tensor,
                 &grad_scale,
                 &found_inf,
                 &clip_coef},
                h);
}

void lion_step_cuda(at::TensorList params, at::TensorList grads, at::TensorList exp_avgs,
                    at::TensorList masters, at::TensorList steps, at::TensorList masks,
                    at::TensorList emas, double lr, double beta1, double beta2, double weight_decay,
                    bool maximize, const OptTensor& lr_tensor, const OptTensor& grad_scale,
                    const OptTensor& found_inf, const OptTensor& clip_coef, double ema_decay) {
  validate_lion_step(params, grads, exp_avgs, masters, steps, masks, emas, lr_tensor, grad_scale,
                     found_inf, clip_coef);
  kc::OptimHyper h = base_hyper(lr, weight_decay, ema_decay);
  set_betas(h, beta1, beta2);
  h.maximize = maximize;
  run_cuda_step({"lion_step_",
                 kc::OptimAlgo::kLion,
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
                 &clip_coef},
                h);
}

void lamb_step_cuda(at::TensorList params, at::TensorList grads, at::TensorList exp_avgs,
                    at::TensorList exp_avg_sqs, at::TensorList masters, at::TensorList steps,
                    at::TensorList masks, at::TensorList emas, double lr, double beta1,
                    double beta2, double eps, double weight_decay, bool maximize,
                    const OptTensor& lr_tensor, const OptTensor& grad_scale,
                    const OptTensor& found_inf, const OptTensor& clip_coef, double ema_decay) {
  validate_lamb_step(params, grads, exp_avgs, exp_avg_sqs, masters, steps, masks, emas, lr_tensor,
                     grad_scale, found_inf, clip_coef);
  kc::OptimHyper h = base_hyper(lr, weight_decay, ema_decay);
  set_betas(h, beta1, beta2);
  h.eps = static_cast<float>(eps);
  h.maximize = maximize;
  run_cuda_step({"lamb_step_",
                 kc::OptimAlgo::kLamb,
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
                 &clip_coef},
                h);
}

}  // namespace

TORCH_LIBRARY_IMPL(torchspeed, CUDA, m) {
  m.impl("adam_step_", &adam_step_cuda);
  m.impl("sgd_step_", &sgd_step_cuda);
  m.impl("lion_step_", &lion_step_cuda);
  m.impl("lamb_step_", &lamb_step_cuda);
}

}  // namespace torchspeed::ops
