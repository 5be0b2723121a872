// CUDA implementation of the prune area's ops: validates, then enqueues the torch-free kernels
// (kernels/cuda/prune.cu) on the current stream. magnitude_mask selects on the device with ATen
// (kthvalue over the magnitude keys, a cumulative count for the threshold's ties) and packs with
// the kernel: no host synchronisation anywhere.
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

at::Tensor pack_bools(const char* op, const at::Tensor& bools) {
  const int64_t n = bools.numel();
  at::Tensor out = at::empty({packed_mask_bytes(n)}, bools.options().dtype(at::kByte));
  if (n == 0) return out;
  check_launch(op,
               kc::prune_pack_mask(reinterpret_cast<const uint8_t*>(bools.const_data_ptr<bool>()),
                                   out.data_ptr<uint8_t>(), n, c10::cuda::getCurrentCUDAStream()));
  return out;
}

at::Tensor pack_mask_cuda(const PackMaskArgs& a) {
  validate(a);
  const c10::cuda::CUDAGuard guard(a.mask.device());
  return pack_bools(PackMaskArgs::kName, a.mask);
}

at::Tensor unpack_mask_cuda(const UnpackMaskArgs& a) {
  const int64_t n = validate(a).expect_int();
  const c10::cuda::CUDAGuard guard(a.packed.device());
  at::Tensor out = at::empty(a.shape, a.packed.options().dtype(at::kBool));
  if (n == 0) return out;
  check_launch(UnpackMaskArgs::kName,
               kc::prune_unpack_mask(a.packed.const_data_ptr<uint8_t>(),
                                     reinterpret_cast<uint8_t*>(out.data_ptr<bool>()), n,
                                     c10::cuda::getCurrentCUDAStream()));
  return out;
}

void apply_mask_cuda(const ApplyMaskArgs& a) {
  validate(a);
  const c10::cuda::CUDAGuard guard(a.w.device());
  if (a.w.numel() == 0) return;
  check_launch(ApplyMaskArgs::kName,
               kc::prune_apply_mask(a.w.data_ptr(), static_cast<int>(a.w.element_size()),
                                    a.packed.const_data_ptr<uint8_t>(), a.w.numel(),
                                    c10::cuda::getCurrentCUDAStream()));
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
    return pack_bools(MagnitudeMaskArgs::kName, at::ones({numel}, a.w.options().dtype(at::kBool)));
  }
  const at::Tensor keys = magnitude_keys(a.w);
  const at::Tensor threshold = std::get<0>(at::kthvalue(keys, a.amount));  // on the device
  const at::Tensor tie = keys.eq(threshold);
  const at::Tensor below = keys.lt(threshold).sum();
  // Ties kept: the first (ties - (amount - below)) in memory order.
  const at::Tensor ties_kept = tie.sum() - (a.amount - below);
  const at::Tensor keep =
      keys.gt(threshold).logical_or_(tie.logical_and(tie.cumsum(0).le(ties_kept)));
  return pack_bools(MagnitudeMaskArgs::kName, keep);
}

}  // namespace

TORCH_LIBRARY_IMPL(torchspeed, CUDA, m) {
  TORCHSPEED_OP_IMPL(m, PackMaskArgs, pack_mask_cuda);
  TORCHSPEED_OP_IMPL(m, UnpackMaskArgs, unpack_mask_cuda);
  TORCHSPEED_OP_IMPL(m, ApplyMaskArgs, apply_mask_cuda);
  TORCHSPEED_OP_IMPL(m, NmMaskArgs, nm_mask_cuda);
  TORCHSPEED_OP_IMPL(m, MagnitudeMaskArgs, magnitude_mask_cuda);
}

}  // namespace torchspeed::ops
