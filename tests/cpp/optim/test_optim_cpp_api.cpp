// The C++ optimizer classes (torchspeed::optim::*) against torch::optim's C++ classes, fed the
// same gradients; plus master weights, bad input and save/load.
#include <torch/torch.h>

#include <cmath>
#include <functional>
#include <sstream>
#include <string>
#include <vector>

#include "catch_shim.h"
#include "torchspeed/optim.h"

namespace {

using ParamList = std::vector<torch::Tensor>;

// A small MLP's parameters (Linear 8->16, Linear 16->4), deterministic.
ParamList make_params(at::ScalarType dtype = at::kFloat,
                      const torch::Device& device = torch::kCPU) {
  torch::manual_seed(0);
  ParamList out;
  for (auto shape : std::vector<std::vector<int64_t>>{{16, 8}, {16}, {4, 16}, {4}}) {
    out.push_back(torch::randn(shape).to(device, dtype).requires_grad_(true));
  }
  return out;
}

ParamList clone_params(const ParamList& ps, at::ScalarType dtype) {
  ParamList out;
  for (const auto& p : ps) out.push_back(p.detach().to(dtype).clone().requires_grad_(true));
  return out;
}

// The MLP's loss on a fixed batch, computed with `ps`; its grads are copied to every other set.
torch::Tensor mlp_loss(const ParamList& ps, int step) {
  torch::manual_seed(1000 + step);
  auto x = torch::randn({32, 8}, ps[0].options().requires_grad(false));
  auto y = torch::randn({32, 4}, ps[0].options().requires_grad(false));
  auto h = torch::tanh(torch::addmm(ps[1], x, ps[0].t()));
  auto out = torch::addmm(ps[3], h, ps[2].t());
  return torch::mse_loss(out, y);
}

// Runs `steps` steps of both optimizers on identical gradients (from `driver`'s loss).
void run_pair(const ParamList& driver, const std::vector<ParamList*>& others,
              const std::vector<torch::optim::Optimizer*>& opts, int steps, int first_step = 0) {
  for (int s = first_step; s < first_step + steps; ++s) {
    for (auto* o : opts) o->zero_grad();
    for (auto& p : driver) p.mutable_grad() = torch::Tensor();
    mlp_loss(driver, s).backward();
    for (auto* ps : others) {
      for (size_t i = 0; i < ps->size(); ++i) {
        (*ps)[i].mutable_grad() = driver[i].grad().detach().to((*ps)[i].scalar_type()).clone();
      }
    }
    for (auto* o : opts) o->step();
  }
}

void require_close(const ParamList& a, const ParamList& b, double rtol, double atol) {
  REQUIRE(a.size() == b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    auto x = a[i].detach().to(torch::kCPU, torch::kFloat);
    auto y = b[i].detach().to(torch::kCPU, torch::kFloat);
    INFO("param " << i << " max abs diff " << (x - y).abs().max().item<float>());
    REQUIRE(torch::allclose(x, y, rtol, atol));
  }
}

}  // namespace

TEST_CASE("torchspeed::optim::AdamW matches torch::optim::AdamW over 50 steps") {
  for (bool amsgrad : {false, true}) {
    auto ours = make_params();
    auto ref = clone_params(ours, at::kFloat);
    torchspeed::optim::AdamW opt(ours, torchspeed::optim::AdamWOptions(1e-2)
                                           .betas({0.8, 0.95})
                                           .weight_decay(0.1)
                                           .amsgrad(amsgrad));
    torch::optim::AdamW ref_opt(
        ref,
        torch::optim::AdamWOptions(1e-2).betas({0.8, 0.95}).weight_decay(0.1).amsgrad(amsgrad));
    run_pair(ours, {&ref}, {&opt, &ref_opt}, 50);
    require_close(ours, ref, 1e-6, 1e-6);
    // The comparison is meaningful: the params moved far more than the tolerance.
    REQUIRE((ours[0].detach() - make_params()[0]).abs().max().item<float>() > 0.1f);
    auto& st = static_cast<torchspeed::optim::AdamParamState&>(
        *opt.state().at(ours[0].unsafeGetTensorImpl()));
    REQUIRE(st.step().item<float>() == 50.f);
    REQUIRE(st.step().dim() == 0);
    REQUIRE(st.max_exp_avg_sq().defined() == amsgrad);
    REQUIRE_FALSE(st.master().defined());
  }
}

TEST_CASE("torchspeed::optim::Adam (L2 weight decay) matches torch::optim::Adam") {
  auto ours = make_params();
  auto ref = clone_params(ours, at::kFloat);
  torchspeed::optim::Adam opt(ours, torchspeed::optim::AdamOptions(5e-3).weight_decay(0.05));
  torch::optim::Adam ref_opt(ref, torch::optim::AdamOptions(5e-3).weight_decay(0.05));
  run_pair(ours, {&ref}, {&opt, &ref_opt}, 50);
  require_close(ours, ref, 1e-6, 1e-6);

  // decoupled_weight_decay(true) is AdamW.
  auto ours_w = make_params();
  auto ref_w = clone_params(ours_w, at::kFloat);
  torchspeed::optim::Adam opt_w(
      ours_w, torchspeed::optim::AdamOptions(5e-3).weight_decay(0.05).decoupled_weight_decay(true));
  torch::optim::AdamW ref_opt_w(ref_w, torch::optim::AdamWOptions(5e-3).weight_decay(0.05));
  run_pair(ours_w, {&ref_w}, {&opt_w, &ref_opt_w}, 50);
  require_close(ours_w, ref_w, 1e-6, 1e-6);
}

