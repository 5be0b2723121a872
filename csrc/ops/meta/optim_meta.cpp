// Meta implementations of the fused optimizer steps: validate, change nothing (for FakeTensor
// tracing and torch.library.opcheck); also registered for the sparse keys (see checks.h).
#include <ATen/ATen.h>
#include <torch/library.h>

#include "ops/optim_checks.h"

namespace torchspeed::ops {
namespace {

template <class Args>
void fused_step_meta(const Args& args) {
  validate(args);
}

LowbitCodesTuple lowbit_encode_meta(const LowbitEncodeArgs& a) {
  validate(a);
  const c10::SymInt blocks = (a.values.sym_numel() + a.state_block - 1) / a.state_block;
  return {at::empty_like(a.values, a.values.options().dtype(a.is_signed ? at::kChar : at::kByte)),
          at::empty_symint({blocks}, a.values.options())};
}

at::Tensor lowbit_decode_meta(const LowbitDecodeArgs& a) {
  validate(a);
  return at::empty_like(a.codes, a.codes.options().dtype(at::kFloat));
}

}  // namespace

void register_optim_validators(torch::Library& m) {
  TORCHSPEED_OP_IMPL(m, AdamStepArgs, fused_step_meta<AdamStepArgs>);
  TORCHSPEED_OP_IMPL(m, AdamLowbitStepArgs, fused_step_meta<AdamLowbitStepArgs>);
  TORCHSPEED_OP_IMPL(m, LowbitEncodeArgs, lowbit_encode_meta);
  TORCHSPEED_OP_IMPL(m, LowbitDecodeArgs, lowbit_decode_meta);
  TORCHSPEED_OP_IMPL(m, SgdStepArgs, fused_step_meta<SgdStepArgs>);
  TORCHSPEED_OP_IMPL(m, SgdLowbitStepArgs, fused_step_meta<SgdLowbitStepArgs>);
  TORCHSPEED_OP_IMPL(m, LionStepArgs, fused_step_meta<LionStepArgs>);
  TORCHSPEED_OP_IMPL(m, LionLowbitStepArgs, fused_step_meta<LionLowbitStepArgs>);
  TORCHSPEED_OP_IMPL(m, LambStepArgs, fused_step_meta<LambStepArgs>);
}

TORCH_LIBRARY_IMPL(torchspeed, Meta, m) { register_optim_validators(m); }
TORCHSPEED_REGISTER_FOR_SPARSE_KEYS(register_optim_validators)

}  // namespace torchspeed::ops
