// CUDA implementation of the fused optimizer steps (adam_step_, adam_lowbit_step_, sgd_step_,
// sgd_lowbit_step_, lion_step_, lion_lowbit_step_, lamb_step_): takes the validated FusedStep (the
// hyperparameters rounded on the host as for the CPU) and hands raw pointers to
// kernels/cuda/optim.cu (optim_lowbit.cu for low-bit moments) on the current stream.
// lr_tensor, grad_scale, found_inf, clip_coef and the steps are only read on the device: no
// .item(), no host sync, CUDA-graph capturable.
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

void run_fused_step(const FusedStep& a) {
  const at::Device device = a.params[0].device();
  TORCH_CHECK(device.is_cuda(), "torchspeed.", a.op, ": params must be on a CUDA device, got ",
              device);
  if (a.writes_overlap()) {
    TORCH_CHECK(a.lamb_phase == 0, "torchspeed.", a.op,
                ": params must not share memory with phase ", a.lamb_phase,
                " (each param has its own row of norms)");
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
  const std::vector<at::Tensor> grads = a.grads_like_params();
  std::vector<kc::OptimTensor> list(n);
  // Whole tensors: the low-bit moments' pointers (exp_avg_lp, ..., absmaxes) with sr_index 0; the
  // kernels take each param's position in the list for the bf16 rounding's salt, as the CPU does.
  for (size_t i = 0; i < n; ++i) list[i] = a.tensor(i, grads[i], 0, a.params[i].numel());
  at::Tensor lamb_workspace;  // phases 1 and 2: the caller's norms ([n, 2] float64, validated)
  if (a.algo == kernels::OptimAlgo::kLamb) {
    lamb_workspace = a.lamb_phase != 0
                         ? **a.lamb_norms
                         : at::empty({static_cast<int64_t>(2 * n)},
                                     at::TensorOptions().dtype(at::kDouble).device(device));
  }
  const cudaError_t err = kc::optim_step(
      a.algo, list.data(), static_cast<int64_t>(n), a.hyper, scalars,
      lamb_workspace.defined() ? lamb_workspace.data_ptr<double>() : nullptr,
      c10::cuda::getCurrentCUDAStream(device.index()).stream(), static_cast<int>(a.lamb_phase));
  TORCH_CHECK(err == cudaSuccess, "torchspeed.", a.op,
              ": CUDA kernel launch failed: ", cudaGetErrorString(err));
}

template <class Args>
void fused_step_cuda(const Args& args) {
  run_fused_step(fused_step(args));
}

void check_launch(const char* op, cudaError_t err) {
  TORCH_CHECK(err == cudaSuccess, "torchspeed.", op,
              ": CUDA kernel launch failed: ", cudaGetErrorString(err));
}

LowbitCodesTuple lowbit_encode_cuda(const LowbitEncodeArgs& a) {
  validate(a);
  const c10::cuda::CUDAGuard guard(a.values.device());
  const int64_t n = a.values.numel();
  at::Tensor codes =
      at::empty_like(a.values, a.values.options().dtype(a.is_signed ? at::kChar : at::kByte));
  at::Tensor absmax = at::empty({(n + a.state_block - 1) / a.state_block}, a.values.options());
  check_launch(LowbitEncodeArgs::kName,
               kc::lowbit_encode(a.values.const_data_ptr<float>(), n, a.state_block, a.is_signed,
                                 codes.data_ptr(), absmax.data_ptr<float>(),
                                 c10::cuda::getCurrentCUDAStream()));
  return {codes, absmax};
}

at::Tensor lowbit_decode_cuda(const LowbitDecodeArgs& a) {
  validate(a);
  const c10::cuda::CUDAGuard guard(a.codes.device());
  at::Tensor out = at::empty_like(a.codes, a.codes.options().dtype(at::kFloat));
  check_launch(LowbitDecodeArgs::kName,
               kc::lowbit_decode(a.codes.const_data_ptr(), a.codes.scalar_type() == at::kChar,
                                 a.absmax.const_data_ptr<float>(), a.codes.numel(), a.state_block,
                                 out.data_ptr<float>(), c10::cuda::getCurrentCUDAStream()));
  return out;
}

}  // namespace

TORCH_LIBRARY_IMPL(torchspeed, CUDA, m) {
  TORCHSPEED_OP_IMPL(m, AdamStepArgs, fused_step_cuda<AdamStepArgs>);
  TORCHSPEED_OP_IMPL(m, AdamLowbitStepArgs, fused_step_cuda<AdamLowbitStepArgs>);
  TORCHSPEED_OP_IMPL(m, SgdStepArgs, fused_step_cuda<SgdStepArgs>);
  TORCHSPEED_OP_IMPL(m, SgdLowbitStepArgs, fused_step_cuda<SgdLowbitStepArgs>);
  TORCHSPEED_OP_IMPL(m, LionStepArgs, fused_step_cuda<LionStepArgs>);
  TORCHSPEED_OP_IMPL(m, LionLowbitStepArgs, fused_step_cuda<LionLowbitStepArgs>);
  TORCHSPEED_OP_IMPL(m, LambStepArgs, fused_step_cuda<LambStepArgs>);
  TORCHSPEED_OP_IMPL(m, LowbitEncodeArgs, lowbit_encode_cuda);
  TORCHSPEED_OP_IMPL(m, LowbitDecodeArgs, lowbit_decode_cuda);
}

}  // namespace torchspeed::ops
