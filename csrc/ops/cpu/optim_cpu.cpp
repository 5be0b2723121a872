// CPU implementation of the fused optimizer steps (adam_step_, sgd_step_, lion_step_,
// lamb_step_): one driver takes the validated FusedStep, reads the AMP/clip/found_inf scalars,
// increments the step counts, derives each tensor's scalars, then runs the ISA kernel over chunks
// of all params in one parallel region.
#include <ATen/ATen.h>
#include <torch/library.h>

#include <cmath>
#include <vector>

#include "kernels/common/step_scalars.h"
#include "kernels/cpu/dispatch.h"
#include "ops/cpu/chunking.h"
#include "ops/fused_step.h"
#include "ops/optim_checks.h"

namespace torchspeed::ops {
namespace {

using kernels::OptimAlgo;
using kernels::StepScalars;
using kernels::cpu::OptimFn;

float read_scalar(const OptTensor* t, float fallback) {
  return t->has_value() ? (*t)->item<float>() : fallback;
}

OptimFn kernel_for(const kernels::cpu::OptimKernels& k, OptimAlgo algo) {
  switch (algo) {
    case OptimAlgo::kAdam:
      return k.adam;
    case OptimAlgo::kSgd:
      return k.sgd;
    case OptimAlgo::kLion:
      return k.lion;
    case OptimAlgo::kLamb:
      return k.lamb_phase1;
  }
  return nullptr;
}

void run_fused_step(const FusedStep& a) {
  if (a.writes_overlap()) {
    // One param at a time, in list order. SGD's first_step holds for every occurrence of a param
    // listed twice: torch.optim.SGD also reads all buffers before updating.
    for (size_t i = 0; i < a.params.size(); ++i) run_fused_step(a.element(i));
    return;
  }
  const auto& table = *rethrow_as_torch_error(a.op, [] { return &kernels::cpu::cpu_kernels(); });
  // AMP: a step whose grads hold inf/NaN changes nothing, not even the step counts.
  if (read_scalar(a.found_inf, 0.f) != 0.f) return;

  const double lr = a.lr_tensor->has_value() ? (*a.lr_tensor)->item<double>() : a.hyper.lr;
  const float scale = read_scalar(a.grad_scale, 1.f);
  const float clip = read_scalar(a.clip_coef, 1.f);
  const size_t n = a.params.size();
  std::vector<StepScalars> scalars(n);
  // bf16 moments: the stochastic rounding's seed, from the step count and the param's position.
  std::vector<uint32_t> salts(n, 0);
  for (size_t i = 0; i < n; ++i) {
    float step = 0.f;
    if (!a.steps.empty()) {
      // Validated one-element float32 CPU tensors: updated through the pointer, as torch's
      // `step += 1` does in float32, without two dispatcher calls per param.
      float* step_ptr = a.steps[i].data_ptr<float>();
      step = (*step_ptr += 1.f);
    }
    scalars[i] = kernels::step_scalars(a.hyper, lr, scale, clip, !a.steps.empty(), step);
    salts[i] = static_cast<uint32_t>(step) * 0x9E3779B9u + static_cast<uint32_t>(i) * 0x7FEB352Du;
  }

  const std::vector<at::Tensor> grads = a.grads_like_params();
  const std::vector<at::Tensor> params(a.params.begin(), a.params.end());
  const std::vector<Chunk> chunks = make_chunks(params);

  const OptimFn fn = kernel_for(table.optim, a.algo);
  if (a.algo != OptimAlgo::kLamb) {
    parallel_over_chunks(chunks, [&](const Chunk& c, size_t) {
      kernels::OptimTensor t = a.tensor(c.tensor, grads[c.tensor], c.begin, c.length);
      t.sr_salt = salts[c.tensor];
      fn(t, a.hyper, scalars[c.tensor], nullptr, nullptr);
    });
    return;
  }
  // LAMB: phase 1 updates the moments and returns ||p||^2 and ||u||^2 per chunk; the per-tensor
  // trust ratio then scales phase 2.
  std::vector<double> p_sq(chunks.size()), u_sq(chunks.size());
  parallel_over_chunks(chunks, [&](const Chunk& c, size_t k) {
    fn(a.tensor(c.tensor, grads[c.tensor], c.begin, c.length), a.hyper, scalars[c.tensor], &p_sq[k],
       &u_sq[k]);
  });
  std::vector<double> p_norm(n, 0.0), u_norm(n, 0.0);
  for (size_t k = 0; k < chunks.size(); ++k) {
    p_norm[chunks[k].tensor] += p_sq[k];
    u_norm[chunks[k].tensor] += u_sq[k];
  }
  for (size_t i = 0; i < n; ++i) {
    const float step = a.steps[i].data_ptr<float>()[0];
    scalars[i] =
        kernels::step_scalars(a.hyper, lr, scale, clip, true, step, true, p_norm[i], u_norm[i]);
  }
  parallel_over_chunks(chunks, [&](const Chunk& c, size_t) {
    table.optim.lamb_phase2(a.tensor(c.tensor, grads[c.tensor], c.begin, c.length), a.hyper,
                            scalars[c.tensor], nullptr, nullptr);
  });
}

template <class Args>
void fused_step_cpu(const Args& args) {
  run_fused_step(fused_step(args));
}

}  // namespace

TORCH_LIBRARY_IMPL(torchspeed, CPU, m) {
  TORCHSPEED_OP_IMPL(m, AdamStepArgs, fused_step_cpu<AdamStepArgs>);
  TORCHSPEED_OP_IMPL(m, AdamLowbitStepArgs, fused_step_cpu<AdamLowbitStepArgs>);
  TORCHSPEED_OP_IMPL(m, SgdStepArgs, fused_step_cpu<SgdStepArgs>);
  TORCHSPEED_OP_IMPL(m, LionStepArgs, fused_step_cpu<LionStepArgs>);
  TORCHSPEED_OP_IMPL(m, LambStepArgs, fused_step_cpu<LambStepArgs>);
}

}  // namespace torchspeed::ops
