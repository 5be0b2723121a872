// The C++ optimizers at parity with the Python ones: channels_last params, the EMA copy, a tensor
// lr, GradScaler-style grad_scale/found_inf, and every option field in ==, save/load and merge
// (the field lists of include/torchspeed/optim/*.h generate all of them).
#include <torch/torch.h>

#include <sstream>
#include <string>
#include <vector>

#include "catch_shim.h"
#include "torchspeed/optim.h"

namespace {

namespace ts = torchspeed::optim;

std::vector<torch::Tensor> conv_params(at::MemoryFormat format) {
  torch::manual_seed(0);
  auto w = torch::randn({8, 4, 3, 3}).contiguous(format).requires_grad_(true);
  auto b = torch::randn({8}).requires_grad_(true);
  return {w, b};
}

void set_grads(std::vector<torch::Tensor>& ps, int step, double scale = 1.0) {
  torch::manual_seed(100 + step);
  for (auto& p : ps) {
    auto g = torch::randn(p.sizes()) * scale;
    p.mutable_grad() = g.contiguous(p.is_contiguous() ? at::MemoryFormat::Contiguous
                                                      : at::MemoryFormat::ChannelsLast);
  }
}

template <class Options>
Options round_trip(const Options& o) {
  std::stringstream buffer;
  {
    torch::serialize::OutputArchive archive;
    o.serialize(archive);
    archive.save_to(buffer);
  }
  Options back = Options(1.0);
  torch::serialize::InputArchive archive;
  archive.load_from(buffer);
  back.serialize(archive);
  return back;
}

/// The message of the c10::Error `f` throws ("" when it does not throw).
template <class F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const c10::Error& e) {
    return e.what_without_backtrace();
  }
  return "";
}

}  // namespace

TEST_CASE("channels_last params step like torch::optim::AdamW, with channels_last state") {
  auto ours = conv_params(at::MemoryFormat::ChannelsLast);
  auto ref = conv_params(at::MemoryFormat::Contiguous);
  REQUIRE(!ours[0].is_contiguous());
  ts::AdamW opt(ours, ts::AdamWOptions(1e-2).weight_decay(0.1));
  torch::optim::AdamW torch_opt(ref, torch::optim::AdamWOptions(1e-2).weight_decay(0.1));
  for (int s = 0; s < 10; ++s) {
    set_grads(ours, s);
    set_grads(ref, s);
    opt.step();
    torch_opt.step();
  }
  for (size_t i = 0; i < ours.size(); ++i) {
    REQUIRE(torch::allclose(ours[i].detach(), ref[i].detach(), 1e-5, 1e-6));
  }
  REQUIRE(ours[0].is_contiguous(at::MemoryFormat::ChannelsLast));
  const auto& s =
      static_cast<const ts::AdamParamState&>(*opt.state().at(ours[0].unsafeGetTensorImpl()));
  REQUIRE(s.exp_avg().strides() == ours[0].strides());
}

TEST_CASE("ema_decay keeps an fp32 EMA of every param, updated after each step") {
  torch::manual_seed(0);
  std::vector<torch::Tensor> ps{torch::randn({33}).requires_grad_(true),
                                torch::randn({7}).to(at::kBFloat16).requires_grad_(true)};
  ts::SGD opt(ps, ts::SGDOptions(0.1).momentum(0.9).ema_decay(0.8));
  std::vector<torch::Tensor> ema;
  for (const auto& p : ps) ema.push_back(p.detach().to(at::kDouble));
  for (int s = 0; s < 6; ++s) {
    set_grads(ps, s);
    opt.step();
    for (size_t i = 0; i < ps.size(); ++i) {
      const auto& st =
          static_cast<const ts::SGDParamState&>(*opt.state().at(ps[i].unsafeGetTensorImpl()));
      // The EMA follows the fp32 master (the bf16 param is its rounding).
      const auto p = st.master().defined() ? st.master() : ps[i].detach();
      ema[i] += 0.2 * (p.to(at::kDouble) - ema[i]);
      REQUIRE(st.ema().scalar_type() == at::kFloat);
      INFO("step " << s << " param " << i);
      REQUIRE(torch::allclose(st.ema().to(at::kDouble), ema[i], 1e-5, 1e-6));
    }
  }
}

TEST_CASE("a tensor lr steps like the same float lr and follows in-place updates") {
  auto run = [](bool as_tensor) {
    torch::manual_seed(0);
    std::vector<torch::Tensor> ps{torch::randn({50}).requires_grad_(true)};
    auto lr = torch::tensor({1e-2});
    auto o = ts::AdamOptions(1e-2);
    if (as_tensor) o.lr_tensor(lr).lr(123.0);  // lr is ignored when lr_tensor is set
    ts::Adam opt(ps, o);
    for (int s = 0; s < 6; ++s) {
      if (s == 3) {
        if (as_tensor) {
          lr.fill_(3e-2);
        } else {
          opt.param_groups()[0].options().set_lr(3e-2);
        }
      }
      set_grads(ps, s);
      opt.step();
    }
    return ps[0].detach().clone();
  };
  REQUIRE(torch::equal(run(true), run(false)));
}

