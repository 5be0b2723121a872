// The C++ Lion and SGD with a low-bit moment (state_dtype "bf16" / "int8"; Lion's exp_avg, SGD's
// momentum_buffer): the optimizer against lion_lowbit_step_ / lion_step_ and sgd_lowbit_step_ /
// sgd_step_ called directly on cloned tensors (bitwise), save/load, SGD without momentum, and the
// options' validator.
#include <torch/torch.h>

#include <functional>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "catch_shim.h"
#include "torchspeed/ops/optim.h"
#include "torchspeed/optim.h"

namespace {

using ParamList = std::vector<torch::Tensor>;
using torchspeed::optim::Lion;
using torchspeed::optim::LionOptions;
using torchspeed::optim::LionParamState;
using torchspeed::optim::SGD;
using torchspeed::optim::SGDOptions;
using torchspeed::optim::SGDParamState;

constexpr int64_t kBlock = 256;

// 4270 elements (17 blocks, a short last one), 5120 (20 full blocks), 100 (under
// min_lowbit_numel: fp32 under "int8") and a bfloat16 param of 4500 (fp32 master: its own bucket).
ParamList make_params() {
  torch::manual_seed(0);
  ParamList out;
  for (auto shape : std::vector<std::vector<int64_t>>{{70, 61}, {5120}, {10, 10}}) {
    out.push_back(torch::randn(shape).requires_grad_(true));
  }
  out.push_back(torch::randn({4500}).to(at::kBFloat16).requires_grad_(true));
  return out;
}

ParamList clone_params(const ParamList& ps) {
  ParamList out;
  for (const auto& p : ps) out.push_back(p.detach().clone().requires_grad_(true));
  return out;
}

void set_grads(ParamList& ps, int step) {
  torch::manual_seed(100 + step);
  for (auto& p : ps) p.mutable_grad() = (torch::randn(p.sizes()) * 0.1).to(p.scalar_type());
}

std::vector<std::string> formats_for(const ParamList& ps, const std::string& state_dtype) {
  std::vector<std::string> out;
  for (const auto& p : ps) {
    out.push_back(torchspeed::lowbit_state_format(state_dtype, p.numel(), 4096, kBlock));
  }
  return out;
}

template <class State>
const State& state_of(const torch::optim::Optimizer& opt, const torch::Tensor& p) {
  return static_cast<const State&>(*opt.state().at(p.unsafeGetTensorImpl()));
}

void require_same(const char* name, const torch::Tensor& a, const torch::Tensor& b) {
  INFO(name);
  REQUIRE(a.defined() == b.defined());
  if (a.defined()) {
    REQUIRE(a.scalar_type() == b.scalar_type());
    REQUIRE(torch::equal(a, b));
  }
}

// The moment, its absmax, step and master the optimizer should hold, built independently of it.
struct RefState {
  torch::Tensor m, am, step, master;
};
RefState fresh_state(const torch::Tensor& p, const std::string& format, bool with_step) {
  RefState s;
  const auto dtype = format == "int8" ? at::kChar : format == "bf16" ? at::kBFloat16 : at::kFloat;
  s.m = torch::zeros_like(p, p.options().dtype(dtype));
  if (format == "int8") s.am = torch::zeros({(p.numel() + kBlock - 1) / kBlock});
  if (with_step) s.step = torch::zeros({});
  if (p.scalar_type() == at::kBFloat16) s.master = p.detach().to(at::kFloat);
  return s;
}

// One step by hand: per (master bucket, format) one direct op call, params in the optimizer's
// order (the position in the call is part of bf16's stochastic rounding hash).
template <class Call>
void direct_step(const ParamList& ps, std::vector<RefState>& st,
                 const std::vector<std::string>& fmt, Call&& call) {
  for (bool master : {true, false}) {
    for (const std::string f : {"fp32", "bf16", "int8"}) {
      std::vector<torch::Tensor> params, grads, m, am, masters, steps;
      for (size_t i = 0; i < ps.size(); ++i) {
        if ((ps[i].scalar_type() == at::kBFloat16) != master || fmt[i] != f) continue;
        params.push_back(ps[i].detach());
        grads.push_back(ps[i].grad());
        m.push_back(st[i].m);
        if (f == "int8") am.push_back(st[i].am);
        if (master) masters.push_back(st[i].master);
        if (st[i].step.defined()) steps.push_back(st[i].step);
      }
      if (!params.empty()) call(f, params, grads, m, am, masters, steps);
    }
  }
}

void lion_direct(const ParamList& ps, std::vector<RefState>& st,
                 const std::vector<std::string>& fmt) {
  direct_step(ps, st, fmt,
              [](const std::string& f, auto& params, auto& grads, auto& m, auto& am, auto& masters,
                 auto& steps) {
                if (f == "fp32") {
                  torchspeed::LionStepArgs a;
                  a.params = params;
                  a.grads = grads;
                  a.exp_avgs = m;
                  a.masters = masters;
                  a.steps = steps;
                  a.lr = 1e-3;
                  a.weight_decay = 0.1;
                  torchspeed::lion_step_(a);
                } else {
                  torchspeed::LionLowbitStepArgs a;
                  a.params = params;
                  a.grads = grads;
                  a.exp_avgs = m;
                  a.exp_avg_absmaxes = am;
                  a.masters = masters;
                  a.steps = steps;
                  a.state_block = kBlock;
                  a.lr = 1e-3;
                  a.weight_decay = 0.1;
                  torchspeed::lion_lowbit_step_(a);
                }
              });
}

void sgd_direct(const ParamList& ps, std::vector<RefState>& st, const std::vector<std::string>& fmt,
                bool first_step) {
  direct_step(ps, st, fmt,
              [&](const std::string& f, auto& params, auto& grads, auto& m, auto& am, auto& masters,
                  auto& steps) {
                if (f == "fp32") {
                  torchspeed::SgdStepArgs a;
                  a.params = params;
                  a.grads = grads;
                  a.momentum_buffers = m;
                  a.masters = masters;
                  a.lr = 0.05;
                  a.momentum = 0.9;
                  a.weight_decay = 0.01;
                  a.nesterov = true;
                  a.first_step = first_step;
                  torchspeed::sgd_step_(a);
                } else {
                  torchspeed::SgdLowbitStepArgs a;
                  a.params = params;
                  a.grads = grads;
                  a.momentum_buffers = m;
                  a.momentum_buffer_absmaxes = am;
                  a.masters = masters;
                  a.steps = steps;
                  a.state_block = kBlock;
                  a.lr = 0.05;
                  a.momentum = 0.9;
                  a.weight_decay = 0.01;
                  a.nesterov = true;
                  a.first_step = first_step;
                  torchspeed::sgd_lowbit_step_(a);
                }
              });
}

SGDOptions sgd_options(const std::string& state_dtype) {
  return SGDOptions(0.05).momentum(0.9).weight_decay(0.01).nesterov(true).state_dtype(state_dtype);
}

std::string save_to_string(const torch::optim::Optimizer& opt) {
  std::stringstream buffer;
  torch::serialize::OutputArchive archive;
  opt.save(archive);
  archive.save_to(buffer);
  return buffer.str();
}

void load_from_string(torch::optim::Optimizer& opt, const std::string& bytes) {
  std::stringstream buffer(bytes);
  torch::serialize::InputArchive archive;
  archive.load_from(buffer);
  opt.load(archive);
}

// The validator's own message for these options, without its "torchspeed.<op>: " prefix.
std::string validator_message(const std::string& state_dtype, int64_t min_lowbit_numel,
                              int64_t state_block) {
  try {
    torchspeed::lowbit_state_format(state_dtype, 0, min_lowbit_numel, state_block);
  } catch (const c10::ValueError& e) {
    const std::string msg = e.msg().substr(0, e.msg().find('\n'));
    return msg.substr(msg.find(": ") + 2);
  }
  FAIL("the validator accepted " << state_dtype << " " << min_lowbit_numel << " " << state_block);
  return "";
}

// `f` throws a c10::ValueError whose message holds `message`.
void require_value_error(const std::function<void()>& f, const std::string& message) {
  try {
    f();
    FAIL("no error; wanted " << message);
  } catch (const c10::ValueError& e) {
    INFO(e.what());
    REQUIRE(std::string(e.what()).find(message) != std::string::npos);
  }
}

}  // namespace