TEST_CASE("torchspeed::optim::SGD matches torch::optim::SGD (momentum, nesterov, dampening)") {
  struct Case {
    double momentum, dampening, weight_decay;
    bool nesterov;
  };
  for (const Case& c : {Case{0.0, 0.0, 0.0, false}, Case{0.9, 0.0, 1e-3, false},
                        Case{0.9, 0.0, 1e-3, true}, Case{0.5, 0.3, 0.0, false}}) {
    INFO("momentum " << c.momentum << " dampening " << c.dampening << " nesterov " << c.nesterov);
    auto ours = make_params();
    auto ref = clone_params(ours, at::kFloat);
    torchspeed::optim::SGD opt(ours, torchspeed::optim::SGDOptions(0.05)
                                         .momentum(c.momentum)
                                         .dampening(c.dampening)
                                         .weight_decay(c.weight_decay)
                                         .nesterov(c.nesterov));
    torch::optim::SGD ref_opt(ref, torch::optim::SGDOptions(0.05)
                                       .momentum(c.momentum)
                                       .dampening(c.dampening)
                                       .weight_decay(c.weight_decay)
                                       .nesterov(c.nesterov));
    run_pair(ours, {&ref}, {&opt, &ref_opt}, 50);
    require_close(ours, ref, 1e-6, 1e-6);
  }
}

TEST_CASE("a bfloat16 param is updated through an fp32 master that tracks fp32 AdamW") {
  auto ref = make_params();                      // fp32, driven by torch::optim::AdamW
  auto ours = clone_params(ref, at::kBFloat16);  // bf16 params; grads are the fp32 grads rounded
  // The reference starts from the bf16-rounded values so both begin at the same point.
  for (size_t i = 0; i < ref.size(); ++i) {
    torch::NoGradGuard g;
    ref[i].copy_(ours[i].to(at::kFloat));
  }
  torchspeed::optim::AdamW opt(ours, torchspeed::optim::AdamWOptions(1e-2).weight_decay(0.1));
  torch::optim::AdamW ref_opt(ref, torch::optim::AdamWOptions(1e-2).weight_decay(0.1));
  for (int s = 0; s < 20; ++s) {
    opt.zero_grad();
    ref_opt.zero_grad();
    mlp_loss(ref, s).backward();
    for (size_t i = 0; i < ref.size(); ++i) {
      // Both see the same (bf16-representable) gradient.
      ref[i].mutable_grad() = ref[i].grad().to(at::kBFloat16).to(at::kFloat);
      ours[i].mutable_grad() = ref[i].grad().to(at::kBFloat16);
    }
    opt.step();
    ref_opt.step();
  }
  ParamList masters;
  for (const auto& p : ours) {
    REQUIRE(p.scalar_type() == at::kBFloat16);
    auto& st =
        static_cast<torchspeed::optim::AdamParamState&>(*opt.state().at(p.unsafeGetTensorImpl()));
    REQUIRE(st.master().defined());
    REQUIRE(st.master().scalar_type() == at::kFloat);
    REQUIRE(st.exp_avg().scalar_type() == at::kFloat);
    // The param is the master rounded to bfloat16.
    REQUIRE(torch::equal(p.detach(), st.master().to(at::kBFloat16)));
    masters.push_back(st.master());
  }
  require_close(masters, ref, 1e-6, 1e-6);

  // master_weights(false) updates the bfloat16 param in place and keeps no master.
  auto plain = clone_params(ref, at::kBFloat16);
  torchspeed::optim::AdamW opt_plain(plain,
                                     torchspeed::optim::AdamWOptions(1e-2).master_weights(false));
  for (auto& p : plain) p.mutable_grad() = torch::ones_like(p);
  opt_plain.step();
  auto& st = static_cast<torchspeed::optim::AdamParamState&>(
      *opt_plain.state().at(plain[0].unsafeGetTensorImpl()));
  REQUIRE_FALSE(st.master().defined());
}

TEST_CASE("bad input raises c10::Error naming the argument, and changes nothing") {
  auto good = torch::randn({3}).requires_grad_(true);
  auto ints = torch::arange(3);  // int64
  try {
    torchspeed::optim::AdamW opt(ParamList{good, ints});
    FAIL("an integer param was accepted");
  } catch (const c10::Error& e) {
    const std::string msg = e.what();
    INFO(msg);
    REQUIRE(msg.find("torchspeed.optim.AdamW") != std::string::npos);
    REQUIRE(msg.find("params[1]") != std::string::npos);
    REQUIRE(msg.find("Long") != std::string::npos);
  }

  REQUIRE_THROWS_AS(torchspeed::optim::AdamW(ParamList{good}, torchspeed::optim::AdamWOptions(-1)),
                    c10::Error);
  REQUIRE_THROWS_AS(
      torchspeed::optim::SGD(ParamList{good}, torchspeed::optim::SGDOptions(0.1).nesterov(true)),
      c10::Error);

  // A grad with the wrong shape on the second param: the first param, which is fine, must not be
  // stepped either, and no state is created.
  auto a = torch::randn({3}).requires_grad_(true);
  auto b = torch::randn({2, 2}).requires_grad_(true);
  torchspeed::optim::AdamW opt(ParamList{a, b});
  a.mutable_grad() = torch::ones({3});
  b.mutable_grad() = torch::ones({5});
  const auto a0 = a.detach().clone(), b0 = b.detach().clone();
  try {
    opt.step();
    FAIL("a grad of the wrong shape was accepted");
  } catch (const c10::Error& e) {
    const std::string msg = e.what();
    INFO(msg);
    REQUIRE(msg.find("param_groups[0].params[1]") != std::string::npos);
    REQUIRE(msg.find("shape") != std::string::npos);
  }
  REQUIRE(torch::equal(a.detach(), a0));
  REQUIRE(torch::equal(b.detach(), b0));
  REQUIRE(opt.state().empty());
}