TEST_CASE("GradScaling: scaled grads step as unscaled ones; found_inf skips the whole step") {
  auto make = [] {
    torch::manual_seed(0);
    return std::vector<torch::Tensor>{torch::randn({40}).requires_grad_(true),
                                      torch::randn({9}).requires_grad_(true)};
  };
  auto plain = make(), scaled = make();
  ts::LAMB a(plain, ts::LAMBOptions(1e-2).weight_decay(0.01).max_grad_norm(0.5));
  ts::LAMB b(scaled, ts::LAMBOptions(1e-2).weight_decay(0.01).max_grad_norm(0.5));
  const auto scale = torch::tensor({1024.f});
  for (int s = 0; s < 5; ++s) {
    set_grads(plain, s);
    set_grads(scaled, s, 1024.0);
    a.step();
    b.step({scale, torch::zeros({1})});
  }
  for (size_t i = 0; i < plain.size(); ++i) {
    REQUIRE(torch::allclose(plain[i].detach(), scaled[i].detach(), 1e-5, 1e-7));
  }
  // An overflowed step changes nothing: params, moments, step counts.
  std::vector<torch::Tensor> before;
  for (const auto& p : scaled) before.push_back(p.detach().clone());
  const auto& st =
      static_cast<const ts::LAMBParamState&>(*b.state().at(scaled[0].unsafeGetTensorImpl()));
  const auto m_before = st.exp_avg().clone();
  const float step_before = st.step().item<float>();
  set_grads(scaled, 9, 1024.0);
  scaled[0].mutable_grad()[3] = INFINITY;
  b.step({scale, torch::ones({1})});
  for (size_t i = 0; i < scaled.size(); ++i) REQUIRE(torch::equal(scaled[i].detach(), before[i]));
  REQUIRE(torch::equal(st.exp_avg(), m_before));
  REQUIRE(st.step().item<float>() == step_before);
}

TEST_CASE("every option field takes part in ==, survives save/load and is merged into groups") {
  SECTION("AdamW") {
    const auto base = ts::AdamWOptions(1e-3);
    std::vector<ts::AdamWOptions> changed{
        ts::AdamWOptions(2e-3),
        ts::AdamWOptions(1e-3).betas({0.8, 0.9}),
        ts::AdamWOptions(1e-3).eps(1e-6),
        ts::AdamWOptions(1e-3).weight_decay(0.5),
        ts::AdamWOptions(1e-3).amsgrad(true),
        ts::AdamWOptions(1e-3).maximize(true),
        ts::AdamWOptions(1e-3).master_weights(false),
        ts::AdamWOptions(1e-3).max_grad_norm(1.0),
        ts::AdamWOptions(1e-3).ema_decay(0.99),
        ts::AdamWOptions(1e-3).lr_tensor(torch::tensor({0.5})),
    };
    for (size_t k = 0; k < changed.size(); ++k) {
      INFO("field " << k);
      REQUIRE(!(changed[k] == base));
      const auto back = round_trip(changed[k]);
      if (changed[k].lr_tensor()) {  // saved by value: a new tensor with the same value
        REQUIRE(back.lr_tensor().has_value());
        REQUIRE(torch::equal(*back.lr_tensor(), *changed[k].lr_tensor()));
      } else {
        REQUIRE(back == changed[k]);
      }
    }
  }
  SECTION("SGD, with a group that sets only some fields") {
    auto p = torch::randn({4}).requires_grad_(true), q = torch::randn({4}).requires_grad_(true);
    ts::SGD opt({torch::optim::OptimizerParamGroup({p}),
                 torch::optim::OptimizerParamGroup(
                     {q}, std::make_unique<ts::SGDOptions>(ts::SGDOptions(0.5).ema_decay(0.9)))},
                ts::SGDOptions(0.1).momentum(0.9).max_grad_norm(2.0));
    const auto& g1 = static_cast<const ts::SGDOptions&>(opt.param_groups()[1].options());
    REQUIRE(g1.lr() == 0.5);
    REQUIRE(g1.ema_decay() == 0.9);
    REQUIRE(g1.momentum() == 0.9);       // inherited
    REQUIRE(g1.max_grad_norm() == 2.0);  // inherited
    REQUIRE(round_trip(g1) == g1);
  }
}

TEST_CASE("bad ema_decay and lr_tensor raise c10::ValueError naming the field") {
  auto p = torch::randn({3}).requires_grad_(true);
  auto message = [&](const ts::AdamOptions& o) { return error_of([&] { ts::Adam({p}, o); }); };
  CHECK(message(ts::AdamOptions().ema_decay(1.5)).find("ema_decay") != std::string::npos);
  CHECK(message(ts::AdamOptions().lr_tensor(torch::ones({2})))
            .find("lr_tensor must be a one-element") != std::string::npos);
  CHECK(message(ts::AdamOptions().lr_tensor(torch::tensor({-1.0}))).find("lr must be") !=
        std::string::npos);
  REQUIRE_THROWS_AS(ts::Adam({p}, ts::AdamOptions().ema_decay(-0.1)), c10::ValueError);
}