TEST_CASE("low-bit Lion steps equal lion_lowbit_step_ / lion_step_ called directly", "[lowbit]") {
  for (const std::string state_dtype : {"int8", "bf16"}) {
    INFO(state_dtype);
    auto ours = make_params();
    auto ref = clone_params(ours);
    Lion opt(ours, LionOptions(1e-3).weight_decay(0.1).state_dtype(state_dtype));
    const auto fmt = formats_for(ours, state_dtype);
    std::vector<RefState> st;
    for (size_t i = 0; i < ref.size(); ++i) st.push_back(fresh_state(ref[i], fmt[i], true));
    for (int s = 0; s < 5; ++s) {
      set_grads(ours, s);
      set_grads(ref, s);
      opt.step();
      lion_direct(ref, st, fmt);
    }
    for (size_t i = 0; i < ours.size(); ++i) {
      INFO("param " << i << " format " << fmt[i]);
      REQUIRE(torch::equal(ours[i].detach(), ref[i].detach()));
      const auto& s = state_of<LionParamState>(opt, ours[i]);
      require_same("exp_avg", s.exp_avg(), st[i].m);
      require_same("exp_avg_absmax", s.exp_avg_absmax(), st[i].am);
      require_same("master", s.master(), st[i].master);
      REQUIRE(s.step().item<float>() == 5.f);
      REQUIRE_FALSE(torch::equal(ours[i].detach(), make_params()[i].detach()));
    }
    REQUIRE(fmt[0] == state_dtype);
    REQUIRE(fmt[2] == (state_dtype == "int8" ? "fp32" : "bf16"));
  }
}

