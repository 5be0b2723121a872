// CUDA implementation of torchspeed::grad_stats and grad_stats_unscale_: validates, then hands raw
// pointers to the torch-free kernels (kernels/cuda/grad_stats.cu) on the current stream. Nothing
// here reads a device value on the host, so the op never synchronises. (c10/cuda/CUDAStream.h is
// the stream API that ATen/cuda/CUDAContext.h re-exports as at::cuda::getCurrentCUDAStream, without
// pulling in the cuBLAS/cuSPARSE/cuSOLVER headers.)
#include <ATen/ATen.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/library.h>

#include <tuple>
#include <vector>

#include "kernels/cuda/api.cuh"
#include "ops/checks.h"
#include "torchspeed/ops/optim.h"

namespace torchspeed::ops {
namespace {

namespace kc = kernels::cuda;

GradStatsTuple grad_stats_cuda_impl(const char* op, at::TensorList tensors,
                                    const at::Tensor* inv_scale, bool per_tensor) {
  const at::Device device = check_float_tensor_list(op, "tensors", tensors);
  if (inv_scale) check_scalar_tensor(op, "inv_scale", *inv_scale, device);
  TORCH_CHECK(device.is_cuda(), "torchspeed.", op, ": tensors must be on a CUDA device, got ",
              device);
  const c10::cuda::CUDAGuard guard(device);

  // Non-contiguous tensors go through a contiguous copy (written back after unscaling), as on CPU.
  std::vector<at::Tensor> work(tensors.begin(), tensors.end());
  for (auto& t : work) t = t.contiguous();
  const int64_t n = static_cast<int64_t>(work.size());
  std::vector<kc::GradStatsTensor> list(work.size());
  for (size_t i = 0; i < work.size(); ++i) {
    list[i] = {work[i].numel() ? work[i].data_ptr() : nullptr, work[i].numel(),
               kernel_dtype(work[i].scalar_type())};
  }
  at::Tensor scale;
  if (inv_scale) scale = inv_scale->contiguous();

  const auto opts = at::TensorOptions().dtype(at::kFloat).device(device);
  at::Tensor workspace = at::empty({n}, opts.dtype(at::kDouble));
  at::Tensor total = at::empty({}, opts);
  at::Tensor per = at::empty({per_tensor ? n : 0}, opts);
  at::Tensor found_inf = at::empty({}, opts);

  const cudaError_t err = kc::grad_stats(
      list.data(), n, inv_scale ? scale.data_ptr<float>() : nullptr, workspace.data_ptr<double>(),
      total.data_ptr<float>(), per_tensor ? per.data_ptr<float>() : nullptr,
      found_inf.data_ptr<float>(), c10::cuda::getCurrentCUDAStream(device.index()).stream());
  TORCH_CHECK(err == cudaSuccess, "torchspeed.", op,
              ": CUDA kernel launch failed: ", cudaGetErrorString(err));

  if (inv_scale) {
    for (size_t i = 0; i < work.size(); ++i) {
      if (!work[i].is_same(tensors[i])) tensors[i].copy_(work[i]);
    }
  }
  return {total, per, found_inf};
}

GradStatsTuple grad_stats_cuda(const GradStatsArgs& a) {
  return grad_stats_cuda_impl(GradStatsArgs::kName, a.tensors, nullptr, a.per_tensor);
}

GradStatsTuple grad_stats_unscale_cuda(const GradStatsUnscaleArgs& a) {
  return grad_stats_cuda_impl(GradStatsUnscaleArgs::kName, a.tensors, &a.inv_scale, a.per_tensor);
}

}  // namespace

TORCH_LIBRARY_IMPL(torchspeed, CUDA, m) {
  TORCHSPEED_OP_IMPL(m, GradStatsArgs, grad_stats_cuda);
  TORCHSPEED_OP_IMPL(m, GradStatsUnscaleArgs, grad_stats_unscale_cuda);
}

}  // namespace torchspeed::ops
