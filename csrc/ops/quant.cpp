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
  // Fake quantization for quantization-aware training, in one pass over x (float32, bfloat16 or
  // float16, contiguous), with quantize_int8's granularity rule, zero_point (int32 within
  // [quant_min, quant_max]) or None, and -2^22 <= quant_min <= quant_max <= 2^22. In fp32:
  //   v = round_half_even(x * (1 / scale)) + zero_point
  //   y = (clamp(v, quant_min, quant_max) - zero_point) * scale     (stored in x's dtype)
  //   mask = quant_min <= v <= quant_max                            (bool)
  // which is torch.fake_quantize_per_{tensor,channel}_affine(_cachemask) bit for bit on float32
  // (and its formula on x.float() for bf16/fp16). The straight-through gradient is grad_y * mask
  // (torch.library.register_autograd in torchspeed/quant/fake_quant.py).
  m.def(
      "fake_quantize(Tensor x, Tensor scale, Tensor? zero_point=None, int quant_min=-128, "
      "int quant_max=127) -> (Tensor, Tensor)");
  // Its backward in one pass: grad * mask (mask bool, grad's shape; grad float32, bfloat16 or
  // float16, contiguous), the product with mask as 0.0 / 1.0 in grad's dtype, like torch's
  // fake_quantize cachemask backward (`dY * mask`): inf or NaN where the mask is 0 give NaN.
  m.def("fake_quantize_backward(Tensor grad, Tensor mask) -> Tensor");
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

FakeQuantizeResult fake_quantize(const at::Tensor& x, const at::Tensor& scale,
                                 const std::optional<at::Tensor>& zero_point, int64_t quant_min,
                                 int64_t quant_max) {
  return op_args::call(FakeQuantizeArgs{x, scale, zero_point, quant_min, quant_max});
}

at::Tensor fake_quantize_backward(const at::Tensor& grad, const at::Tensor& mask) {
  return op_args::call(FakeQuantizeBackwardArgs{grad, mask});
}

}  // namespace torchspeed