TEST_CASE("low-bit SGD steps equal sgd_lowbit_step_ / sgd_step_ called directly", "[lowbit]") {
  for (const std::string state_dtype : {"int8", "bf16"}) {
    INFO(state_dtype);
    auto ours = make_params();
    auto ref = clone_params(ours);
    SGD opt(ours, sgd_options(state_dtype));
    const auto fmt = formats_for(ours, state_dtype);
    std::vector<RefState> st;
    // As Python's SGD: a float32 step only beside a low-bit buffer.
    for (size_t i = 0; i < ref.size(); ++i) {
      st.push_back(fresh_state(ref[i], fmt[i], fmt[i] != "fp32"));
    }
    for (int s = 0; s < 5; ++s) {
      set_grads(ours, s);
      set_grads(ref, s);
      opt.step();
      sgd_direct(ref, st, fmt, /*first_step=*/s == 0);
    }
    for (size_t i = 0; i < ours.size(); ++i) {
      INFO("param " << i << " format " << fmt[i]);
      REQUIRE(torch::equal(ours[i].detach(), ref[i].detach()));
      const auto& s = state_of<SGDParamState>(opt, ours[i]);
      require_same("momentum_buffer", s.momentum_buffer(), st[i].m);
      require_same("momentum_buffer_absmax", s.momentum_buffer_absmax(), st[i].am);
      require_same("step", s.step(), st[i].step);
      require_same("master", s.master(), st[i].master);
      if (st[i].step.defined()) REQUIRE(s.step().item<float>() == 5.f);
      REQUIRE_FALSE(torch::equal(ours[i].detach(), make_params()[i].detach()));
    }
  }
}

TEST_CASE(
    "an SGD first step that GradScaler skips leaves no buffer: the next starts it from its "
    "grad, as Python's SGD",
    "[lowbit]") {
  for (const std::string state_dtype : {"fp32", "int8", "bf16"}) {
    INFO(state_dtype);
    // Dampening: a buffer kept from the skipped step (zeros, then first_step false) would give
    // (1 - dampening) * grad instead of the grad.
    const SGDOptions options =
        SGDOptions(0.05).momentum(0.9).dampening(0.1).weight_decay(0.01).state_dtype(state_dtype);
    auto skipped = make_params();
    auto ref = clone_params(skipped);  // never sees the skipped step
    SGD opt(skipped, options);
    SGD ref_opt(ref, options);
    set_grads(skipped, 0);
    opt.step(torchspeed::optim::GradScaling{torch::ones({1}), torch::ones({1})});
    for (size_t i = 0; i < skipped.size(); ++i) {
      INFO("param " << i);
      REQUIRE(torch::equal(skipped[i].detach(), ref[i].detach()));  // nothing written
      CHECK_FALSE(state_of<SGDParamState>(opt, skipped[i]).momentum_buffer().defined());
    }
    for (int s = 1; s < 3; ++s) {
      set_grads(skipped, s);
      set_grads(ref, s);
      opt.step(torchspeed::optim::GradScaling{torch::ones({1}), torch::zeros({1})});
      ref_opt.step();
    }
    for (size_t i = 0; i < skipped.size(); ++i) {
      INFO("param " << i);
      REQUIRE(torch::equal(skipped[i].detach(), ref[i].detach()));
      const auto& got = state_of<SGDParamState>(opt, skipped[i]);
      const auto& want = state_of<SGDParamState>(ref_opt, ref[i]);
      require_same("momentum_buffer", got.momentum_buffer(), want.momentum_buffer());
      require_same("momentum_buffer_absmax", got.momentum_buffer_absmax(),
                   want.momentum_buffer_absmax());
      require_same("step", got.step(), want.step());
      REQUIRE_FALSE(torch::equal(skipped[i].detach(), make_params()[i].detach()));
    }
  }
}

