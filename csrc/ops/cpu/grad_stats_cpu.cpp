// CPU implementation of torchspeed::grad_stats and grad_stats_unscale_: splits every tensor into
// chunks, runs the ISA kernel on the chunks in one parallel region, reduces in a fixed order.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <vector>

#include "kernels/cpu/dispatch.h"
#include "ops/checks.h"
#include "ops/cpu/chunking.h"
#include "torchspeed/ops/optim.h"

namespace torchspeed::ops {
namespace {

using kernels::cpu::GradStatsPartial;

GradStatsTuple grad_stats_impl(const char* op, at::TensorList tensors, const at::Tensor* inv_scale,
                               bool per_tensor) {
  const at::Device device = check_float_tensor_list(op, "tensors", tensors);
  if (inv_scale) check_scalar_tensor(op, "inv_scale", *inv_scale, device);
  const auto& table = *rethrow_as_torch_error(op, [] { return &kernels::cpu::cpu_kernels(); });

  // Non-contiguous tensors are processed through a contiguous copy (written back if unscaled).
  std::vector<at::Tensor> work(tensors.begin(), tensors.end());
  for (auto& t : work) t = t.contiguous();
  const float scale = inv_scale ? inv_scale->item<float>() : 1.f;

  const std::vector<Chunk> chunks = make_chunks(work);
  std::vector<GradStatsPartial> partials(chunks.size());
  parallel_over_chunks(chunks, [&](const Chunk& c, size_t i) {
    const at::Tensor& t = work[c.tensor];
    char* base = static_cast<char*>(t.data_ptr()) + c.begin * t.element_size();
    table.optim.grad_stats(kernel_dtype(t.scalar_type()), base, c.length,
                           inv_scale ? &scale : nullptr, &partials[i]);
  });

  // Fixed-order reduction: the result does not depend on the thread count.
  std::vector<double> sumsq(work.size(), 0.0);
  bool nonfinite = false;
  for (size_t i = 0; i < chunks.size(); ++i) {
    sumsq[chunks[i].tensor] += partials[i].sumsq;
    nonfinite = nonfinite || partials[i].nonfinite;
  }
  double total = 0.0;
  for (double s : sumsq) total += s;

  if (inv_scale) {
    for (size_t i = 0; i < work.size(); ++i) {
      if (!work[i].is_same(tensors[i])) tensors[i].copy_(work[i]);
    }
  }
  const auto opts = at::TensorOptions().dtype(at::kFloat).device(device);
  at::Tensor per = at::empty({per_tensor ? static_cast<int64_t>(work.size()) : 0}, opts);
  if (per_tensor) {
    float* out = per.data_ptr<float>();
    for (size_t i = 0; i < work.size(); ++i) out[i] = static_cast<float>(std::sqrt(sumsq[i]));
  }
  return {at::scalar_tensor(std::sqrt(total), opts), per,
          at::scalar_tensor(nonfinite ? 1.0 : 0.0, opts)};
}

GradStatsTuple grad_stats_cpu(const GradStatsArgs& a) {
  return grad_stats_impl(GradStatsArgs::kName, a.tensors, nullptr, a.per_tensor);
}

GradStatsTuple grad_stats_unscale_cpu(const GradStatsUnscaleArgs& a) {
  return grad_stats_impl(GradStatsUnscaleArgs::kName, a.tensors, &a.inv_scale, a.per_tensor);
}

}  // namespace

TORCH_LIBRARY_IMPL(torchspeed, CPU, m) {
  TORCHSPEED_OP_IMPL(m, GradStatsArgs, grad_stats_cpu);
  TORCHSPEED_OP_IMPL(m, GradStatsUnscaleArgs, grad_stats_unscale_cpu);
}

}  // namespace torchspeed::ops
