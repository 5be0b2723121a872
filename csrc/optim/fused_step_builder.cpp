// The step builder's non-template parts (fused_step_builder.h): the param and grad checks, the
// clipping coefficient, the master/no-master buckets and the commit of staged state.
#include "optim/fused_step_builder.h"

namespace torchspeed::optim::detail {

// Every param the optimizer holds must be a dense float32/bfloat16/float16 tensor; checked at
// construction so a bad model fails early with the param's position.
void check_params(const char* name, const Optimizer& self) {
  const auto& groups = self.param_groups();
  for (size_t g = 0; g < groups.size(); ++g) {
    const auto& params = groups[g].params();
    for (size_t i = 0; i < params.size(); ++i) {
      const at::Tensor& p = params[i];
      TORCH_CHECK(p.defined() && p.layout() == at::kStrided && is_supported_dtype(p.scalar_type()),
                  "torchspeed.optim.", name, ": param_groups[", g, "].params[", i,
                  "] must be a dense float32, bfloat16 or float16 tensor, got ",
                  p.defined() ? c10::str(p.scalar_type(), " ", p.layout()) : std::string("None"));
    }
  }
}

// Validates every param that has a grad before anything (state included) is created or changed,
// so a bad step throws and leaves the optimizer and the model as they were.
void check_step_inputs(const char* name, const Optimizer& self) {
  const auto& groups = self.param_groups();
  for (size_t g = 0; g < groups.size(); ++g) {
    const auto& params = groups[g].params();
    for (size_t i = 0; i < params.size(); ++i) {
      const at::Tensor& p = params[i];
      const at::Tensor& grad = p.grad();
      if (!grad.defined()) continue;
      const auto where = c10::str("param_groups[", g, "].params[", i, "]");
      TORCH_CHECK(p.layout() == at::kStrided && is_supported_dtype(p.scalar_type()),
                  "torchspeed.optim.", name, ": ", where,
                  " must be a dense float32, bfloat16 or float16 tensor, got ", p.scalar_type(),
                  " ", p.layout());
      TORCH_CHECK(p.is_non_overlapping_and_dense(), "torchspeed.optim.", name, ": ", where,
                  " must be contiguous in some memory format (dense and non-overlapping, e.g. "
                  "channels_last), got sizes ",
                  p.sizes(), " and strides ", p.strides());
      TORCH_CHECK(grad.layout() == at::kStrided, "torchspeed.optim.", name, ": the grad of ", where,
                  " must be dense; sparse gradients are not supported, got ", grad.layout());
      TORCH_CHECK(is_supported_dtype(grad.scalar_type()), "torchspeed.optim.", name,
                  ": the grad of ", where, " must be float32, bfloat16 or float16, got ",
                  grad.scalar_type());
      TORCH_CHECK(grad.device() == p.device() && grad.sizes() == p.sizes(), "torchspeed.optim.",
                  name, ": the grad of ", where, " must have the param's shape ", p.sizes(),
                  " and device ", p.device(), ", got ", grad.sizes(), " on ", grad.device());
    }
  }
}

// torch.nn.utils.clip_grad_norm_(group's params, max_grad_norm)'s coefficient, computed on the
// device by grad_stats over the group's own grads (divided by the AMP scale: the norm of the
// unscaled grads); the kernels multiply the grads by it.
OptTensor clip_coef(const std::optional<double>& max_grad_norm,
                    const torch::optim::OptimizerParamGroup& group, const at::Tensor& grad_scale) {
  if (!max_grad_norm) return std::nullopt;
  std::vector<at::Tensor> grads;
  for (const auto& p : group.params()) {
    if (p.grad().defined()) grads.push_back(p.grad());
  }
  if (grads.empty()) return std::nullopt;
  at::Tensor norm = torchspeed::grad_stats(grads).total_norm;
  if (grad_scale.defined()) norm = norm / grad_scale.to(norm.device());
  return at::clamp_max(*max_grad_norm / (norm + 1e-6), 1.0).reshape({1});
}

// Splits the params with a grad into (wants a master) / (does not) buckets, non-empty only.
std::vector<std::vector<at::Tensor>> master_buckets(const std::vector<at::Tensor>& params,
                                                    const std::optional<bool>& master_weights) {
  std::vector<at::Tensor> with, without;
  for (const auto& p : params) {
    if (!p.grad().defined()) continue;
    (wants_master(master_weights, p) ? with : without).push_back(p);
  }
  std::vector<std::vector<at::Tensor>> out;
  for (auto* b : {&with, &without}) {
    if (!b->empty()) out.push_back(std::move(*b));
  }
  return out;
}

void commit(Optimizer& self, Staged& staged) {
  for (auto& [key, state] : staged) self.state()[key] = std::move(state);
  staged.clear();
}

OptTensor as_scalar(const at::Tensor& t, const at::Device& device) {
  if (!t.defined()) return std::nullopt;
  return t.detach().to(device, at::kFloat).reshape({1});
}

}  // namespace torchspeed::optim::detail
