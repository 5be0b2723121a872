// CUDA implementation of torchspeed::quantize_int8, dequantize_int8 and fake_quantize: validates
// (shapes and dtypes; scale and zero_point values stay on the device), then enqueues the
// torch-free kernels (kernels/cuda/quant.cu, quant_fake_quant.cu) on the current stream. No host
// synchronisation.
#include <ATen/ATen.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/library.h>

#include "kernels/cuda/api.cuh"
#include "ops/quant_checks.h"

namespace torchspeed::ops {
namespace {

namespace kc = kernels::cuda;

kc::QuantLayout to_kernel(const QuantLayout& l) { return {l.rows, l.cols, l.groups}; }

at::Tensor quantize_int8_cuda(const QuantizeInt8Args& a) {
  const QuantLayout l = validate(a).concrete();
  const c10::cuda::CUDAGuard guard(a.x.device());
  at::Tensor q = at::empty(a.x.sizes(), a.x.options().dtype(at::kChar));
  const cudaError_t err = kc::quantize_int8(
      kernel_dtype(a.x.scalar_type()), a.x.numel() ? a.x.data_ptr() : nullptr,
      q.numel() ? q.data_ptr<int8_t>() : nullptr, to_kernel(l), a.scale.data_ptr<float>(),
      a.zero_point ? a.zero_point->data_ptr<int32_t>() : nullptr,
      c10::cuda::getCurrentCUDAStream());
  TORCH_CHECK(err == cudaSuccess,
              "torchspeed.quantize_int8: CUDA launch failed: ", cudaGetErrorString(err));
  return q;
}

at::Tensor dequantize_int8_cuda(const DequantizeInt8Args& a) {
  const QuantLayout l = validate(a).concrete();
  const c10::cuda::CUDAGuard guard(a.q.device());
  at::Tensor out = at::empty(a.q.sizes(), a.q.options().dtype(at::kFloat));
  const cudaError_t err = kc::dequantize_int8(
      a.q.numel() ? a.q.data_ptr<int8_t>() : nullptr, out.numel() ? out.data_ptr<float>() : nullptr,
      to_kernel(l), a.scale.data_ptr<float>(),
      a.zero_point ? a.zero_point->data_ptr<int32_t>() : nullptr,
      c10::cuda::getCurrentCUDAStream());
  TORCH_CHECK(err == cudaSuccess,
              "torchspeed.dequantize_int8: CUDA launch failed: ", cudaGetErrorString(err));
  return out;
}

FakeQuantizeResult fake_quantize_cuda(const FakeQuantizeArgs& a) {
  const QuantLayout l = validate(a).concrete();
  const c10::cuda::CUDAGuard guard(a.x.device());
  at::Tensor y = at::empty(a.x.sizes(), a.x.options());
  at::Tensor mask = at::empty(a.x.sizes(), a.x.options().dtype(at::kBool));
  const cudaError_t err = kc::fake_quantize(
      kernel_dtype(a.x.scalar_type()), a.x.numel() ? a.x.data_ptr() : nullptr,
      y.numel() ? y.data_ptr() : nullptr,
      mask.numel() ? reinterpret_cast<uint8_t*>(mask.data_ptr<bool>()) : nullptr, to_kernel(l),
      a.scale.data_ptr<float>(), a.zero_point ? a.zero_point->data_ptr<int32_t>() : nullptr,
      static_cast<float>(a.quant_min), static_cast<float>(a.quant_max),
      c10::cuda::getCurrentCUDAStream());
  TORCH_CHECK(err == cudaSuccess,
              "torchspeed.fake_quantize: CUDA launch failed: ", cudaGetErrorString(err));
  return {y, mask};
}

at::Tensor fake_quantize_backward_cuda(const FakeQuantizeBackwardArgs& a) {
  validate(a);
  const c10::cuda::CUDAGuard guard(a.grad.device());
  at::Tensor out = at::empty(a.grad.sizes(), a.grad.options());
  const cudaError_t err = kc::fake_quantize_backward(
      kernel_dtype(a.grad.scalar_type()), a.grad.numel() ? a.grad.data_ptr() : nullptr,
      a.mask.numel() ? reinterpret_cast<const uint8_t*>(a.mask.data_ptr<bool>()) : nullptr,
      out.numel() ? out.data_ptr() : nullptr, a.grad.numel(), c10::cuda::getCurrentCUDAStream());
  TORCH_CHECK(err == cudaSuccess,
              "torchspeed.fake_quantize_backward: CUDA launch failed: ", cudaGetErrorString(err));
  return out;
}

}  // namespace

TORCH_LIBRARY_IMPL(torchspeed, CUDA, m) {
  TORCHSPEED_OP_IMPL(m, QuantizeInt8Args, quantize_int8_cuda);
  TORCHSPEED_OP_IMPL(m, DequantizeInt8Args, dequantize_int8_cuda);
  TORCHSPEED_OP_IMPL(m, FakeQuantizeArgs, fake_quantize_cuda);
  TORCHSPEED_OP_IMPL(m, FakeQuantizeBackwardArgs, fake_quantize_backward_cuda);
}

}  // namespace torchspeed::ops
