// Meta implementations of the fused optimizer steps: validate, change nothing (for FakeTensor
// tracing and torch.library.opcheck); also registered for the sparse keys (see checks.h).
#include <torch/library.h>

#include "ops/optim_checks.h"

namespace torchspeed::ops {
namespace {

template <class Args>
void fused_step_meta(const Args& args) {
  validate(args);
}

}  // namespace

void register_optim_validators(torch::Library& m) {
  TORCHSPEED_OP_IMPL(m, AdamStepArgs, fused_step_meta<AdamStepArgs>);
  TORCHSPEED_OP_IMPL(m, AdamLowbitStepArgs, fused_step_meta<AdamLowbitStepArgs>);
  TORCHSPEED_OP_IMPL(m, SgdStepArgs, fused_step_meta<SgdStepArgs>);
  TORCHSPEED_OP_IMPL(m, LionStepArgs, fused_step_meta<LionStepArgs>);
  TORCHSPEED_OP_IMPL(m, LambStepArgs, fused_step_meta<LambStepArgs>);
}

TORCH_LIBRARY_IMPL(torchspeed, Meta, m) { register_optim_validators(m); }
TORCHSPEED_REGISTER_FOR_SPARSE_KEYS(register_optim_validators)

}  // namespace torchspeed::ops
