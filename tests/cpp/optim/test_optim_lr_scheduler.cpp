// torchspeed::optim::WarmupLR and the schedule functions from C++: the closed form against a
// double reference written here, a torch::optim optimizer and a fused optimizer's device-side
// lr_tensor driven step for step, resume, and the validator's messages.
#include <torch/torch.h>

#include <cmath>
#include <string>

#include "catch_shim.h"
#include "torchspeed/optim.h"
#include "torchspeed/optim/lr_scheduler.h"

namespace tso = torchspeed::optim;

namespace {

double reference(int64_t t, double base, int64_t w, int64_t total, double start, double eta) {
  if (t < w) return base * (start + (1 - start) * static_cast<double>(t) / static_cast<double>(w));
  const double u = std::min(1.0, static_cast<double>(t - w) / static_cast<double>(total - w));
  return eta + (base - eta) * (1 + std::cos(M_PI * u)) / 2;
}

std::string message(const tso::WarmupLROptions& o) {
  try {
    tso::validate(o);
  } catch (const c10::Error& e) {
    return e.what_without_backtrace();
  }
  return "no error";
}

}  // namespace

TEST_CASE("WarmupLR drives a torch::optim optimizer along linear warmup + cosine") {
  auto p = torch::zeros({3}, torch::requires_grad());
  torch::optim::SGD opt({p}, torch::optim::SGDOptions(0.2));
  const auto o = tso::WarmupLROptions(4, 20).start_factor(0.1).eta_min(0.01);
  tso::WarmupLR sched(opt, o);
  for (int64_t t = 0; t <= 24; ++t) {
    INFO("t = " << t);
    const double want = reference(t, 0.2, 4, 20, 0.1, 0.01);
    CHECK(opt.param_groups()[0].options().get_lr() == Approx(want).epsilon(1e-12));
    CHECK(tso::warmup_lr(t, 0.2, o) == Approx(want).epsilon(1e-12));
    sched.step();
  }
  // Resume: a new optimizer at the base lr, the scheduler made before the optimizer's state is
  // loaded (it reads the base lrs), then moved to the saved step.
  torch::optim::SGD opt2({p}, torch::optim::SGDOptions(0.2));
  tso::WarmupLR resumed(opt2, o);
  resumed.set_last_step(7);
  CHECK(opt2.param_groups()[0].options().get_lr() == Approx(reference(7, 0.2, 4, 20, 0.1, 0.01)));
  CHECK(resumed.last_step() == 7);
}

TEST_CASE("WarmupLR writes a fused optimizer's lr_tensor on the device, equal to the host value") {
  auto p = torch::ones({4}, torch::requires_grad());
  auto lr = torch::zeros({1});
  tso::AdamW opt({p}, tso::AdamWOptions(0.1).lr_tensor(lr));
  const auto o = tso::WarmupLROptions(3, 9).decay("linear").eta_min(0.001);
  tso::WarmupLR sched(opt, o);
  for (int64_t t = 0; t <= 11; ++t) {
    INFO("t = " << t);
    CHECK(lr.item<float>() == static_cast<float>(tso::warmup_lr(t, 0.1, o)));
    p.mutable_grad() = torch::ones({4});
    opt.step();
    sched.step();
  }
  // The tensor overload alone: a device step in, the same value out.
  CHECK(tso::warmup_lr(torch::full({1}, 5.0), 0.1, o).item<float>() ==
        static_cast<float>(tso::warmup_lr(5, 0.1, o)));
}

TEST_CASE("the schedule's validator and the scaling rule name the bad argument") {
  CHECK_THAT(message(tso::WarmupLROptions(5, 2)),
             Catch::Matchers::Contains("total_steps must be >= warmup_steps (5), got 2"));
  CHECK_THAT(message(tso::WarmupLROptions(1, 2).decay("step")),
             Catch::Matchers::Contains("decay must be 'cosine', 'linear' or 'constant'"));
  CHECK_THAT(message(tso::WarmupLROptions(1, 2).start_factor(1.5)),
             Catch::Matchers::Contains("start_factor must be in [0, 1]"));
  CHECK(message(tso::WarmupLROptions(0, 0)) == "no error");
  CHECK(tso::scaled_lr(0.1, 256, 512) == Approx(0.2));
  CHECK_THROWS_AS(tso::scaled_lr(0.1, 256, 512, "cube"), c10::Error);
}
