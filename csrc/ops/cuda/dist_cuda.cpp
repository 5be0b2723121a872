// CUDA implementation of torchspeed::scale_cast_: validates, then enqueues the torch-free kernel
// (kernels/cuda/dist_bucket.cu) on the current stream. No host synchronisation.
#include <ATen/ATen.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/library.h>

#include "kernels/cuda/api.cuh"
#include "ops/dist_checks.h"

namespace torchspeed::ops {
namespace {

void scale_cast_cuda(const ScaleCastArgs& a) {
  validate(a);
  const char* op = ScaleCastArgs::kName;
  TORCH_CHECK(a.src.is_cuda(), "torchspeed.", op, ": src must be on a CUDA device, got ",
              a.src.device());
  const c10::cuda::CUDAGuard guard(a.src.device());
  const cudaError_t err = kernels::cuda::scale_cast(
      kernel_dtype(a.src.scalar_type()), a.src.numel() ? a.src.data_ptr() : nullptr,
      kernel_dtype(a.out.scalar_type()), a.out.numel() ? a.out.data_ptr() : nullptr, a.scale,
      a.src.numel(), c10::cuda::getCurrentCUDAStream());
  TORCH_CHECK(err == cudaSuccess, "torchspeed.", op,
              ": CUDA launch failed: ", cudaGetErrorString(err));
}

}  // namespace

TORCH_LIBRARY_IMPL(torchspeed, CUDA, m) { TORCHSPEED_OP_IMPL(m, ScaleCastArgs, scale_cast_cuda); }

}  // namespace torchspeed::ops
