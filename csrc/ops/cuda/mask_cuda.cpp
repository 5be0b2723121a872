// CUDA implementation of the packed-mask ops: validates, then enqueues the torch-free kernels
// (kernels/cuda/mask.cu) on the current stream; no host synchronisation.
#include <ATen/ATen.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/library.h>

#include "kernels/cuda/api.cuh"
#include "ops/mask_checks.h"

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
               kc::pack_mask_bits(reinterpret_cast<const uint8_t*>(bools.const_data_ptr<bool>()),
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
               kc::unpack_mask_bits(a.packed.const_data_ptr<uint8_t>(),
                                    reinterpret_cast<uint8_t*>(out.data_ptr<bool>()), n,
                                    c10::cuda::getCurrentCUDAStream()));
  return out;
}

void apply_mask_cuda(const ApplyMaskArgs& a) {
  validate(a);
  const c10::cuda::CUDAGuard guard(a.w.device());
  if (a.w.numel() == 0) return;
  check_launch(ApplyMaskArgs::kName,
               kc::apply_mask_bits(a.w.data_ptr(), static_cast<int>(a.w.element_size()),
                                   a.packed.const_data_ptr<uint8_t>(), a.w.numel(),
                                   c10::cuda::getCurrentCUDAStream()));
}

}  // namespace

TORCH_LIBRARY_IMPL(torchspeed, CUDA, m) {
  TORCHSPEED_OP_IMPL(m, PackMaskArgs, pack_mask_cuda);
  TORCHSPEED_OP_IMPL(m, UnpackMaskArgs, unpack_mask_cuda);
  TORCHSPEED_OP_IMPL(m, ApplyMaskArgs, apply_mask_cuda);
}

}  // namespace torchspeed::ops
