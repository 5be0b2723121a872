// Library-level C++ API: version, CPU ISA queries, the link anchor, and the op entry points that
// call through the dispatcher.
#include <ATen/core/dispatch/Dispatcher.h>

#include "kernels/cpu/dispatch.h"
#include "ops/checks.h"
#include "torchspeed/torchspeed.h"
#include "torchspeed/version.h"

namespace torchspeed {

const char* version() { return TORCHSPEED_VERSION_STRING; }

std::string cpu_isa() {
  return ops::rethrow_as_torch_error("cpu_isa",
                                     [] { return std::string(kernels::cpu::cpu_kernels().name); });
}

std::string cpu_isa_detected() { return kernels::cpu::isa_name(kernels::cpu::detected_isa()); }

std::string cpu_isas_compiled() {
  std::string out;
  for (auto isa : kernels::cpu::compiled_isas()) {
    if (!out.empty()) out += ",";
    out += kernels::cpu::isa_name(isa);
  }
  return out;
}

namespace detail {
int link_anchor() { return 1; }
}  // namespace detail

namespace {
using StatsTuple = std::tuple<at::Tensor, at::Tensor, at::Tensor>;
GradStats to_stats(StatsTuple t) {
  return {std::move(std::get<0>(t)), std::move(std::get<1>(t)), std::move(std::get<2>(t))};
}

// An empty list has no tensor for the dispatcher to pick a kernel by: answer here, as
// torch.nn.utils.clip_grad_norm_([]) does (norm 0, nothing non-finite), on `device`.
GradStats empty_stats(const at::Device& device) {
  const auto opts = at::TensorOptions().dtype(at::kFloat).device(device);
  return {at::zeros({}, opts), at::empty({0}, opts), at::zeros({}, opts)};
}
}  // namespace

GradStats grad_stats(at::TensorList tensors, bool per_tensor) {
  static auto op = c10::Dispatcher::singleton()
                       .findSchemaOrThrow("torchspeed::grad_stats", "")
                       .typed<StatsTuple(at::TensorList, bool)>();
  if (tensors.empty()) return empty_stats(at::kCPU);
  return to_stats(op.call(tensors, per_tensor));
}

GradStats grad_stats_unscale_(at::TensorList tensors, const at::Tensor& inv_scale,
                              bool per_tensor) {
  static auto op = c10::Dispatcher::singleton()
                       .findSchemaOrThrow("torchspeed::grad_stats_unscale_", "")
                       .typed<StatsTuple(at::TensorList, const at::Tensor&, bool)>();
  if (tensors.empty()) {
    ops::check_scalar_tensor("grad_stats_unscale_", "inv_scale", inv_scale, inv_scale.device());
    return empty_stats(inv_scale.device());
  }
  return to_stats(op.call(tensors, inv_scale, per_tensor));
}

}  // namespace torchspeed
