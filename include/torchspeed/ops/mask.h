// The packed-mask ops, for C++ callers: pack, unpack and apply a bit-packed mask (schemas and
// semantics in csrc/ops/mask.cpp). Built with the optimizer area, whose fused steps read the same
// format; torchspeed::prune selects masks over it (<torchspeed/ops/prune.h>). They call through
// the dispatcher (CPU, CUDA or Meta).
//
//   at::Tensor bits = torchspeed::pack_mask(keep);             // keep: bool, any shape
//   torchspeed::apply_mask_(w, bits);                          // w is zero where a bit is 0
//   at::Tensor again = torchspeed::unpack_mask(bits, w.sizes());
//
// A packed mask is uint8 [ceil(numel / 8)]: bit j (least significant first) of byte b is element
// 8 * b + j of the tensor in memory order; 1 keeps the element, 0 prunes it. It is 1/32 of the
// bytes of a float32 weight. The fused optimizers take the same format (their `masks` lists).
#pragma once

#include <ATen/core/Tensor.h>

#include "torchspeed/export.h"
#include "torchspeed/ops/args.h"

namespace torchspeed {

#define TORCHSPEED_PACK_MASK_ARGS(X) X(at::Tensor, mask, {})
TORCHSPEED_OP_ARGS(PackMaskArgs, "pack_mask", at::Tensor, TORCHSPEED_PACK_MASK_ARGS);

#define TORCHSPEED_UNPACK_MASK_ARGS(X) \
  X(at::Tensor, packed, {})            \
  X(at::IntArrayRef, shape, {})
TORCHSPEED_OP_ARGS(UnpackMaskArgs, "unpack_mask", at::Tensor, TORCHSPEED_UNPACK_MASK_ARGS);

#define TORCHSPEED_APPLY_MASK_ARGS(X) \
  X(at::Tensor, w, {})                \
  X(at::Tensor, packed, {})
TORCHSPEED_OP_ARGS(ApplyMaskArgs, "apply_mask_", void, TORCHSPEED_APPLY_MASK_ARGS);

/// Bytes of a packed mask for `numel` elements: ceil(numel / 8).
inline int64_t packed_mask_bytes(int64_t numel) { return (numel + 7) / 8; }

/// A bool tensor (any shape, contiguous) packed into uint8 [ceil(numel / 8)].
TORCHSPEED_API at::Tensor pack_mask(const at::Tensor& mask);
/// The inverse: a bool tensor of `shape` (whose numel the packed mask covers).
TORCHSPEED_API at::Tensor unpack_mask(const at::Tensor& packed, at::IntArrayRef shape);
/// In place: w[i] = 0 where bit i of `packed` is 0 (bit-exact: kept elements are not touched).
TORCHSPEED_API void apply_mask_(const at::Tensor& w, const at::Tensor& packed);

}  // namespace torchspeed
