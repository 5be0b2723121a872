// The quant area's ops: their schemas (a TORCH_LIBRARY_FRAGMENT of the torchspeed library) and
// their C++ entry points (declared in <torchspeed/ops/quant.h>), which call through the
// dispatcher. Kernels: ops/cpu/quant_cpu.cpp, ops/cuda/quant_cuda.cpp, ops/meta/quant_meta.cpp.
#include "torchspeed/ops/quant.h"

#include <torch/library.h>

TORCH_LIBRARY_FRAGMENT(torchspeed, m) {
  // int8 affine quantization of x (float32, bfloat16 or float16, contiguous): for x viewed as
  // [rows, cols] (cols = its last dim), scale (float32, > 0, finite) is one element (per tensor),
  // [rows] (per channel) or [rows, groups] (per group of cols / groups elements); zero_point, the
  // same shape in int32 within [-128, 127], or None (symmetric, 0). Computed in fp32:
  //   q = clamp(round_half_even(x * (1 / scale)) + zero_point, -128, 127)
  // which is torch's formula on x.float() (torchao's quantize_affine) bit for bit.
  m.def("quantize_int8(Tensor x, Tensor scale, Tensor? zero_point=None) -> Tensor");
  // The inverse map, float32: (q - zero_point) * scale, with the same granularity rule.
  m.def("dequantize_int8(Tensor q, Tensor scale, Tensor? zero_point=None) -> Tensor");
}

namespace torchspeed {

at::Tensor quantize_int8(const at::Tensor& x, const at::Tensor& scale,
                         const std::optional<at::Tensor>& zero_point) {
  return op_args::call(QuantizeInt8Args{x, scale, zero_point});
}

at::Tensor dequantize_int8(const at::Tensor& q, const at::Tensor& scale,
                           const std::optional<at::Tensor>& zero_point) {
  return op_args::call(DequantizeInt8Args{q, scale, zero_point});
}

}  // namespace torchspeed
