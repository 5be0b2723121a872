// Meta (shape-only) implementation of the prune area's ops (nm_mask, magnitude_mask): validates and
// returns an empty result of the right shape and dtype (apply_mask_ writes nothing). Also
// registered for the sparse keys.
#include <ATen/ATen.h>
#include <torch/library.h>

#include "ops/prune_checks.h"

namespace torchspeed::ops {
namespace {

at::Tensor nm_mask_meta(const NmMaskArgs& a) {
  validate(a);
  return empty_packed_like(a.w);
}

at::Tensor magnitude_mask_meta(const MagnitudeMaskArgs& a) {
  validate(a);
  return empty_packed_like(a.w);
}

}  // namespace

void register_prune_validators(torch::Library& m) {
  TORCHSPEED_OP_IMPL(m, NmMaskArgs, nm_mask_meta);
  TORCHSPEED_OP_IMPL(m, MagnitudeMaskArgs, magnitude_mask_meta);
}

TORCH_LIBRARY_IMPL(torchspeed, Meta, m) { register_prune_validators(m); }
TORCHSPEED_REGISTER_FOR_SPARSE_KEYS(register_prune_validators)

}  // namespace torchspeed::ops
