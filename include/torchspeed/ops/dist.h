// The dist area's tensor op, for C++ callers: scale_cast_, the reducer's one pass over a gradient
// bucket (see csrc/ops/dist.cpp for the schema). Calls through the dispatcher (CPU, CUDA or Meta).
//
//   at::Tensor grads = ..., wire = at::empty_like(grads, at::kBFloat16);
//   torchspeed::scale_cast_(wire, grads, 1.0 / world_size);   // divide and compress in one pass
//   torchspeed::scale_cast_(grads, wire);                       // widen back after the all-reduce
#pragma once

#include <ATen/core/Tensor.h>

#include "torchspeed/export.h"
#include "torchspeed/ops/args.h"

namespace torchspeed {

#define TORCHSPEED_SCALE_CAST_ARGS(X) \
  X(at::Tensor, out, {})              \
  X(at::Tensor, src, {})              \
  X(double, scale, 1.0)
TORCHSPEED_OP_ARGS(ScaleCastArgs, "scale_cast_", void, TORCHSPEED_SCALE_CAST_ARGS);

/// out = src * scale, rounded once into out's dtype. Both contiguous, same numel and device;
/// dtypes fp32/bf16/fp16 in any combination, or fp64 with fp64; out may be src itself.
TORCHSPEED_API void scale_cast_(const at::Tensor& out, const at::Tensor& src, double scale = 1.0);

}  // namespace torchspeed
