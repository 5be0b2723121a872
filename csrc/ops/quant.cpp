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
  // The int8 Linear (dynamic per-row activations, per-channel int8 weights). int8_pack_weight
  // (CPU): w int8 [N, K] in [-127, 127] -> uint8 [64 + 4 * N_pad + N_pad * K_pad] (N_pad, K_pad: N
  // and K rounded up to 16 and 64), a header naming the int8 path, N and K, then the panels.
  m.def("int8_pack_weight(Tensor w) -> Tensor");
  // x (float32/bfloat16/float16 [..., K], contiguous) -> [..., N] of x's dtype:
  //   scale[m] = max_k |x[m, k]| / 127 (1 for a zero row), q = clamp(round_half_even(x / scale))
  //   out[m, n] = act(float(sum_k q[m, k] * w[n, k]) * (scale[m] * w_scale[n]) + bias[n])
  // in exact int32 and fp32 without FMA, act = ReLU (x < 0 ? 0 : x) when relu. packed_w: the
  // packed uint8 buffer on CPU (for the current path), the int8 [N, K] weight on CUDA.
  m.def(
      "int8_linear(Tensor x, Tensor packed_w, Tensor w_scale, Tensor? bias=None, bool relu=False) "
      "-> Tensor");
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

at::Tensor int8_pack_weight(const at::Tensor& w) { return op_args::call(Int8PackWeightArgs{w}); }

at::Tensor int8_linear(const at::Tensor& x, const at::Tensor& packed_w, const at::Tensor& w_scale,
                       const std::optional<at::Tensor>& bias, bool relu) {
  return op_args::call(Int8LinearArgs{x, packed_w, w_scale, bias, relu});
}

}  // namespace torchspeed