TEST_CASE("save/load round trip resumes training exactly") {
  auto run = [](auto make_opt) {
    auto ps = make_params();
    ps.push_back(torch::randn({5}).to(at::kBFloat16).requires_grad_(true));  // has a master
    auto opt = make_opt(ps);
    auto grads_for = [&](int s) {
      torch::manual_seed(500 + s);
      for (auto& p : ps) p.mutable_grad() = torch::randn(p.sizes()).to(p.scalar_type());
    };
    for (int s = 0; s < 5; ++s) {
      grads_for(s);
      opt.step();
    }
    std::stringstream buffer;
    {
      torch::serialize::OutputArchive archive;
      opt.save(archive);
      archive.save_to(buffer);
    }
    // A second optimizer over copies of the params, restored from the archive.
    ParamList copies;
    for (const auto& p : ps) copies.push_back(p.detach().clone().requires_grad_(true));
    auto restored = make_opt(copies);
    {
      torch::serialize::InputArchive archive;
      archive.load_from(buffer);
      restored.load(archive);
    }
    REQUIRE(restored.state().size() == opt.state().size());
    for (int s = 5; s < 10; ++s) {
      grads_for(s);
      for (size_t i = 0; i < ps.size(); ++i) copies[i].mutable_grad() = ps[i].grad().clone();
      opt.step();
      restored.step();
    }
    for (size_t i = 0; i < ps.size(); ++i)
      REQUIRE(torch::equal(ps[i].detach(), copies[i].detach()));
    REQUIRE(restored.param_groups()[0].options().get_lr() ==
            opt.param_groups()[0].options().get_lr());
  };
  SECTION("AdamW with amsgrad and max_grad_norm") {
    run([](ParamList& ps) {
      return torchspeed::optim::AdamW(
          ps, torchspeed::optim::AdamWOptions(3e-3).amsgrad(true).max_grad_norm(1.0));
    });
  }
  SECTION("SGD with nesterov momentum") {
    run([](ParamList& ps) {
      return torchspeed::optim::SGD(
          ps, torchspeed::optim::SGDOptions(0.1).momentum(0.9).nesterov(true));
    });
  }
}

TEST_CASE("max_grad_norm clips the gradient norm like clip_grad_norm_") {
  auto ours = make_params();
  auto ref = clone_params(ours, at::kFloat);
  torchspeed::optim::SGD opt(ours, torchspeed::optim::SGDOptions(0.1).max_grad_norm(0.5));
  torch::optim::SGD ref_opt(ref, torch::optim::SGDOptions(0.1));
  for (int s = 0; s < 10; ++s) {
    opt.zero_grad();
    ref_opt.zero_grad();
    torch::manual_seed(700 + s);
    for (size_t i = 0; i < ours.size(); ++i) {
      auto g = torch::randn(ours[i].sizes()) * 3;
      ours[i].mutable_grad() = g.clone();
      ref[i].mutable_grad() = g.clone();
    }
    torch::nn::utils::clip_grad_norm_(ref, 0.5);
    opt.step();
    ref_opt.step();
  }
  require_close(ours, ref, 1e-5, 1e-6);
}

TEST_CASE("AdamW on CUDA matches torch::optim::AdamW", "[cuda]") {
  if (!torch::cuda::is_available()) {
    WARN("CUDA not available: skipped");
    return;
  }
  auto ours = make_params(at::kFloat, torch::kCUDA);
  auto ref = clone_params(ours, at::kFloat);
  torchspeed::optim::AdamW opt(ours, torchspeed::optim::AdamWOptions(1e-2).weight_decay(0.1));
  torch::optim::AdamW ref_opt(ref, torch::optim::AdamWOptions(1e-2).weight_decay(0.1));
  run_pair(ours, {&ref}, {&opt, &ref_opt}, 50);
  require_close(ours, ref, 1e-5, 1e-6);
}

TEST_CASE("param groups keep their own options; a group mixes fp32 and bf16 params") {
  auto a = torch::randn({4}).requires_grad_(true);
  auto b = torch::randn({3}).to(at::kBFloat16).requires_grad_(true);  // master bucket
  auto c = torch::randn({2}).requires_grad_(true);
  std::vector<torch::optim::OptimizerParamGroup> groups;
  groups.emplace_back(ParamList{a, b});
  groups.emplace_back(ParamList{c}, std::make_unique<torchspeed::optim::AdamWOptions>(
                                        torchspeed::optim::AdamWOptions(0.5).weight_decay(0)));
  torchspeed::optim::AdamW opt(groups, torchspeed::optim::AdamWOptions(1e-3).eps(1e-7));
  const auto& g1 =
      static_cast<const torchspeed::optim::AdamWOptions&>(opt.param_groups()[1].options());
  REQUIRE(g1.lr() == 0.5);  // set by the group
  REQUIRE(g1.weight_decay() == 0);
  REQUIRE(g1.eps() == 1e-7);  // left at its default: inherited from the optimizer's defaults
  const auto c0 = c.detach().clone();
  const auto a0 = a.detach().clone();
  for (auto* p : {&a, &b, &c}) p->mutable_grad() = torch::ones_like(*p);
  opt.step();
  // Adam's first step moves each element by lr (times the sign of the grad).
  REQUIRE(torch::allclose(c.detach(), c0 - 0.5, 1e-5, 1e-5));
  REQUIRE(torch::allclose(a.detach(), a0 * (1 - 1e-3 * 1e-2) - 1e-3, 1e-5, 1e-6));
  REQUIRE(opt.state().size() == 3);
}

TEST_CASE("add_param_group after construction keeps the group's own options") {
  auto a = torch::randn({4}).requires_grad_(true);
  auto b = torch::randn({3}).requires_grad_(true);
  torchspeed::optim::AdamW opt(ParamList{a}, torchspeed::optim::AdamWOptions(1e-3).eps(1e-7));
  opt.add_param_group({ParamList{b}, std::make_unique<torchspeed::optim::AdamWOptions>(
                                         torchspeed::optim::AdamWOptions(0.5).weight_decay(0))});
  const auto& g1 =
      static_cast<const torchspeed::optim::AdamWOptions&>(opt.param_groups()[1].options());
  REQUIRE(g1.lr() == 0.5);
  REQUIRE(g1.weight_decay() == 0);
  REQUIRE(g1.eps() == 1e-7);  // inherited from the optimizer's defaults

  auto c = torch::randn({2}).requires_grad_(true);
  torchspeed::optim::SGD sgd(ParamList{a}, torchspeed::optim::SGDOptions(0.1).momentum(0.9));
  sgd.add_param_group({ParamList{c}, std::make_unique<torchspeed::optim::SGDOptions>(
                                         torchspeed::optim::SGDOptions(0.5))});
  const auto& s1 =
      static_cast<const torchspeed::optim::SGDOptions&>(sgd.param_groups()[1].options());
  REQUIRE(s1.lr() == 0.5);        // a group's lr is its own
  REQUIRE(s1.momentum() == 0.9);  // inherited
}

