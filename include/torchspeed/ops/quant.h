// The quant area's tensor ops, for C++ callers: int8 affine quantize and dequantize (schemas and
// semantics in csrc/ops/quant.cpp). They call through the dispatcher (CPU, CUDA or Meta).
//
//   at::Tensor w = ...;                                   // [out, in] float32
//   at::Tensor scale = w.abs().amax(1).clamp_min(1e-8) / 127;   // per output channel
//   at::Tensor q = torchspeed::quantize_int8(w, scale);   // int8, symmetric
//   at::Tensor back = torchspeed::dequantize_int8(q, scale);
//
// The granularity follows scale's shape, for x viewed as [rows, cols] (cols = the last dim):
// one element = per tensor; [rows] = per channel (row); [rows, groups] = per group of
// cols / groups consecutive elements of a row.
#pragma once

#include <ATen/core/Tensor.h>

#include <optional>
#include <string>
#include <tuple>

#include "torchspeed/export.h"
#include "torchspeed/ops/args.h"

namespace torchspeed {

#define TORCHSPEED_QUANTIZE_INT8_ARGS(X) \
  X(at::Tensor, x, {})                   \
  X(at::Tensor, scale, {})               \
  X(std::optional<at::Tensor>, zero_point, std::nullopt)
TORCHSPEED_OP_ARGS(QuantizeInt8Args, "quantize_int8", at::Tensor, TORCHSPEED_QUANTIZE_INT8_ARGS);

#define TORCHSPEED_DEQUANTIZE_INT8_ARGS(X) \
  X(at::Tensor, q, {})                     \
  X(at::Tensor, scale, {})                 \
  X(std::optional<at::Tensor>, zero_point, std::nullopt)
TORCHSPEED_OP_ARGS(DequantizeInt8Args, "dequantize_int8", at::Tensor,
                   TORCHSPEED_DEQUANTIZE_INT8_ARGS);

#define TORCHSPEED_INT8_PACK_WEIGHT_ARGS(X) X(at::Tensor, w, {})
TORCHSPEED_OP_ARGS(Int8PackWeightArgs, "int8_pack_weight", at::Tensor,
                   TORCHSPEED_INT8_PACK_WEIGHT_ARGS);

#define TORCHSPEED_INT8_LINEAR_ARGS(X)             \
  X(at::Tensor, x, {})                             \
  X(at::Tensor, packed_w, {})                      \
  X(at::Tensor, w_scale, {})                       \
  X(std::optional<at::Tensor>, bias, std::nullopt) \
  X(bool, relu, false)
TORCHSPEED_OP_ARGS(Int8LinearArgs, "int8_linear", at::Tensor, TORCHSPEED_INT8_LINEAR_ARGS);

/// fake_quantize's outputs: (y in x's dtype, mask bool: where the straight-through gradient
/// passes).
using FakeQuantizeResult = std::tuple<at::Tensor, at::Tensor>;

#define TORCHSPEED_FAKE_QUANTIZE_ARGS(X)                 \
  X(at::Tensor, x, {})                                   \
  X(at::Tensor, scale, {})                               \
  X(std::optional<at::Tensor>, zero_point, std::nullopt) \
  X(int64_t, quant_min, -128)                            \
  X(int64_t, quant_max, 127)
TORCHSPEED_OP_ARGS(FakeQuantizeArgs, "fake_quantize", FakeQuantizeResult,
                   TORCHSPEED_FAKE_QUANTIZE_ARGS);

#define TORCHSPEED_FAKE_QUANTIZE_BACKWARD_ARGS(X) \
  X(at::Tensor, grad, {})                         \
  X(at::Tensor, mask, {})
TORCHSPEED_OP_ARGS(FakeQuantizeBackwardArgs, "fake_quantize_backward", at::Tensor,
                   TORCHSPEED_FAKE_QUANTIZE_BACKWARD_ARGS);

/// q = clamp(round_half_even(x * (1 / scale)) + zero_point, -128, 127), int8, in fp32 arithmetic.
TORCHSPEED_API at::Tensor quantize_int8(const at::Tensor& x, const at::Tensor& scale,
                                        const std::optional<at::Tensor>& zero_point = std::nullopt);
/// (q - zero_point) * scale, float32.
TORCHSPEED_API at::Tensor dequantize_int8(
    const at::Tensor& q, const at::Tensor& scale,
    const std::optional<at::Tensor>& zero_point = std::nullopt);

/// The int8 Linear's CPU kernel path now ("scalar", "avx2", "avx512", "avx512_vnni", "amx"),
/// honouring TORCHSPEED_CPU_ISA.
TORCHSPEED_API std::string cpu_int8_path();
/// Why this process cannot run the amx path ("" when it can): the CPU, the build, or the OS
/// refusing the AMX tile permission (then the best path is avx512_vnni).
TORCHSPEED_API std::string cpu_amx_status();

/// The int8 Linear's weight (int8 [N, K] in [-127, 127], per output channel) packed once into the
/// CPU kernels' layout for the current int8 path (uint8, with a header naming path, N and K).
/// CPU only: on CUDA, int8_linear takes the plain contiguous [N, K] weight.
TORCHSPEED_API at::Tensor int8_pack_weight(const at::Tensor& w);
/// out[..., n] = act(float(sum_k q[m, k] * w[n, k]) * (x_scale[m] * w_scale[n]) + bias[n]) with
/// x's rows quantized per row (x_scale = absmax / 127), exact int32 sums, fp32 epilogue; ReLU when
/// `relu`; out in x's dtype (float32, bfloat16 or float16). packed_w: int8_pack_weight's result on
/// CPU, the int8 [N, K] weight on CUDA. w_scale: float32 [N]; bias: float32 [N] or none.
TORCHSPEED_API at::Tensor int8_linear(const at::Tensor& x, const at::Tensor& packed_w,
                                      const at::Tensor& w_scale,
                                      const std::optional<at::Tensor>& bias = std::nullopt,
                                      bool relu = false);
/// Fake quantization (quantize then dequantize, in fp32, result in x's dtype):
///   v = round_half_even(x * (1 / scale)) + zero_point
///   y = (clamp(v, quant_min, quant_max) - zero_point) * scale,  mask = quant_min <= v <= quant_max
/// torch.fake_quantize_per_{tensor,channel}_affine's formula (and its cachemask) bit for bit; the
/// straight-through gradient is grad_y * mask (registered in Python, torchspeed.quant).
TORCHSPEED_API FakeQuantizeResult
fake_quantize(const at::Tensor& x, const at::Tensor& scale,
              const std::optional<at::Tensor>& zero_point = std::nullopt, int64_t quant_min = -128,
              int64_t quant_max = 127);
/// fake_quantize's straight-through gradient: grad * mask (as float 0 / 1), in grad's dtype.
TORCHSPEED_API at::Tensor fake_quantize_backward(const at::Tensor& grad, const at::Tensor& mask);

}  // namespace torchspeed
