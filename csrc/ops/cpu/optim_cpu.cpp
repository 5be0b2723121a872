// CPU implementation of the fused optimizer steps (adam_step_, adam_lowbit_step_, sgd_step_,
// sgd_lowbit_step_, lion_step_, lion_lowbit_step_, lamb_step_): one driver takes the validated
// FusedStep, reads the AMP/clip/found_inf scalars, increments the step counts, derives each
// tensor's scalars, then runs the ISA kernel over chunks of all params in one parallel region.
#include <ATen/ATen.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "kernels/common/lowbit_codes.h"
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
    TORCH_CHECK(a.lamb_phase == 0, "torchspeed.", a.op,
                ": params must not share memory with phase ", a.lamb_phase,
                " (each param has its own row of norms)");
    // One param at a time, in list order. SGD's first_step holds for every occurrence of a param
    // listed twice: torch.optim.SGD also reads all buffers before updating.
    for (size_t i = 0; i < a.params.size(); ++i) run_fused_step(a.element(i));
    return;
  }
  const auto& table = *rethrow_as_torch_error(a.op, [] { return &kernels::cpu::cpu_kernels(); });
  // AMP: a step whose grads hold inf/NaN changes nothing, not even the step counts (LAMB's phase
  // 1 writes zero norms, so its caller's sums stay finite).
  if (read_scalar(a.found_inf, 0.f) != 0.f) {
    if (a.lamb_phase == 1) (*a.lamb_norms)->zero_();
    return;
  }

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
      step = a.lamb_phase == 2 ? *step_ptr : (*step_ptr += 1.f);  // phase 1 counted it
    }
    scalars[i] = kernels::step_scalars(a.hyper, lr, scale, clip, !a.steps.empty(), step);
    salts[i] = kernels::lowbit_step_salt(step, static_cast<int64_t>(i));  // as the CUDA kernel
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
  // trust ratio then scales phase 2. Split into two calls (a.lamb_phase 1 and 2), the sums go
  // out through lamb_norms and come back summed over each param's pieces.
  std::vector<double> p_norm(n, 0.0), u_norm(n, 0.0);
  double* norms = a.lamb_phase == 0 ? nullptr : (*a.lamb_norms)->data_ptr<double>();
  if (a.lamb_phase != 2) {
    std::vector<double> p_sq(chunks.size()), u_sq(chunks.size());
    parallel_over_chunks(chunks, [&](const Chunk& c, size_t k) {
      fn(a.tensor(c.tensor, grads[c.tensor], c.begin, c.length), a.hyper, scalars[c.tensor],
         &p_sq[k], &u_sq[k]);
    });
    for (size_t k = 0; k < chunks.size(); ++k) {
      p_norm[chunks[k].tensor] += p_sq[k];
      u_norm[chunks[k].tensor] += u_sq[k];
    }
    if (a.lamb_phase == 1) {
      for (size_t i = 0; i < n; ++i) {
        norms[2 * i] = p_norm[i];
        norms[2 * i + 1] = u_norm[i];
      }
      return;
    }
  } else {
    for (size_t i = 0; i < n; ++i) {
      p_norm[i] = norms[2 * i];
      u_norm[i] = norms[2 * i + 1];
    }
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

// int8 state encode / decode: the ISA kernels over ranges of whole blocks, in parallel.
template <class Fn>
void over_blocks(int64_t n, int64_t block, Fn&& fn) {
  const int64_t grain = std::max<int64_t>(kChunkElements / block, 1);
  at::parallel_for(0, (n + block - 1) / block, grain, [&](int64_t b0, int64_t b1) {
    const int64_t begin = b0 * block;
    fn(begin, std::min(n, b1 * block) - begin);
  });
}

LowbitCodesTuple lowbit_encode_cpu(const LowbitEncodeArgs& a) {
  validate(a);
  const char* op = LowbitEncodeArgs::kName;
  const auto& table = *rethrow_as_torch_error(op, [] { return &kernels::cpu::cpu_kernels(); });
  const int64_t n = a.values.numel();
  const int64_t block = a.state_block;
  at::Tensor codes =
      at::empty_like(a.values, a.values.options().dtype(a.is_signed ? at::kChar : at::kByte));
  at::Tensor absmax = at::empty({(n + block - 1) / block}, a.values.options());
  const float* x = a.values.const_data_ptr<float>();
  char* c = static_cast<char*>(codes.data_ptr());
  float* am = absmax.data_ptr<float>();
  over_blocks(n, block, [&](int64_t begin, int64_t len) {
    table.optim.lowbit_encode(x + begin, len, block, a.is_signed, c + begin, am + begin / block);
  });
  return {codes, absmax};
}

at::Tensor lowbit_decode_cpu(const LowbitDecodeArgs& a) {
  validate(a);
  const char* op = LowbitDecodeArgs::kName;
  const auto& table = *rethrow_as_torch_error(op, [] { return &kernels::cpu::cpu_kernels(); });
  const int64_t n = a.codes.numel();
  const int64_t block = a.state_block;
  const bool is_signed = a.codes.scalar_type() == at::kChar;
  at::Tensor out = at::empty_like(a.codes, a.codes.options().dtype(at::kFloat));
  const char* c = static_cast<const char*>(a.codes.const_data_ptr());
  const float* am = a.absmax.const_data_ptr<float>();
  float* o = out.data_ptr<float>();
  over_blocks(n, block, [&](int64_t begin, int64_t len) {
    table.optim.lowbit_decode(c + begin, is_signed, am + begin / block, len, block, o + begin);
  });
  return out;
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
  TORCHSPEED_OP_IMPL(m, SgdLowbitStepArgs, fused_step_cpu<SgdLowbitStepArgs>);
  TORCHSPEED_OP_IMPL(m, LionStepArgs, fused_step_cpu<LionStepArgs>);
  TORCHSPEED_OP_IMPL(m, LionLowbitStepArgs, fused_step_cpu<LionLowbitStepArgs>);
  TORCHSPEED_OP_IMPL(m, LambStepArgs, fused_step_cpu<LambStepArgs>);
  TORCHSPEED_OP_IMPL(m, LowbitEncodeArgs, lowbit_encode_cpu);
  TORCHSPEED_OP_IMPL(m, LowbitDecodeArgs, lowbit_decode_cpu);
}

}  // namespace torchspeed::ops