TEST_CASE("SGD: nesterov in a group without momentum steps like torch::optim::SGD") {
  auto a = torch::randn({5}).requires_grad_(true);
  auto b = torch::randn({5}).requires_grad_(true);
  auto ra = a.detach().clone().requires_grad_(true);
  auto rb = b.detach().clone().requires_grad_(true);
  std::vector<torch::optim::OptimizerParamGroup> ours, theirs;
  ours.emplace_back(ParamList{a});
  ours.emplace_back(ParamList{b}, std::make_unique<torchspeed::optim::SGDOptions>(
                                      torchspeed::optim::SGDOptions(0.1).nesterov(true)));
  theirs.emplace_back(ParamList{ra});
  theirs.emplace_back(ParamList{rb}, std::make_unique<torch::optim::SGDOptions>(
                                         torch::optim::SGDOptions(0.1).nesterov(true)));
  torchspeed::optim::SGD opt(ours, torchspeed::optim::SGDOptions(0.1));
  torch::optim::SGD ref(theirs, torch::optim::SGDOptions(0.1));
  for (int i = 0; i < 3; ++i) {
    for (auto* p : {&a, &b, &ra, &rb}) p->mutable_grad() = torch::ones_like(*p);
    opt.step();
    ref.step();
  }
  REQUIRE(torch::allclose(a.detach(), ra.detach()));
  REQUIRE(torch::allclose(b.detach(), rb.detach()));
}

// ---- Lion and LAMB (no torch::optim counterpart: checked against float64 references) ------------

namespace {

ParamList to_double(const ParamList& ps) {
  ParamList out;
  for (const auto& p : ps) out.push_back(p.detach().to(at::kDouble).clone());
  return out;
}

ParamList zeros_like_all(const ParamList& ps) {
  ParamList out;
  for (const auto& p : ps) out.push_back(torch::zeros_like(p));
  return out;
}

// Sets the MLP's gradient (computed at `ps`) on `ps` and returns it in float64.
ParamList mlp_grads(const ParamList& ps, int step) {
  for (auto& p : ps) p.mutable_grad() = torch::Tensor();
  mlp_loss(ps, step).backward();
  ParamList out;
  for (const auto& p : ps) out.push_back(p.grad().detach().to(at::kDouble));
  return out;
}

// One float64 Lion step: p *= 1 - lr*wd; p -= lr * sign(lerp(m, g, 1 - b1)); m = lerp(m, g, 1 -
// b2).
void lion_reference_step(ParamList& p, ParamList& m, const ParamList& grads, double lr, double b1,
                         double b2, double wd, bool maximize) {
  for (size_t i = 0; i < p.size(); ++i) {
    const auto g = maximize ? -grads[i] : grads[i];
    p[i].mul_(1 - lr * wd);
    p[i].sub_(lr * torch::sign(m[i] + (1 - b1) * (g - m[i])));
    m[i].add_((1 - b2) * (g - m[i]));
  }
}

// One float64 LAMB step with bias correction and the per-tensor trust ratio ||p|| / ||u||.
void lamb_reference_step(ParamList& p, ParamList& m, ParamList& v, const ParamList& grads, int step,
                         double lr, double b1, double b2, double eps, double wd) {
  const double bc1 = 1 - std::pow(b1, step), bc2 = 1 - std::pow(b2, step);
  for (size_t i = 0; i < p.size(); ++i) {
    const auto& g = grads[i];
    m[i].add_((1 - b1) * (g - m[i]));
    v[i].mul_(b2).add_((1 - b2) * g * g);
    const auto u = (m[i] / bc1) / (torch::sqrt(v[i] / bc2) + eps) + wd * p[i];
    const double w_norm = p[i].norm().item<double>(), u_norm = u.norm().item<double>();
    const double trust = (w_norm > 0 && u_norm > 0) ? w_norm / u_norm : 1.0;
    p[i].sub_(lr * trust * u);
  }
}

}  // namespace

TEST_CASE("torchspeed::optim::Lion matches a float64 reference over 40 steps") {
  // Lion's update is lr * sign(c): a float32/float64 difference only matters if it flips the sign
  // of some c = lerp(m, g, 1 - beta1), i.e. when |c| is within float32 rounding of 0. With these
  // continuous MLP gradients that does not happen (each flip would show as a 2*lr = 2e-2 error),
  // so the comparison is tight.
  for (bool maximize : {false, true}) {
    INFO("maximize " << maximize);
    const double lr = 1e-2, b1 = 0.8, b2 = 0.95, wd = 0.1;
    auto ours = make_params();
    auto ref = to_double(ours);
    auto ref_m = zeros_like_all(ref);
    torchspeed::optim::Lion opt(
        ours,
        torchspeed::optim::LionOptions(lr).betas({b1, b2}).weight_decay(wd).maximize(maximize));
    for (int s = 0; s < 40; ++s) {
      const auto grads = mlp_grads(ours, s);
      opt.step();
      lion_reference_step(ref, ref_m, grads, lr, b1, b2, wd, maximize);
    }
    require_close(ours, ref, 1e-5, 1e-6);
    REQUIRE((ours[0].detach() - make_params()[0]).abs().max().item<float>() > 0.1f);
    auto& st = static_cast<torchspeed::optim::LionParamState&>(
        *opt.state().at(ours[0].unsafeGetTensorImpl()));
    REQUIRE(st.step().item<float>() == 40.f);
    REQUIRE(st.step().dim() == 0);
    REQUIRE(st.exp_avg().scalar_type() == at::kFloat);
    REQUIRE_FALSE(st.master().defined());
    require_close({st.exp_avg()}, {ref_m[0]}, 1e-5, 1e-6);
  }
}

