// The prune area's tensor ops, for C++ callers: N:M and magnitude mask selection (schemas and
// semantics in csrc/ops/prune.cpp), over the packed-mask format of <torchspeed/ops/mask.h> (pack,
// unpack, apply: built with the optimizers, which read it). They call through the dispatcher.
//
//   at::Tensor w = ...;                                        // [out, in] float32, contiguous
//   at::Tensor bits = torchspeed::nm_mask(w, 2, 4);            // 2:4 along the last dim
//   torchspeed::apply_mask_(w, bits);                          // w is zero where a bit is 0
//   at::Tensor keep = torchspeed::unpack_mask(bits, w.sizes());  // bool, w's shape
//
// A packed mask is uint8 [ceil(numel / 8)]: bit j (least significant first) of byte b is element
// 8 * b + j of the tensor in memory order; 1 keeps the element, 0 prunes it. It is 1/32 of the
// bytes of a float32 weight. The fused optimizers take the same format (their `masks` lists).
#pragma once

#include <ATen/core/Tensor.h>

#include "torchspeed/export.h"
#include "torchspeed/ops/args.h"
#include "torchspeed/ops/mask.h"

namespace torchspeed {

#define TORCHSPEED_NM_MASK_ARGS(X) \
  X(at::Tensor, w, {})             \
  X(int64_t, n, 2)                 \
  X(int64_t, m, 4)
TORCHSPEED_OP_ARGS(NmMaskArgs, "nm_mask", at::Tensor, TORCHSPEED_NM_MASK_ARGS);

#define TORCHSPEED_MAGNITUDE_MASK_ARGS(X) \
  X(at::Tensor, w, {})                    \
  X(int64_t, amount, 0)
TORCHSPEED_OP_ARGS(MagnitudeMaskArgs, "magnitude_mask", at::Tensor, TORCHSPEED_MAGNITUDE_MASK_ARGS);

/// Keeps the n largest |w| of every m consecutive elements of the last dim (ties: lower index).
TORCHSPEED_API at::Tensor nm_mask(const at::Tensor& w, int64_t n = 2, int64_t m = 4);
/// Prunes exactly `amount` elements, the smallest |w| (ties: the higher index is pruned first).
TORCHSPEED_API at::Tensor magnitude_mask(const at::Tensor& w, int64_t amount);

}  // namespace torchspeed
