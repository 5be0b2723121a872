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