TEST_CASE("torchspeed::optim::LAMB matches a float64 reference over 40 steps") {
  const double lr = 1e-2, b1 = 0.9, b2 = 0.999, eps = 1e-6, wd = 0.01;
  auto ours = make_params();
  auto ref = to_double(ours);
  auto ref_m = zeros_like_all(ref), ref_v = zeros_like_all(ref);
  torchspeed::optim::LAMB opt(ours, torchspeed::optim::LAMBOptions(lr).weight_decay(wd));
  for (int s = 0; s < 40; ++s) {
    const auto grads = mlp_grads(ours, s);
    opt.step();
    lamb_reference_step(ref, ref_m, ref_v, grads, s + 1, lr, b1, b2, eps, wd);
  }
  require_close(ours, ref, 1e-5, 1e-6);
  REQUIRE((ours[0].detach() - make_params()[0]).abs().max().item<float>() > 0.1f);
  auto& st = static_cast<torchspeed::optim::LAMBParamState&>(
      *opt.state().at(ours[2].unsafeGetTensorImpl()));
  REQUIRE(st.step().item<float>() == 40.f);
  REQUIRE(st.step().dim() == 0);
  REQUIRE_FALSE(st.master().defined());
  require_close({st.exp_avg_sq()}, {ref_v[2]}, 1e-5, 1e-9);

  // The defaults are torchspeed.optim.LAMB's (and Lion's) in Python.
  const torchspeed::optim::LAMBOptions d;
  REQUIRE(d.lr() == 1e-3);
  REQUIRE(d.betas() == std::make_tuple(0.9, 0.999));
  REQUIRE(d.eps() == 1e-6);
  REQUIRE(d.weight_decay() == 0);
  REQUIRE_FALSE(d.maximize());
  const torchspeed::optim::LionOptions l;
  REQUIRE(l.lr() == 1e-4);
  REQUIRE(l.betas() == std::make_tuple(0.9, 0.99));
  REQUIRE(l.weight_decay() == 0);
  REQUIRE_FALSE(l.maximize());
}

TEST_CASE("a bfloat16 param is updated through an fp32 master that tracks fp32 Lion") {
  auto ref = make_params();                      // fp32, driven by torchspeed::optim::Lion
  auto ours = clone_params(ref, at::kBFloat16);  // bf16 params; grads are the fp32 grads rounded
  for (size_t i = 0; i < ref.size(); ++i) {
    torch::NoGradGuard g;
    ref[i].copy_(ours[i].to(at::kFloat));
  }
  const auto options = torchspeed::optim::LionOptions(1e-3).weight_decay(0.1);
  torchspeed::optim::Lion opt(ours, options);
  torchspeed::optim::Lion ref_opt(ref, options);
  for (int s = 0; s < 20; ++s) {
    opt.zero_grad();
    ref_opt.zero_grad();
    mlp_loss(ref, s).backward();
    for (size_t i = 0; i < ref.size(); ++i) {
      ref[i].mutable_grad() = ref[i].grad().to(at::kBFloat16).to(at::kFloat);
      ours[i].mutable_grad() = ref[i].grad().to(at::kBFloat16);
    }
    opt.step();
    ref_opt.step();
  }
  ParamList masters;
  for (const auto& p : ours) {
    REQUIRE(p.scalar_type() == at::kBFloat16);
    auto& st =
        static_cast<torchspeed::optim::LionParamState&>(*opt.state().at(p.unsafeGetTensorImpl()));
    REQUIRE(st.master().defined());
    REQUIRE(st.master().scalar_type() == at::kFloat);
    REQUIRE(st.exp_avg().scalar_type() == at::kFloat);
    REQUIRE(torch::equal(p.detach(), st.master().to(at::kBFloat16)));
    masters.push_back(st.master());
  }
  // Steps of 1e-3 are below half of bfloat16's spacing for |p| > 0.25: without the master those
  // params would not move at all. The master follows the fp32 run.
  require_close(masters, ref, 1e-6, 1e-6);
  require_close(ours, ref, 1e-2, 1e-2);

  // master_weights(false) updates the bfloat16 param in place and keeps no master.
  auto plain = clone_params(ref, at::kBFloat16);
  const auto before = plain[0].detach().clone();
  torchspeed::optim::Lion opt_plain(plain,
                                    torchspeed::optim::LionOptions(0.5).master_weights(false));
  for (auto& p : plain) p.mutable_grad() = torch::ones_like(p);
  opt_plain.step();
  auto& st = static_cast<torchspeed::optim::LionParamState&>(
      *opt_plain.state().at(plain[0].unsafeGetTensorImpl()));
  REQUIRE_FALSE(st.master().defined());
  REQUIRE(torch::equal(plain[0].detach(), (before.to(at::kFloat) - 0.5).to(at::kBFloat16)));
}

