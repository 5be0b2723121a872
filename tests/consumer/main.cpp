// Calls torchspeed::grad_stats from an app built against the installed package and checks the
// result against a float64 computation, then runs torchspeed::optim::AdamW beside
// torch::optim::AdamW under the profiler (its StepProfiler, a range, a Chrome trace); exits
// non-zero on any mismatch.
#include <torch/torch.h>
#include <torchspeed/optim.h>
#include <torchspeed/torchspeed.h>

#include <cmath>
#include <cstdio>

int main() {
  torch::manual_seed(0);
  std::vector<at::Tensor> grads = {torch::randn({1000}), torch::randn({64, 33}),
                                   torch::randn({7}).to(at::kBFloat16)};
  double ref = 0;
  for (const auto& g : grads) ref += g.to(at::kDouble).pow(2).sum().item<double>();
  ref = std::sqrt(ref);
  const auto stats = torchspeed::grad_stats(grads, /*per_tensor=*/true);
  const double got = stats.total_norm.item<double>();
  std::printf("torchspeed %s (CPU ISA %s): grad_stats norm %.6f, float64 reference %.6f\n",
              torchspeed::version(), torchspeed::cpu_isa().c_str(), got, ref);
  if (std::fabs(got - ref) > 1e-6 * ref || stats.found_inf.item<float>() != 0.f ||
      stats.per_tensor_norms.size(0) != 3) {
    std::printf("FAILED: result does not match\n");
    return 1;
  }
  grads[1][3][4] = std::numeric_limits<float>::infinity();
  if (torchspeed::grad_stats(grads).found_inf.item<float>() != 1.f) {
    std::printf("FAILED: inf not detected\n");
    return 1;
  }
  // Ten AdamW steps against LibTorch's own AdamW on the same gradients.
  auto p = torch::randn({257});
  auto p_ref = p.clone();
  p.set_requires_grad(true);
  p_ref.set_requires_grad(true);
  torchspeed::optim::AdamW opt({p}, torchspeed::optim::AdamWOptions(1e-2).weight_decay(0.1));
  torch::optim::AdamW opt_ref({p_ref}, torch::optim::AdamWOptions(1e-2).weight_decay(0.1));
  namespace tp = torchspeed::profile;
  tp::set_enabled(true);
  tp::StepProfiler prof;
  prof.start();
  for (int i = 0; i < 10; ++i) {
    const auto g = torch::randn({257});
    {
      TORCHSPEED_RANGE("consumer.grads");
      p.mutable_grad() = g.clone();
      p_ref.mutable_grad() = g.clone();
    }
    opt.step();  // reports the optimizer phase itself
    opt_ref.step();
    prof.step();
  }
  tp::set_enabled(false);
  const auto steps = prof.history();
  int64_t opt_ns = 0;
  for (const auto& s : steps) opt_ns += s.phase_ns[static_cast<int>(tp::Phase::Optimizer)];
  std::printf("profiler: %zu steps, optimizer phase %.3f ms in all (clock %s)\n", steps.size(),
              static_cast<double>(opt_ns) / 1e6, tp::clock_source());
  tp::write_chrome_trace("consumer_trace.json", &prof);
  if (steps.size() != 10 || opt_ns <= 0) {
    std::printf("FAILED: the profiler did not see the optimizer steps\n");
    return 1;
  }
  const double diff = (p - p_ref).abs().max().item<double>();
  std::printf("torchspeed::optim::AdamW vs torch::optim::AdamW after 10 steps: max |diff| %.3g\n",
              diff);
  if (!(diff <= 1e-6)) {
    std::printf("FAILED: AdamW does not match\n");
    return 1;
  }
  std::printf("consumer OK\n");
  return 0;
}
