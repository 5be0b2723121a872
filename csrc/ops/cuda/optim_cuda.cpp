// CUDA implementation of the fused optimizer steps (adam_step_, sgd_step_, lion_step_,
// lamb_step_): takes the validated FusedStep (the hyperparameters rounded on the host as for the
// CPU) and hands raw pointers to kernels/cuda/optim.cu on the current stream. lr_tensor,
// grad_scale, found_inf, clip_coef and the steps are only read on the device: no .item(), no host
// sync, CUDA-graph capturable.
#include <ATen/ATen.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/library.h>

#include <vector>

#include "kernels/cuda/api.cuh"
#include "ops/fused_step.h"
#include "ops/optim_checks.h"

namespace torchspeed::ops {
namespace {

namespace kc = kernels::cuda;

float* f32_or_null(at::TensorList list, size_t i) {
  return list.empty() || list[i].numel() == 0 ? nullptr : list[i].data_ptr<float>();
}

void run_fused_step(const FusedStep& a) {
  const at::Device device = a.params[0].device();
  TORCH_CHECK(device.is_cuda(), "torchspeed.", a.op, ": params must be on a CUDA device, got ",
              device);
  if (a.writes_overlap()) {
    // One param at a time, in list order (see the CPU driver).
    for (size_t i = 0; i < a.params.size(); ++i) run_fused_step(a.element(i));
    return;
  }
  const c10::cuda::CUDAGuard guard(device);

  // The scalar tensors are one-element float32 tensors on the device: keep a contiguous handle
  // alive for the pointers (a no-op for the usual contiguous 0-dim / [1] tensors).
  std::vector<at::Tensor> keep;
  auto scalar = [&](const OptTensor* t) -> const float* {
    if (!t->has_value()) return nullptr;
    keep.push_back((*t)->contiguous());
    return keep.back().data_ptr<float>();
  };
  const kc::DeviceScalars scalars{scalar(a.lr_tensor), scalar(a.grad_scale), scalar(a.found_inf),
                                  scalar(a.clip_coef)};

  const size_t n = a.params.size();
  std::vector<at::Tensor> grads(a.grads.begin(), a.grads.end());
  for (size_t i = 0; i < n; ++i) grads[i] = grad_like_param(grads[i], a.params[i]);
  std::vector<kc::OptimTensor> list(n);
  for (size_t i = 0; i < n; ++i) {
    const at::Tensor& p = a.params[i];
    const bool empty = p.numel() == 0;
    kc::OptimTensor& t = list[i];
    t.param = empty ? nullptr : p.data_ptr();
    t.grad = empty ? nullptr : grads[i].data_ptr();
    t.master = f32_or_null(a.masters, i);
    t.exp_avg = f32_or_null(a.exp_avgs, i);
    t.exp_avg_sq = f32_or_null(a.exp_avg_sqs, i);
    t.max_exp_avg_sq = f32_or_null(a.max_exp_avg_sqs, i);
    t.mask = f32_or_null(a.masks, i);
    t.ema = f32_or_null(a.emas, i);
    t.step = a.steps.empty() ? nullptr : a.steps[i].data_ptr<float>();
    t.numel = p.numel();
    t.param_dtype = kernel_dtype(p.scalar_type());
    t.grad_dtype = kernel_dtype(grads[i].scalar_type());
  }
  at::Tensor lamb_workspace;
  if (a.algo == kernels::OptimAlgo::kLamb) {
    lamb_workspace = at::empty({static_cast<int64_t>(2 * n)},
                               at::TensorOptions().dtype(at::kDouble).device(device));
  }
  const cudaError_t err =
      kc::optim_step(a.algo, list.data(), static_cast<int64_t>(n), a.hyper, scalars,
                     lamb_workspace.defined() ? lamb_workspace.data_ptr<double>() : nullptr,
                     c10::cuda::getCurrentCUDAStream(device.index()).stream());
  TORCH_CHECK(err == cudaSuccess, "torchspeed.", a.op,
              ": CUDA kernel launch failed: ", cudaGetErrorString(err));
}

template <class Args>
void fused_step_cuda(const Args& args) {
  run_fused_step(fused_step(args));
}

}  // namespace

TORCH_LIBRARY_IMPL(torchspeed, CUDA, m) {
  TORCHSPEED_OP_IMPL(m, AdamStepArgs, fused_step_cuda<AdamStepArgs>);
  TORCHSPEED_OP_IMPL(m, SgdStepArgs, fused_step_cuda<SgdStepArgs>);
  TORCHSPEED_OP_IMPL(m, LionStepArgs, fused_step_cuda<LionStepArgs>);
  TORCHSPEED_OP_IMPL(m, LambStepArgs, fused_step_cuda<LambStepArgs>);
}

}  // namespace torchspeed::ops