TEST_CASE("Lion/LAMB: bad options and bad steps raise c10::Error naming the argument") {
  auto good = torch::randn({3}).requires_grad_(true);
  auto expect_error = [](const std::function<void()>& f, std::vector<std::string> parts) {
    try {
      f();
      FAIL("accepted: expected an error containing " << parts[0]);
    } catch (const c10::Error& e) {
      const std::string msg = e.what();
      INFO(msg);
      for (const auto& part : parts) REQUIRE(msg.find(part) != std::string::npos);
    }
  };
  using torchspeed::optim::LAMB;
  using torchspeed::optim::LAMBOptions;
  using torchspeed::optim::Lion;
  using torchspeed::optim::LionOptions;
  expect_error([&] { Lion(ParamList{good}, LionOptions().betas({0.9, 1.5})); },
               {"torchspeed.optim.Lion: betas[1] must be in [0, 1), got 1.5"});
  expect_error([&] { Lion(ParamList{good}, LionOptions(-1e-3)); },
               {"torchspeed.optim.Lion", "lr must be a finite number >= 0"});
  expect_error([&] { Lion(ParamList{good}, LionOptions().weight_decay(-0.1)); },
               {"torchspeed.optim.Lion", "weight_decay"});
  expect_error([&] { Lion(ParamList{good}, LionOptions().max_grad_norm(-1.0)); },
               {"torchspeed.optim.Lion", "max_grad_norm"});
  expect_error([&] { LAMB(ParamList{good}, LAMBOptions(-1)); },
               {"torchspeed.optim.LAMB", "lr must be a finite number >= 0"});
  expect_error([&] { LAMB(ParamList{good}, LAMBOptions().betas({-0.1, 0.999})); },
               {"torchspeed.optim.LAMB: betas[0]"});
  expect_error([&] { LAMB(ParamList{good}, LAMBOptions().eps(-1e-6)); },
               {"torchspeed.optim.LAMB", "eps"});
  expect_error([&] { LAMB(ParamList{good}, LAMBOptions().weight_decay(-1)); },
               {"torchspeed.optim.LAMB", "weight_decay"});
  auto ints = torch::arange(3);
  expect_error([&] { Lion(ParamList{good, ints}); },
               {"torchspeed.optim.Lion", "params[1]", "Long"});
  expect_error([&] { LAMB(ParamList{good, ints}); },
               {"torchspeed.optim.LAMB", "params[1]", "Long"});

  // A bad grad on the second param: nothing is stepped, no state is created.
  auto check_bad_step = [&](auto make_opt, const char* name) {
    INFO(name);
    auto a = torch::randn({3}).requires_grad_(true);
    auto b = torch::randn({2, 2}).requires_grad_(true);
    auto opt = make_opt(ParamList{a, b});
    const auto a0 = a.detach().clone(), b0 = b.detach().clone();
    a.mutable_grad() = torch::ones({3});
    b.mutable_grad() = torch::ones({2, 2}).to_sparse();
    expect_error([&] { opt.step(); }, {name, "param_groups[0].params[1]", "sparse"});
    b.mutable_grad() = torch::ones({2, 2}, torch::kDouble);
    expect_error([&] { opt.step(); }, {name, "param_groups[0].params[1]", "Double"});
    REQUIRE(torch::equal(a.detach(), a0));
    REQUIRE(torch::equal(b.detach(), b0));
    REQUIRE(opt.state().empty());
    // Once the grad is fixed, the step works.
    b.mutable_grad() = torch::ones({2, 2});
    opt.step();
    REQUIRE(opt.state().size() == 2);
    REQUIRE_FALSE(torch::equal(a.detach(), a0));
  };
  check_bad_step([](ParamList ps) { return Lion(ps, LionOptions(1e-2)); }, "torchspeed.optim.Lion");
  check_bad_step([](ParamList ps) { return LAMB(ps); }, "torchspeed.optim.LAMB");
}

TEST_CASE("Lion/LAMB save/load round trip resumes training exactly, options included") {
  auto run = [](auto make_opt, auto default_opt, auto options_tag) {
    using Options = decltype(options_tag);
    auto ps = make_params();
    ps.push_back(torch::randn({5}).to(at::kBFloat16).requires_grad_(true));  // has a master
    auto opt = make_opt(ps);
    auto grads_for = [&](int s) {
      torch::manual_seed(500 + s);
      for (auto& p : ps) p.mutable_grad() = torch::randn(p.sizes()).to(p.scalar_type());
    };
    for (int s = 0; s < 5; ++s) {
      grads_for(s);
      opt.step();
    }
    std::stringstream buffer;
    {
      torch::serialize::OutputArchive archive;
      opt.save(archive);
      archive.save_to(buffer);
    }
    // Restored into an optimizer built with the default options: the archive's options win.
    ParamList copies;
    for (const auto& p : ps) copies.push_back(p.detach().clone().requires_grad_(true));
    auto restored = default_opt(copies);
    {
      torch::serialize::InputArchive archive;
      archive.load_from(buffer);
      restored.load(archive);
    }
    REQUIRE(restored.state().size() == opt.state().size());
    REQUIRE(restored.param_groups().size() == 1);
    REQUIRE(static_cast<const Options&>(restored.param_groups()[0].options()) ==
            static_cast<const Options&>(opt.param_groups()[0].options()));
    REQUIRE_FALSE(static_cast<const Options&>(restored.param_groups()[0].options()) == Options());
    for (int s = 5; s < 10; ++s) {
      grads_for(s);
      for (size_t i = 0; i < ps.size(); ++i) copies[i].mutable_grad() = ps[i].grad().clone();
      opt.step();
      restored.step();
    }
    for (size_t i = 0; i < ps.size(); ++i) {
      INFO("param " << i);
      REQUIRE(torch::equal(ps[i].detach(), copies[i].detach()));
    }
  };
  SECTION("Lion with weight decay, maximize and max_grad_norm") {
    run(
        [](ParamList& ps) {
          return torchspeed::optim::Lion(ps, torchspeed::optim::LionOptions(3e-3)
                                                 .betas({0.85, 0.97})
                                                 .weight_decay(0.1)
                                                 .maximize(true)
                                                 .max_grad_norm(1.0));
        },
        [](ParamList& ps) { return torchspeed::optim::Lion(ps); },
        torchspeed::optim::LionOptions());
  }
  SECTION("LAMB with weight decay and max_grad_norm") {
    run(
        [](ParamList& ps) {
          return torchspeed::optim::LAMB(
              ps,
              torchspeed::optim::LAMBOptions(3e-3).eps(1e-7).weight_decay(0.01).max_grad_norm(0.5));
        },
        [](ParamList& ps) { return torchspeed::optim::LAMB(ps); },
        torchspeed::optim::LAMBOptions());
  }
}

