// Meta (shape-only) implementation of torchspeed::scale_cast_, for torch.compile and FakeTensor:
// validates and writes nothing. Also registered for the sparse keys (the op's own layout error).
#include <ATen/ATen.h>
#include <torch/library.h>

#include "ops/dist_checks.h"

namespace torchspeed::ops {
namespace {

void scale_cast_meta(const ScaleCastArgs& a) { validate(a); }

}  // namespace

void register_dist_validators(torch::Library& m) {
  TORCHSPEED_OP_IMPL(m, ScaleCastArgs, scale_cast_meta);
}

TORCH_LIBRARY_IMPL(torchspeed, Meta, m) { register_dist_validators(m); }
TORCHSPEED_REGISTER_FOR_SPARSE_KEYS(register_dist_validators)

}  // namespace torchspeed::ops
