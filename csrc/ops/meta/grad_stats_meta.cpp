// Meta (shape-only) implementation of grad_stats ops, for torch.compile and FakeTensor. The same
// validating function is registered for the sparse keys, where it always raises the layout error
// (the dispatcher would otherwise answer with a generic "no kernel for SparseCPU").
#include <ATen/ATen.h>
#include <torch/library.h>

#include "ops/checks.h"

namespace torchspeed::ops {
namespace {

std::tuple<at::Tensor, at::Tensor, at::Tensor> grad_stats_shapes(const char* op,
                                                                 at::TensorList tensors,
                                                                 const at::Tensor* inv_scale,
                                                                 bool per_tensor) {
  const at::Device device = check_float_tensor_list(op, "tensors", tensors);
  if (inv_scale) check_scalar_tensor(op, "inv_scale", *inv_scale, device);
  const auto opts = at::TensorOptions().dtype(at::kFloat).device(device);
  return {at::empty({}, opts),
          at::empty({per_tensor ? static_cast<int64_t>(tensors.size()) : 0}, opts),
          at::empty({}, opts)};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> grad_stats_meta(at::TensorList tensors,
                                                               bool per_tensor) {
  return grad_stats_shapes("grad_stats", tensors, nullptr, per_tensor);
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> grad_stats_unscale_meta(at::TensorList tensors,
                                                                       const at::Tensor& inv_scale,
                                                                       bool per_tensor) {
  return grad_stats_shapes("grad_stats_unscale_", tensors, &inv_scale, per_tensor);
}

}  // namespace

void register_grad_stats_validators(torch::Library& m) {
  m.impl("grad_stats", &grad_stats_meta);
  m.impl("grad_stats_unscale_", &grad_stats_unscale_meta);
}

TORCH_LIBRARY_IMPL(torchspeed, Meta, m) { register_grad_stats_validators(m); }
TORCHSPEED_REGISTER_FOR_SPARSE_KEYS(register_grad_stats_validators)

}  // namespace torchspeed::ops