TEST_CASE("Lion param groups keep their own options and inherit the rest") {
  auto a = torch::randn({4}).requires_grad_(true);
  auto b = torch::randn({3}).to(at::kBFloat16).requires_grad_(true);  // master bucket
  auto c = torch::randn({2}).requires_grad_(true);
  std::vector<torch::optim::OptimizerParamGroup> groups;
  groups.emplace_back(ParamList{a, b});
  groups.emplace_back(ParamList{c}, std::make_unique<torchspeed::optim::LionOptions>(
                                        torchspeed::optim::LionOptions(0.5)));
  torchspeed::optim::Lion opt(
      groups, torchspeed::optim::LionOptions(1e-3).betas({0.5, 0.9}).weight_decay(0.1));
  const auto& g1 =
      static_cast<const torchspeed::optim::LionOptions&>(opt.param_groups()[1].options());
  REQUIRE(g1.lr() == 0.5);                           // set by the group
  REQUIRE(g1.betas() == std::make_tuple(0.5, 0.9));  // inherited
  REQUIRE(g1.weight_decay() == 0.1);                 // inherited
  const auto a0 = a.detach().clone(), c0 = c.detach().clone();
  for (auto* p : {&a, &b, &c}) p->mutable_grad() = torch::ones_like(*p);
  opt.step();
  // Lion's first step moves each element by lr (times the sign of the grad), after the decay.
  REQUIRE(torch::allclose(c.detach(), c0 * (1 - 0.5 * 0.1) - 0.5, 1e-6, 1e-6));
  REQUIRE(torch::allclose(a.detach(), a0 * (1 - 1e-3 * 0.1) - 1e-3, 1e-6, 1e-6));
  REQUIRE(opt.state().size() == 3);

  // LAMB's add_param_group path too: a group's eps stays, its lr is inherited.
  std::vector<torch::optim::OptimizerParamGroup> lamb_groups;
  lamb_groups.emplace_back(
      ParamList{torch::randn({2}).requires_grad_(true)},
      std::make_unique<torchspeed::optim::LAMBOptions>(torchspeed::optim::LAMBOptions().eps(1e-8)));
  torchspeed::optim::LAMB lamb(lamb_groups, torchspeed::optim::LAMBOptions(0.02));
  const auto& l0 =
      static_cast<const torchspeed::optim::LAMBOptions&>(lamb.param_groups()[0].options());
  REQUIRE(l0.eps() == 1e-8);
  REQUIRE(l0.lr() == 0.02);
}

TEST_CASE("Lion and LAMB on CUDA match their CPU results", "[cuda]") {
  if (!torch::cuda::is_available()) {
    WARN("CUDA not available: skipped");
    return;
  }
  auto check = [](auto make_opt) {
    auto cpu = make_params();
    auto cuda = make_params(at::kFloat, torch::kCUDA);
    auto opt_cpu = make_opt(cpu);
    auto opt_cuda = make_opt(cuda);
    for (int s = 0; s < 30; ++s) {
      const auto grads = mlp_grads(cpu, s);
      for (size_t i = 0; i < cuda.size(); ++i) {
        cuda[i].mutable_grad() = grads[i].to(torch::kCUDA, at::kFloat);
      }
      opt_cpu.step();
      opt_cuda.step();
    }
    require_close(cuda, cpu, 1e-5, 1e-6);
  };
  check([](ParamList& ps) {
    return torchspeed::optim::Lion(ps, torchspeed::optim::LionOptions(1e-2).weight_decay(0.1));
  });
  check([](ParamList& ps) {
    return torchspeed::optim::LAMB(ps, torchspeed::optim::LAMBOptions(1e-2).weight_decay(0.01));
  });
}

// ---- hardening: shared validator, validate-then-write, per-group clipping, aliasing -------------

TEST_CASE("the C++ optimizers reject exactly what the shared hyperparameter validator rejects") {
  auto good = torch::randn({3}).requires_grad_(true);
  const double nan = std::nan(""), inf = INFINITY;
  for (double v : {-1.0, nan, inf, -inf, 1e39, 0.0, 0.5, 1.0, 2.0}) {
    INFO(v);
    auto accepts = [&](const char* name) {
      try {
        torchspeed::optim::check_hyperparameter("X", name, v);
        return true;
      } catch (const c10::ValueError&) {
        return false;
      }
    };
    auto builds = [](const std::function<void()>& f) {
      try {
        f();
        return true;
      } catch (const c10::ValueError&) {
        return false;
      }
    };
    using namespace torchspeed::optim;
    CHECK(builds([&] { AdamW(ParamList{good}, AdamWOptions(v)); }) == accepts("lr"));
    CHECK(builds([&] { Adam(ParamList{good}, AdamOptions().eps(v)); }) == accepts("eps"));
    CHECK(builds([&] { SGD(ParamList{good}, SGDOptions(0.1).momentum(v)); }) ==
          accepts("momentum"));
    CHECK(builds([&] { SGD(ParamList{good}, SGDOptions(0.1).dampening(v)); }) ==
          accepts("dampening"));
    CHECK(builds([&] { Lion(ParamList{good}, LionOptions().betas({0.9, v})); }) ==
          accepts("betas[1]"));
    CHECK(builds([&] { LAMB(ParamList{good}, LAMBOptions().weight_decay(v)); }) ==
          accepts("weight_decay"));
    CHECK(builds([&] { LAMB(ParamList{good}, LAMBOptions().max_grad_norm(v)); }) ==
          accepts("max_grad_norm"));
  }
  // Python raises ValueError for these (c10::ValueError through pybind11).
  REQUIRE_THROWS_AS(torchspeed::optim::check_hyperparameter("Adam", "ema_decay", 1.5),
                    c10::ValueError);
}

