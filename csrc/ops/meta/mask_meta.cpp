// Meta (shape-only) implementation of the packed-mask ops: validates and returns an empty result
// of the right shape and dtype (apply_mask_ writes nothing). Also registered for the sparse keys.
#include <ATen/ATen.h>
#include <torch/library.h>

#include "ops/mask_checks.h"

namespace torchspeed::ops {
namespace {

at::Tensor pack_mask_meta(const PackMaskArgs& a) {
  validate(a);
  return empty_packed_like(a.mask);
}

at::Tensor unpack_mask_meta(const UnpackMaskArgs& a) {
  validate(a);
  return at::empty(a.shape, a.packed.options().dtype(at::kBool));
}

void apply_mask_meta(const ApplyMaskArgs& a) { validate(a); }

}  // namespace

void register_mask_validators(torch::Library& m) {
  TORCHSPEED_OP_IMPL(m, PackMaskArgs, pack_mask_meta);
  TORCHSPEED_OP_IMPL(m, UnpackMaskArgs, unpack_mask_meta);
  TORCHSPEED_OP_IMPL(m, ApplyMaskArgs, apply_mask_meta);
}

TORCH_LIBRARY_IMPL(torchspeed, Meta, m) { register_mask_validators(m); }
TORCHSPEED_REGISTER_FOR_SPARSE_KEYS(register_mask_validators)

}  // namespace torchspeed::ops