TEST_CASE("SGD without momentum has no buffer and no step under a low-bit state_dtype",
          "[lowbit]") {
  auto ours = make_params();
  auto ref = clone_params(ours);
  SGD opt(ours, SGDOptions(0.05).state_dtype("int8"));
  torch::optim::SGD torch_opt(ref, torch::optim::SGDOptions(0.05));
  for (int s = 0; s < 2; ++s) {
    set_grads(ours, s);
    set_grads(ref, s);
    opt.step();
    torch_opt.step();
  }
  for (size_t i = 0; i < ours.size(); ++i) {
    INFO("param " << i);
    if (ours[i].scalar_type() == at::kFloat) {
      REQUIRE(torch::equal(ours[i].detach(), ref[i].detach()));
    }
    auto it = opt.state().find(ours[i].unsafeGetTensorImpl());
    if (it == opt.state().end()) continue;
    const auto& s = static_cast<const SGDParamState&>(*it->second);
    REQUIRE_FALSE(s.momentum_buffer().defined());
    REQUIRE_FALSE(s.momentum_buffer_absmax().defined());
    REQUIRE_FALSE(s.step().defined());
  }
}

TEST_CASE("low-bit Lion and SGD save/load round trips resume exactly; loads convert", "[lowbit]") {
  for (const std::string state_dtype : {"int8", "bf16"}) {
    INFO(state_dtype);
    // Lion.
    {
      auto ps = make_params();
      Lion opt(ps, LionOptions(1e-3).state_dtype(state_dtype));
      for (int s = 0; s < 3; ++s) {
        set_grads(ps, s);
        opt.step();
      }
      auto copies = clone_params(ps);
      Lion restored(copies, LionOptions(1e-3).state_dtype(state_dtype));
      load_from_string(restored, save_to_string(opt));
      for (int s = 3; s < 6; ++s) {
        set_grads(ps, s);
        set_grads(copies, s);
        opt.step();
        restored.step();
      }
      for (size_t i = 0; i < ps.size(); ++i) {
        INFO("Lion param " << i);
        REQUIRE(torch::equal(ps[i].detach(), copies[i].detach()));
        const auto& a = state_of<LionParamState>(opt, ps[i]);
        const auto& b = state_of<LionParamState>(restored, copies[i]);
        require_same("exp_avg", a.exp_avg(), b.exp_avg());
        require_same("exp_avg_absmax", a.exp_avg_absmax(), b.exp_avg_absmax());
        require_same("step", a.step(), b.step());
      }
      // Into an fp32 Lion: the moment is decoded to float32, the options stay its own.
      auto plain = clone_params(ps);
      Lion fp32(plain, LionOptions(1e-3));
      load_from_string(fp32, save_to_string(opt));
      REQUIRE(static_cast<const LionOptions&>(fp32.param_groups()[0].options()).state_dtype() ==
              "fp32");
      const auto& src = state_of<LionParamState>(opt, ps[0]);
      const auto& got = state_of<LionParamState>(fp32, plain[0]);
      REQUIRE(got.exp_avg().scalar_type() == at::kFloat);
      REQUIRE_FALSE(got.exp_avg_absmax().defined());
      if (state_dtype == "int8") {
        torchspeed::LowbitDecodeArgs d;
        d.codes = src.exp_avg().reshape({-1});
        d.absmax = src.exp_avg_absmax();
        d.state_block = kBlock;
        REQUIRE(torch::equal(got.exp_avg().reshape({-1}), torchspeed::lowbit_decode(d)));
      } else {
        REQUIRE(torch::equal(got.exp_avg(), src.exp_avg().to(at::kFloat)));
      }
    }
    // SGD: the step key travels with a low-bit buffer and is dropped with a float32 one.
    {
      auto ps = make_params();
      SGD opt(ps, sgd_options(state_dtype));
      for (int s = 0; s < 3; ++s) {
        set_grads(ps, s);
        opt.step();
      }
      auto copies = clone_params(ps);
      SGD restored(copies, sgd_options(state_dtype));
      load_from_string(restored, save_to_string(opt));
      for (int s = 3; s < 6; ++s) {
        set_grads(ps, s);
        set_grads(copies, s);
        opt.step();
        restored.step();
      }
      for (size_t i = 0; i < ps.size(); ++i) {
        INFO("SGD param " << i);
        REQUIRE(torch::equal(ps[i].detach(), copies[i].detach()));
        const auto& a = state_of<SGDParamState>(opt, ps[i]);
        const auto& b = state_of<SGDParamState>(restored, copies[i]);
        require_same("momentum_buffer", a.momentum_buffer(), b.momentum_buffer());
        require_same("momentum_buffer_absmax", a.momentum_buffer_absmax(),
                     b.momentum_buffer_absmax());
        require_same("step", a.step(), b.step());
      }
      auto plain = clone_params(ps);
      SGD fp32(plain, sgd_options("fp32"));
      load_from_string(fp32, save_to_string(opt));
      for (size_t i = 0; i < ps.size(); ++i) {
        const auto& got = state_of<SGDParamState>(fp32, plain[i]);
        REQUIRE(got.momentum_buffer().scalar_type() == at::kFloat);
        REQUIRE_FALSE(got.momentum_buffer_absmax().defined());
        REQUIRE_FALSE(got.step().defined());
      }
      // And back: float32 buffers into an int8 SGD are encoded and get a zero step.
      auto back = clone_params(ps);
      SGD int8(back, sgd_options("int8"));
      load_from_string(int8, save_to_string(fp32));
      const auto& got = state_of<SGDParamState>(int8, back[0]);
      torchspeed::LowbitEncodeArgs e;
      e.values = state_of<SGDParamState>(fp32, plain[0]).momentum_buffer().reshape({-1});
      e.state_block = kBlock;
      const auto [codes, absmax] = torchspeed::lowbit_encode(e);
      REQUIRE(got.momentum_buffer().scalar_type() == at::kChar);
      REQUIRE(torch::equal(got.momentum_buffer().reshape({-1}), codes));
      REQUIRE(torch::equal(got.momentum_buffer_absmax(), absmax));
      set_grads(back, 9);
      int8.step();  // the step is created before the first low-bit step
      REQUIRE(state_of<SGDParamState>(int8, back[0]).step().item<float>() == 1.f);
    }
  }
}