TEST_CASE(
    "a bad option in a later group (set after construction) fails the step before any write") {
  using namespace torchspeed::optim;
  auto a = torch::randn({100000}).requires_grad_(true);
  auto b = torch::randn({10}).requires_grad_(true);
  std::vector<torch::optim::OptimizerParamGroup> groups;
  groups.emplace_back(ParamList{a});
  groups.emplace_back(ParamList{b});
  AdamW opt(groups, AdamWOptions(1e-2));
  a.mutable_grad() = torch::ones_like(a);
  b.mutable_grad() = torch::ones_like(b);
  static_cast<AdamWOptions&>(opt.param_groups()[1].options()).lr(-1.0);
  const auto a0 = a.detach().clone();
  try {
    opt.step();
    FAIL("a negative lr in param_groups[1] was accepted");
  } catch (const c10::ValueError& e) {
    INFO(e.what());
    REQUIRE(std::string(e.what()).find("param_groups[1].lr must be a finite number >= 0") !=
            std::string::npos);
  }
  REQUIRE(torch::equal(a.detach(), a0));
  REQUIRE(opt.state().empty());

  // Truncated state of the later group: rejected by the op's validator before group 0 moves.
  static_cast<AdamWOptions&>(opt.param_groups()[1].options()).lr(1e-2);
  opt.step();
  auto& s = static_cast<AdamParamState&>(*opt.state().at(b.unsafeGetTensorImpl()));
  s.exp_avg(torch::zeros({3}));
  const auto a1 = a.detach().clone();
  const auto step_a =
      static_cast<AdamParamState&>(*opt.state().at(a.unsafeGetTensorImpl())).step().item<float>();
  REQUIRE_THROWS_AS(opt.step(), c10::Error);
  REQUIRE(torch::equal(a.detach(), a1));
  REQUIRE(
      static_cast<AdamParamState&>(*opt.state().at(a.unsafeGetTensorImpl())).step().item<float>() ==
      step_a);
}

TEST_CASE("max_grad_norm is per group, like clip_grad_norm_ applied to each group") {
  auto ours = make_params();
  auto ref = clone_params(ours, at::kFloat);
  using namespace torchspeed::optim;
  std::vector<torch::optim::OptimizerParamGroup> groups;
  groups.emplace_back(ParamList{ours[0], ours[1]},
                      std::make_unique<AdamOptions>(AdamOptions(1e-2).max_grad_norm(0.5)));
  groups.emplace_back(ParamList{ours[2]});  // no clipping
  groups.emplace_back(ParamList{ours[3]},
                      std::make_unique<AdamOptions>(AdamOptions(1e-2).max_grad_norm(0.0)));
  Adam opt(groups, AdamOptions(1e-2));
  torch::optim::Adam ref_opt(ref, torch::optim::AdamOptions(1e-2));
  for (int s = 0; s < 10; ++s) {
    torch::manual_seed(900 + s);
    for (size_t i = 0; i < ours.size(); ++i) {
      auto g = torch::randn(ours[i].sizes()) * 3;
      ours[i].mutable_grad() = g.clone();
      ref[i].mutable_grad() = g.clone();
    }
    torch::nn::utils::clip_grad_norm_(ParamList{ref[0], ref[1]}, 0.5);
    torch::nn::utils::clip_grad_norm_(ParamList{ref[3]}, 0.0);  // zeroes the grads
    opt.step();
    ref_opt.step();
  }
  require_close(ours, ref, 1e-5, 1e-6);
}

TEST_CASE("a param listed twice is updated twice in order, deterministically, like torch::optim") {
  auto run = [](bool ours) {
    torch::manual_seed(0);
    auto p = torch::randn({200000}).requires_grad_(true);
    std::unique_ptr<torch::optim::Optimizer> opt;
    if (ours) {
      opt = std::make_unique<torchspeed::optim::Adam>(ParamList{p, p},
                                                      torchspeed::optim::AdamOptions(1e-2));
    } else {
      opt = std::make_unique<torch::optim::Adam>(ParamList{p, p}, torch::optim::AdamOptions(1e-2));
    }
    for (int s = 0; s < 4; ++s) {
      torch::manual_seed(50 + s);
      p.mutable_grad() = torch::randn({200000});
      opt->step();
    }
    return p.detach().clone();
  };
  const auto ref = run(false);
  const auto a = run(true);
  const auto b = run(true);
  REQUIRE(torch::equal(a, b));
  require_close({a}, {ref}, 1e-5, 1e-6);
}

TEST_CASE("a failing load leaves the optimizer as it was; an int64 step is converted") {
  using namespace torchspeed::optim;
  auto p = torch::randn({10}).requires_grad_(true);
  Adam opt(ParamList{p}, AdamOptions(1e-2));
  p.mutable_grad() = torch::ones({10});
  opt.step();
  auto& st = static_cast<AdamParamState&>(*opt.state().at(p.unsafeGetTensorImpl()));

  // A checkpoint whose exp_avg is truncated and whose lr is changed.
  st.exp_avg(torch::zeros({3}));
  static_cast<AdamOptions&>(opt.param_groups()[0].options()).lr(0.5);
  std::stringstream bad;
  torch::serialize::OutputArchive out;
  opt.save(out);
  out.save_to(bad);

  Adam fresh(ParamList{p}, AdamOptions(1e-2));
  p.mutable_grad() = torch::ones({10});
  fresh.step();
  const auto before =
      static_cast<AdamParamState&>(*fresh.state().at(p.unsafeGetTensorImpl())).exp_avg().clone();
  torch::serialize::InputArchive in;
  in.load_from(bad);
  try {
    fresh.load(in);
    FAIL("a truncated exp_avg was loaded");
  } catch (const c10::ValueError& e) {
    INFO(e.what());
    REQUIRE(std::string(e.what()).find("exp_avg must have 10 elements") != std::string::npos);
  }
  REQUIRE(fresh.param_groups()[0].options().get_lr() == 1e-2);
  REQUIRE(torch::equal(
      static_cast<AdamParamState&>(*fresh.state().at(p.unsafeGetTensorImpl())).exp_avg(), before));

  // An int64 step (older checkpoints) becomes a 0-dim float32 tensor at load time.
  st.exp_avg(torch::zeros({10}));
  st.step(torch::tensor(int64_t{3}));
  std::stringstream good;
  torch::serialize::OutputArchive out2;
  opt.save(out2);
  out2.save_to(good);
  torch::serialize::InputArchive in2;
  in2.load_from(good);
  fresh.load(in2);
  const auto& loaded = static_cast<AdamParamState&>(*fresh.state().at(p.unsafeGetTensorImpl()));
  REQUIRE(loaded.step().scalar_type() == at::kFloat);
  REQUIRE(loaded.step().dim() == 0);
  fresh.step();
  REQUIRE(loaded.step().item<float>() == 4.f);
}
