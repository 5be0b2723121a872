// CUDA implementation of the prune area's ops (nm_mask, magnitude_mask): validates, then enqueues
// the torch-free kernels (kernels/cuda/prune.cu) on the current stream. magnitude_mask selects on
// the device with ATen (kthvalue over the magnitude keys, a cumulative count for the threshold's
// ties) and packs with the kernel: no host synchronisation anywhere.
#include <ATen/ATen.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/library.h>

#include "kernels/cuda/api.cuh"
#include "ops/prune_checks.h"

namespace torchspeed::ops {
namespace {

namespace kc = kernels::cuda;

void check_launch(const char* op, cudaError_t err) {
  TORCH_CHECK(err == cudaSuccess, "torchspeed.", op,
              ": CUDA launch failed: ", cudaGetErrorString(err));
}

at::Tensor nm_mask_cuda(const NmMaskArgs& a) {
  validate(a);
  const c10::cuda::CUDAGuard guard(a.w.device());
  at::Tensor out = at::empty({packed_mask_bytes(a.w.numel())}, a.w.options().dtype(at::kByte));
  if (a.w.numel() == 0) return out;
  check_launch(NmMaskArgs::kName,
               kc::prune_nm_mask(a.w.const_data_ptr(), static_cast<int>(a.w.element_size()),
                                 a.w.numel(), static_cast<int>(a.n), static_cast<int>(a.m),
                                 out.data_ptr<uint8_t>(), c10::cuda::getCurrentCUDAStream()));
  return out;
}

at::Tensor magnitude_mask_cuda(const MagnitudeMaskArgs& a) {
  validate(a);
  const c10::cuda::CUDAGuard guard(a.w.device());
  const int64_t numel = a.w.numel();
  if (a.amount == 0 || numel == 0) {
    return torchspeed::pack_mask(at::ones({numel}, a.w.options().dtype(at::kBool)));
  }
  const at::Tensor keys = magnitude_keys(a.w);
  const at::Tensor threshold = std::get<0>(at::kthvalue(keys, a.amount));  // on the device
  const at::Tensor tie = keys.eq(threshold);
  const at::Tensor below = keys.lt(threshold).sum();
  // Ties kept: the first (ties - (amount - below)) in memory order.
  const at::Tensor ties_kept = tie.sum() - (a.amount - below);
  const at::Tensor keep =
      keys.gt(threshold).logical_or_(tie.logical_and(tie.cumsum(0).le(ties_kept)));
  return torchspeed::pack_mask(keep);  // the packed-mask op (mask_cuda.cpp)
}

}  // namespace

TORCH_LIBRARY_IMPL(torchspeed, CUDA, m) {
  TORCHSPEED_OP_IMPL(m, NmMaskArgs, nm_mask_cuda);
  TORCHSPEED_OP_IMPL(m, MagnitudeMaskArgs, magnitude_mask_cuda);
}

}  // namespace torchspeed::ops
