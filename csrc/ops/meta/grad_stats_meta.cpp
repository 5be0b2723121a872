// Meta (shape-only) implementation of grad_stats ops, for torch.compile and FakeTensor. The same
// validating function is registered for the sparse keys, where it always raises the layout error
// (the dispatcher would otherwise answer with a generic "no kernel for SparseCPU").
#include <ATen/ATen.h>
#include <torch/library.h>

#include "ops/checks.h"
#include "torchspeed/ops/optim.h"

namespace torchspeed::ops {
namespace {

GradStatsTuple grad_stats_shapes(const char* op, at::TensorList tensors,
                                 const at::Tensor* inv_scale, bool per_tensor) {
  const at::Device device = check_float_tensor_list(op, "tensors", tensors);
  if (inv_scale) check_scalar_tensor(op, "inv_scale", *inv_scale, device);
  const auto opts = at::TensorOptions().dtype(at::kFloat).device(device);
  return {at::empty({}, opts),
          at::empty({per_tensor ? static_cast<int64_t>(tensors.size()) : 0}, opts),
          at::empty({}, opts)};
}

GradStatsTuple grad_stats_meta(const GradStatsArgs& a) {
  return grad_stats_shapes(GradStatsArgs::kName, a.tensors, nullptr, a.per_tensor);
}

GradStatsTuple grad_stats_unscale_meta(const GradStatsUnscaleArgs& a) {
  return grad_stats_shapes(GradStatsUnscaleArgs::kName, a.tensors, &a.inv_scale, a.per_tensor);
}

}  // namespace

void register_grad_stats_validators(torch::Library& m) {
  TORCHSPEED_OP_IMPL(m, GradStatsArgs, grad_stats_meta);
  TORCHSPEED_OP_IMPL(m, GradStatsUnscaleArgs, grad_stats_unscale_meta);
}

TORCH_LIBRARY_IMPL(torchspeed, Meta, m) { register_grad_stats_validators(m); }
TORCHSPEED_REGISTER_FOR_SPARSE_KEYS(register_grad_stats_validators)

}  // namespace torchspeed::ops