TEST_CASE("bad Lion / SGD state options throw the validator's message and change nothing",
          "[lowbit]") {
  struct Bad {
    std::string dtype;
    int64_t min_numel, block;
  };
  for (const Bad& bad : {Bad{"int4", 4096, 256}, Bad{"int8", 4096, 100}, Bad{"int8", -1, 256}}) {
    const std::string message = validator_message(bad.dtype, bad.min_numel, bad.block);
    INFO(message);
    auto ps = make_params();
    const auto lion_bad = [&](LionOptions& o) {
      o.state_dtype(bad.dtype).min_lowbit_numel(bad.min_numel).state_block(bad.block);
    };
    const auto sgd_bad = [&](SGDOptions& o) {
      o.state_dtype(bad.dtype).min_lowbit_numel(bad.min_numel).state_block(bad.block);
    };
    // At construction.
    LionOptions lo(1e-3);
    lion_bad(lo);
    require_value_error([&] { Lion bad_opt(ps, lo); }, "torchspeed.optim.Lion: " + message);
    SGDOptions so = sgd_options("int8");
    sgd_bad(so);
    require_value_error([&] { SGD bad_opt(ps, so); }, "torchspeed.optim.SGD: " + message);
    // In a running optimizer's group: the step refuses before anything changes.
    Lion lion(ps, LionOptions(1e-3).state_dtype("int8"));
    SGD sgd(ps, sgd_options("int8"));
    set_grads(ps, 0);
    lion.step();
    sgd.step();
    ParamList before;
    for (const auto& p : ps) before.push_back(p.detach().clone());
    const auto m_before = state_of<LionParamState>(lion, ps[0]).exp_avg().clone();
    const auto b_before = state_of<SGDParamState>(sgd, ps[0]).momentum_buffer().clone();
    lion_bad(static_cast<LionOptions&>(lion.param_groups()[0].options()));
    sgd_bad(static_cast<SGDOptions&>(sgd.param_groups()[0].options()));
    set_grads(ps, 1);
    require_value_error([&] { lion.step(); }, "torchspeed.optim.Lion: param_groups[0]." + message);
    require_value_error([&] { sgd.step(); }, "torchspeed.optim.SGD: param_groups[0]." + message);
    for (size_t i = 0; i < ps.size(); ++i) REQUIRE(torch::equal(ps[i].detach(), before[i]));
    REQUIRE(torch::equal(state_of<LionParamState>(lion, ps[0]).exp_avg(), m_before));
    REQUIRE(state_of<LionParamState>(lion, ps[0]).step().item<float>() == 1.f);
    REQUIRE(torch::equal(state_of<SGDParamState>(sgd, ps[0]).momentum_buffer(), b_before));
    REQUIRE(state_of<SGDParamState>(sgd, ps[0]).step().item<float>() == 1.f);
  }
}
