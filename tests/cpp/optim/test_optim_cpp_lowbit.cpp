// The C++ Adam/AdamW with low-bit moments (state_dtype "bf16" / "int8"): the optimizer against
// adam_lowbit_step_ / adam_step_ called directly on cloned tensors (bitwise), save/load, the
// options' validator, and loaded states that must be refused.
#include <torch/torch.h>

#include <cmath>
#include <functional>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

#include "catch_shim.h"
#include "torchspeed/ops/optim.h"
#include "torchspeed/optim.h"

namespace {

using ParamList = std::vector<torch::Tensor>;
using torchspeed::optim::AdamOptions;
using torchspeed::optim::AdamParamState;
using torchspeed::optim::AdamW;
using torchspeed::optim::AdamWOptions;

constexpr int64_t kBlock = 256;

// 4270 elements (int8 under the default min_lowbit_numel, 17 blocks with a short last one), 5120
// (20 full blocks), 100 (under min_lowbit_numel: fp32 under "int8"), a bfloat16 param of 4500
// elements (updated through an fp32 master: its own bucket) and a channels_last one.
ParamList make_params() {
  torch::manual_seed(0);
  ParamList out;
  for (auto shape : std::vector<std::vector<int64_t>>{{70, 61}, {5120}, {10, 10}}) {
    out.push_back(torch::randn(shape).requires_grad_(true));
  }
  out.push_back(torch::randn({4500}).to(at::kBFloat16).requires_grad_(true));
  // channels_last, 5376 elements: the int8 blocks run over its memory order.
  out.push_back(
      torch::randn({8, 16, 6, 7}).contiguous(at::MemoryFormat::ChannelsLast).requires_grad_(true));
  return out;
}

ParamList clone_params(const ParamList& ps) {
  ParamList out;
  for (const auto& p : ps) {
    out.push_back(p.detach().clone(at::MemoryFormat::Preserve).requires_grad_(true));
  }
  return out;
}

void set_grads(ParamList& ps, int step) {
  torch::manual_seed(100 + step);
  for (auto& p : ps) {
    p.mutable_grad() =
        (torch::randn(p.sizes()) * 0.1).to(p.scalar_type()).contiguous(p.suggest_memory_format());
  }
}

// The elements of a param-shaped tensor in memory order (contiguous or channels_last).
torch::Tensor memory_order(const torch::Tensor& t) {
  if (t.dim() == 4 && !t.is_contiguous()) return t.permute({0, 2, 3, 1}).reshape({-1});
  return t.reshape({-1});
}

const AdamParamState& state_of(const torch::optim::Optimizer& opt, const torch::Tensor& p) {
  return static_cast<const AdamParamState&>(*opt.state().at(p.unsafeGetTensorImpl()));
}

void require_equal_state(const AdamParamState& a, const AdamParamState& b) {
  const std::vector<std::pair<const char*, std::pair<torch::Tensor, torch::Tensor>>> pairs = {
      {"step", {a.step(), b.step()}},
      {"exp_avg", {a.exp_avg(), b.exp_avg()}},
      {"exp_avg_sq", {a.exp_avg_sq(), b.exp_avg_sq()}},
      {"exp_avg_absmax", {a.exp_avg_absmax(), b.exp_avg_absmax()}},
      {"exp_avg_sq_absmax", {a.exp_avg_sq_absmax(), b.exp_avg_sq_absmax()}},
      {"master", {a.master(), b.master()}}};
  for (const auto& [name, t] : pairs) {
    INFO(name);
    REQUIRE(t.first.defined() == t.second.defined());
    if (t.first.defined()) REQUIRE(torch::equal(t.first, t.second));
  }
}

// The state the optimizer should create for `p` in `format`, built independently of it: zero
// codes and absmaxes (int8), bfloat16 or float32 zeros, a zero step, an fp32 master for bf16.
struct RefState {
  torch::Tensor m, v, am, av, step, master;
};
RefState fresh_state(const torch::Tensor& p, const std::string& format) {
  RefState s;
  const auto dtype_m = format == "int8" ? at::kChar : format == "bf16" ? at::kBFloat16 : at::kFloat;
  const auto dtype_v = format == "int8" ? at::kByte : dtype_m;
  s.m = torch::zeros_like(p, p.options().dtype(dtype_m));  // laid out like p
  s.v = torch::zeros_like(p, p.options().dtype(dtype_v));
  if (format == "int8") {
    s.am = torch::zeros({(p.numel() + kBlock - 1) / kBlock});
    s.av = s.am.clone();
  }
  s.step = torch::zeros({});
  if (p.scalar_type() == at::kBFloat16) s.master = p.detach().to(at::kFloat);
  return s;
}

// One optimizer step done by hand: per (master bucket, format) one direct op call, params in the
// optimizer's order (the position in the call is part of bf16's stochastic rounding hash).
struct Hyper {
  double lr = 1e-2, wd = 0.1;
  bool decoupled = true;
};
void direct_step(const ParamList& ps, std::vector<RefState>& st,
                 const std::vector<std::string>& fmt, const Hyper& h) {
  for (bool master : {true, false}) {
    for (const std::string f : {"fp32", "bf16", "int8"}) {
      std::vector<torch::Tensor> params, grads, m, v, am, av, masters, steps;
      for (size_t i = 0; i < ps.size(); ++i) {
        if ((ps[i].scalar_type() == at::kBFloat16) != master || fmt[i] != f) continue;
        params.push_back(ps[i].detach());
        grads.push_back(ps[i].grad());
        m.push_back(st[i].m);
        v.push_back(st[i].v);
        if (f == "int8") {
          am.push_back(st[i].am);
          av.push_back(st[i].av);
        }
        if (master) masters.push_back(st[i].master);
        steps.push_back(st[i].step);
      }
      if (params.empty()) continue;
      if (f == "fp32") {
        torchspeed::AdamStepArgs a;
        a.params = params;
        a.grads = grads;
        a.exp_avgs = m;
        a.exp_avg_sqs = v;
        a.masters = masters;
        a.steps = steps;
        a.lr = h.lr;
        a.weight_decay = h.wd;
        a.decoupled_weight_decay = h.decoupled;
        torchspeed::adam_step_(a);
      } else {
        torchspeed::AdamLowbitStepArgs a;
        a.params = params;
        a.grads = grads;
        a.exp_avgs = m;
        a.exp_avg_sqs = v;
        a.exp_avg_absmaxes = am;
        a.exp_avg_sq_absmaxes = av;
        a.masters = masters;
        a.steps = steps;
        a.state_block = kBlock;
        a.lr = h.lr;
        a.weight_decay = h.wd;
        a.decoupled_weight_decay = h.decoupled;
        torchspeed::adam_lowbit_step_(a);
      }
    }
  }
}

std::vector<std::string> formats_for(const ParamList& ps, const std::string& state_dtype) {
  std::vector<std::string> out;
  for (const auto& p : ps) {
    out.push_back(torchspeed::lowbit_state_format(state_dtype, p.numel(), 4096, kBlock));
  }
  return out;
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

}  // namespace

TEST_CASE("low-bit AdamW/Adam steps equal adam_lowbit_step_ / adam_step_ called directly",
          "[lowbit]") {
  struct Case {
    const char* name;
    std::string state_dtype;
    bool adamw;
  };
  for (const Case& c : {Case{"AdamW int8", "int8", true}, Case{"AdamW bf16", "bf16", true},
                        Case{"Adam int8 (L2 decay)", "int8", false}}) {
    INFO(c.name);
    auto ours = make_params();
    auto ref = clone_params(ours);
    std::unique_ptr<torch::optim::Optimizer> opt;
    if (c.adamw) {
      opt = std::make_unique<AdamW>(
          ours, AdamWOptions(1e-2).weight_decay(0.1).state_dtype(c.state_dtype));
    } else {
      opt = std::make_unique<torchspeed::optim::Adam>(
          ours, AdamOptions(1e-2).weight_decay(0.1).state_dtype(c.state_dtype));
    }
    const auto fmt = formats_for(ours, c.state_dtype);
    std::vector<RefState> st;
    for (size_t i = 0; i < ref.size(); ++i) st.push_back(fresh_state(ref[i], fmt[i]));
    for (int s = 0; s < 6; ++s) {
      set_grads(ours, s);
      set_grads(ref, s);
      opt->step();
      direct_step(ref, st, fmt, Hyper{1e-2, 0.1, c.adamw});
    }
    for (size_t i = 0; i < ours.size(); ++i) {
      INFO("param " << i << " format " << fmt[i]);
      REQUIRE(torch::equal(ours[i].detach(), ref[i].detach()));
      const auto& s = state_of(*opt, ours[i]);
      REQUIRE(s.exp_avg().scalar_type() == st[i].m.scalar_type());
      REQUIRE(s.exp_avg_sq().scalar_type() == st[i].v.scalar_type());
      REQUIRE(torch::equal(s.exp_avg(), st[i].m));
      REQUIRE(torch::equal(s.exp_avg_sq(), st[i].v));
      REQUIRE(s.exp_avg_absmax().defined() == (fmt[i] == "int8"));
      if (fmt[i] == "int8") {
        REQUIRE(s.exp_avg_absmax().numel() == (ours[i].numel() + kBlock - 1) / kBlock);
        REQUIRE(torch::equal(s.exp_avg_absmax(), st[i].am));
        REQUIRE(torch::equal(s.exp_avg_sq_absmax(), st[i].av));
      }
      REQUIRE(s.step().item<float>() == 6.f);
      REQUIRE(s.exp_avg().strides() == ours[i].strides());
      // The step moved the param (a no-op on both sides would also compare equal).
      REQUIRE_FALSE(torch::equal(ours[i].detach(), make_params()[i].detach()));
    }
    // The small param stays fp32 under int8 only; bf16 applies to every size.
    REQUIRE(fmt[2] == (c.state_dtype == "int8" ? "fp32" : "bf16"));
  }
}

TEST_CASE("low-bit save/load round trip resumes exactly; a load converts to the group's format",
          "[lowbit]") {
  for (const std::string state_dtype : {"int8", "bf16"}) {
    INFO(state_dtype);
    auto ps = make_params();
    AdamW opt(ps, AdamWOptions(1e-2).state_dtype(state_dtype).state_block(kBlock));
    for (int s = 0; s < 3; ++s) {
      set_grads(ps, s);
      opt.step();
    }
    const std::string bytes = save_to_string(opt);
    auto copies = clone_params(ps);
    AdamW restored(copies, AdamWOptions(1e-2).state_dtype(state_dtype));
    load_from_string(restored, bytes);
    REQUIRE(static_cast<const AdamWOptions&>(restored.param_groups()[0].options()).state_dtype() ==
            state_dtype);
    for (size_t i = 0; i < ps.size(); ++i)
      require_equal_state(state_of(opt, ps[i]), state_of(restored, copies[i]));
    for (int s = 3; s < 6; ++s) {
      set_grads(ps, s);
      set_grads(copies, s);
      opt.step();
      restored.step();
    }
    for (size_t i = 0; i < ps.size(); ++i) {
      INFO("param " << i);
      REQUIRE(torch::equal(ps[i].detach(), copies[i].detach()));
      require_equal_state(state_of(opt, ps[i]), state_of(restored, copies[i]));
    }

    // Into an fp32 optimizer: the moments are decoded (int8: the step's decoder) to float32.
    auto plain = clone_params(ps);
    AdamW fp32(plain, AdamWOptions(1e-2));
    load_from_string(fp32, save_to_string(opt));
    // A load keeps the optimizer's own state options (Python's _kept_on_load).
    REQUIRE(static_cast<const AdamWOptions&>(fp32.param_groups()[0].options()).state_dtype() ==
            "fp32");
    for (size_t i = 0; i < ps.size(); ++i) {
      const auto& src = state_of(opt, ps[i]);
      const auto& got = state_of(fp32, plain[i]);
      REQUIRE(got.exp_avg().scalar_type() == at::kFloat);
      REQUIRE_FALSE(got.exp_avg_absmax().defined());
      if (src.exp_avg_absmax().defined()) {
        torchspeed::LowbitDecodeArgs d;
        const auto codes = memory_order(src.exp_avg_sq());
        d.codes = codes;
        d.absmax = src.exp_avg_sq_absmax();
        d.state_block = kBlock;
        REQUIRE(torch::equal(memory_order(got.exp_avg_sq()), torchspeed::lowbit_decode(d)));
      } else {
        REQUIRE(torch::equal(got.exp_avg_sq(), src.exp_avg_sq().to(at::kFloat)));
      }
    }
    // And back: fp32 moments into an int8 optimizer are encoded by the step's quantizer.
    auto back = clone_params(ps);
    AdamW int8(back, AdamWOptions(1e-2).state_dtype("int8"));
    load_from_string(int8, save_to_string(fp32));
    for (size_t i : {0, 4}) {  // contiguous and channels_last
      INFO("param " << i);
      const auto& got = state_of(int8, back[i]);
      torchspeed::LowbitEncodeArgs e;
      e.values = memory_order(state_of(fp32, plain[i]).exp_avg());
      e.state_block = kBlock;
      const auto [codes, absmax] = torchspeed::lowbit_encode(e);
      REQUIRE(got.exp_avg().scalar_type() == at::kChar);
      REQUIRE(got.exp_avg().strides() == back[i].strides());
      REQUIRE(torch::equal(memory_order(got.exp_avg()), codes));
      REQUIRE(torch::equal(got.exp_avg_absmax(), absmax));
    }
  }
}

TEST_CASE("bad state options throw the validator's message and change nothing", "[lowbit]") {
  auto ps = make_params();
  struct Bad {
    std::function<void(AdamWOptions&)> set;
    std::string message;
  };
  const std::vector<Bad> bads = {
      {[](AdamWOptions& o) { o.state_dtype("int4"); }, validator_message("int4", 4096, 256)},
      {[](AdamWOptions& o) { o.state_block(100); }, validator_message("int8", 4096, 100)},
      {[](AdamWOptions& o) { o.min_lowbit_numel(-1); }, validator_message("int8", -1, 256)},
      {[](AdamWOptions& o) {
         o.state_dtype("int8");
         o.amsgrad(true);
       },
       "amsgrad needs state_dtype='fp32' (the running maximum of the second moment is kept in "
       "float32), got 'int8'"}};
  REQUIRE(bads[0].message == "state_dtype must be one of 'fp32', 'bf16', 'int8', got 'int4'");
  REQUIRE(bads[1].message == "state_block must be a power of two in [8, 4096], got 100");
  for (const Bad& bad : bads) {
    INFO(bad.message);
    // At construction.
    AdamWOptions o(1e-2);
    o.state_dtype("int8");
    bad.set(o);
    try {
      AdamW opt(ps, o);
      FAIL("constructed with bad options");
    } catch (const c10::ValueError& e) {
      REQUIRE(std::string(e.what()).find("torchspeed.optim.AdamW: " + bad.message) !=
              std::string::npos);
    }
    // In a running optimizer's group (the step checks every group before anything changes), and
    // in a group added later.
    AdamW opt(ps, AdamWOptions(1e-2).state_dtype("int8"));
    set_grads(ps, 0);
    opt.step();
    ParamList before;
    for (const auto& p : ps) before.push_back(p.detach().clone());
    const auto m_before = state_of(opt, ps[0]).exp_avg().clone();
    auto& group = static_cast<AdamWOptions&>(opt.param_groups()[0].options());
    const AdamWOptions saved = group;
    bad.set(group);
    set_grads(ps, 1);
    try {
      opt.step();
      FAIL("stepped with bad options");
    } catch (const c10::ValueError& e) {
      REQUIRE(std::string(e.what()).find("torchspeed.optim.AdamW: param_groups[0]." +
                                         bad.message) != std::string::npos);
    }
    for (size_t i = 0; i < ps.size(); ++i) REQUIRE(torch::equal(ps[i].detach(), before[i]));
    REQUIRE(torch::equal(state_of(opt, ps[0]).exp_avg(), m_before));
    REQUIRE(state_of(opt, ps[0]).step().item<float>() == 1.f);
    group = saved;
    AdamWOptions extra(1e-2);
    extra.state_dtype("int8");
    bad.set(extra);
    REQUIRE_THROWS_AS(
        opt.add_param_group(torch::optim::OptimizerParamGroup(
            {torch::randn({3}).requires_grad_(true)}, std::make_unique<AdamWOptions>(extra))),
        c10::ValueError);
    REQUIRE(opt.param_groups().size() == 1);
  }
}

TEST_CASE("a loaded low-bit state that does not match its group is refused; nothing is loaded",
          "[lowbit]") {
  auto ps = make_params();
  AdamW source(ps, AdamWOptions(1e-2).state_dtype("int8"));
  set_grads(ps, 0);
  source.step();
  auto& st = const_cast<AdamParamState&>(state_of(source, ps[0]));
  const AdamParamState good = st;

  auto copies = clone_params(ps);
  AdamW target(copies, AdamWOptions(1e-2).state_dtype("int8"));
  set_grads(copies, 7);
  target.step();
  std::vector<AdamParamState> before;
  for (const auto& p : copies) {
    const auto& s = state_of(target, p);
    AdamParamState c;
    c.step(s.step().clone());
    c.exp_avg(s.exp_avg().clone());
    c.exp_avg_sq(s.exp_avg_sq().clone());
    if (s.exp_avg_absmax().defined()) {
      c.exp_avg_absmax(s.exp_avg_absmax().clone());
      c.exp_avg_sq_absmax(s.exp_avg_sq_absmax().clone());
    }
    if (s.master().defined()) c.master(s.master().clone());
    before.push_back(c);
  }

  struct Bad {
    const char* what;
    std::function<void(AdamParamState&)> corrupt;
    std::string message;
  };
  const std::string where = "torchspeed.optim.AdamW: state of param_groups[0].params[0].";
  const std::vector<Bad> bads = {
      {"absmax of the wrong length", [](AdamParamState& s) { s.exp_avg_absmax(torch::ones({3})); },
       where + "exp_avg_absmax of an int8 state must be Float with 17 elements (state_block 256), "
               "got Float with 3 elements"},
      {"a float64 absmax (it was cast to float32 before the dtype rule ran)",
       [](AdamParamState& s) { s.exp_avg_absmax(s.exp_avg_absmax().to(at::kDouble)); },
       where + "exp_avg_absmax of an int8 state must be Float with 17 elements (state_block 256), "
               "got Double with 17 elements"},
      {"no step beside the moments (it used to restart at 0)",
       [](AdamParamState& s) { s.step(torch::Tensor()); },
       where + "step must be defined beside the moments (the steps taken), got none"},
      {"a NaN step", [](AdamParamState& s) { s.step(torch::full({}, std::nanf(""))); },
       where + "step must be a finite number >= 0 (the steps taken), got nan"},
      {"a negative step", [](AdamParamState& s) { s.step(torch::full({}, -2.0)); },
       where + "step must be a finite number >= 0 (the steps taken), got -2"},
      {"uint8 first-moment codes", [](AdamParamState& s) { s.exp_avg(s.exp_avg().to(at::kByte)); },
       where + "exp_avg of an int8 state must be Char with 4270 elements"},
      {"a missing absmax", [](AdamParamState& s) { s.exp_avg_sq_absmax(torch::Tensor()); },
       where + "exp_avg_sq_absmax of an int8 state must be Float with 17 elements"},
      {"a negative absmax",
       [](AdamParamState& s) {
         auto a = s.exp_avg_absmax().clone();
         a[2] = -1.0;
         s.exp_avg_absmax(a);
       },
       where + "exp_avg_absmax must hold finite values >= 0"},
      {"a NaN absmax",
       [](AdamParamState& s) {
         auto a = s.exp_avg_sq_absmax().clone();
         a[0] = std::nanf("");
         s.exp_avg_sq_absmax(a);
       },
       where + "exp_avg_sq_absmax must hold finite values >= 0"},
      {"moments of two formats",
       [](AdamParamState& s) {
         s.exp_avg(s.exp_avg().to(at::kFloat).to(at::kBFloat16));
         s.exp_avg_sq(s.exp_avg_sq().to(at::kFloat));
         s.exp_avg_absmax(torch::Tensor());
         s.exp_avg_sq_absmax(torch::Tensor());
       },
       where.substr(0, where.size() - 1) +
           ": exp_avg and exp_avg_sq must have one format, got BFloat16 and Float"}};
  for (const Bad& bad : bads) {
    INFO(bad.what);
    st = good;
    bad.corrupt(st);
    static_cast<AdamWOptions&>(source.param_groups()[0].options()).lr(0.5);
    const std::string bytes = save_to_string(source);
    static_cast<AdamWOptions&>(source.param_groups()[0].options()).lr(1e-2);
    try {
      load_from_string(target, bytes);
      FAIL("loaded " << bad.what);
    } catch (const c10::ValueError& e) {
      INFO(e.what());
      REQUIRE(std::string(e.what()).find(bad.message) != std::string::npos);
    }
    REQUIRE(target.param_groups()[0].options().get_lr() == 1e-2);
    for (size_t i = 0; i < copies.size(); ++i) {
      require_equal_state(state_of(target, copies[i]), before[i]);
    }
  }
  // The good state loads.
  st = good;
  load_from_string(target, save_to_string(source));
  require_equal_state(state_of(target, copies[0]), good);
}

TEST_CASE("a low-bit state loads into a param of another memory layout at the same positions",
          "[lowbit]") {
  // Saved from a contiguous param, loaded for a channels_last one of the same shape: bf16 moments
  // keep their logical positions, int8 codes are decoded in their own memory order (their blocks
  // run over it). Before: both were copied in logical order into the param's memory order.
  for (const std::string format : {"int8", "bf16"}) {
    INFO(format);
    torch::manual_seed(3);
    ParamList src{torch::randn({8, 16, 6, 7}).requires_grad_(true)};
    AdamW source(src, AdamWOptions(1e-2).state_dtype(format));
    set_grads(src, 0);
    source.step();
    const auto& s = state_of(source, src[0]);
    std::vector<torch::Tensor> want;
    for (auto [codes, absmax] : {std::pair{s.exp_avg(), s.exp_avg_absmax()},
                                 std::pair{s.exp_avg_sq(), s.exp_avg_sq_absmax()}}) {
      if (!absmax.defined()) {
        want.push_back(codes.to(at::kFloat));
        continue;
      }
      torchspeed::LowbitDecodeArgs d;
      d.codes = codes.reshape({-1});  // contiguous: memory order is logical order
      d.absmax = absmax;
      d.state_block = kBlock;
      want.push_back(torchspeed::lowbit_decode(d).reshape(codes.sizes()));
    }
    ParamList dst{src[0].detach().contiguous(at::MemoryFormat::ChannelsLast).requires_grad_(true)};
    // Into float32 (exact) and into the same format.
    for (const std::string& target_format : {std::string("fp32"), format}) {
      INFO(target_format);
      AdamW target(dst, AdamWOptions(1e-2).state_dtype(target_format));
      load_from_string(target, save_to_string(source));
      const auto& t = state_of(target, dst[0]);
      REQUIRE(t.exp_avg().is_contiguous(at::MemoryFormat::ChannelsLast));
      const std::vector<std::pair<torch::Tensor, torch::Tensor>> got = {
          {t.exp_avg(), t.exp_avg_absmax()}, {t.exp_avg_sq(), t.exp_avg_sq_absmax()}};
      for (size_t k = 0; k < got.size(); ++k) {
        torch::Tensor value = got[k].first.to(at::kFloat);
        if (got[k].second.defined()) {
          torchspeed::LowbitDecodeArgs d;
          d.codes = memory_order(got[k].first);
          d.absmax = got[k].second;
          d.state_block = kBlock;
          // Back from the channels_last memory order to logical positions.
          value = torchspeed::lowbit_decode(d).reshape({8, 6, 7, 16}).permute({0, 3, 1, 2});
        }
        if (target_format == "int8") {
          // Requantized in the new memory order: within the map's error.
          const auto w = want[k];
          const auto tol = w.abs().max() * std::pow(2.0, -14);
          REQUIRE(((value - w).abs() <= w.abs() / 16 + tol).all().item<bool>());
        } else {
          REQUIRE(torch::equal(value, want[k]));
        }
      }
    }
  }
}

TEST_CASE("float moments with NaN, inf or a negative exp_avg_sq are refused by an int8 load",
          "[lowbit]") {
  // lowbit_encode would map NaN to the block's largest code: the moment would come back finite.
  // An fp32 optimizer loads them as they are, as torch does.
  ParamList src{torch::randn({70, 61}).requires_grad_(true)};
  AdamW source(src, AdamWOptions(1e-2));
  set_grads(src, 0);
  source.step();
  auto& st = const_cast<AdamParamState&>(state_of(source, src[0]));
  const AdamParamState good = st;
  const std::string where = "torchspeed.optim.AdamW: state of param_groups[0].params[0].";
  const std::vector<std::tuple<bool, float, std::string>> bads = {
      {true, std::nanf(""), "exp_avg must be finite to be quantized to int8"},
      {true, INFINITY, "exp_avg must be finite to be quantized to int8"},
      {false, -1.0f, "exp_avg_sq must be finite and >= 0 to be quantized to int8"}};
  for (const auto& [first, value, message] : bads) {
    INFO(message);
    st = good;
    auto t = (first ? st.exp_avg() : st.exp_avg_sq()).clone();
    t.view({-1})[5] = value;
    first ? st.exp_avg(t) : st.exp_avg_sq(t);
    ParamList dst = clone_params(src);
    AdamW target(dst, AdamWOptions(1e-2).state_dtype("int8"));
    try {
      load_from_string(target, save_to_string(source));
      FAIL("loaded");
    } catch (const c10::ValueError& e) {
      INFO(e.what());
      REQUIRE(std::string(e.what()).find(where + message) != std::string::npos);
    }
    REQUIRE(target.state().empty());
    AdamW fp32(dst, AdamWOptions(1e-2));
    load_from_string(fp32, save_to_string(source));
  }
  st = good;
}

TEST_CASE("an int8 state saved with another state_block is decoded with it and converted",
          "[lowbit]") {
  // The archive's group records the block of its codes; load() keeps the optimizer's own and
  // converts (before: refused, "must be Float with 17 elements (state_block 256)", even into an
  // fp32 optimizer).
  ParamList src{torch::randn({70, 61}).requires_grad_(true)};
  AdamW source(src, AdamWOptions(1e-2).state_dtype("int8").state_block(64));
  set_grads(src, 0);
  source.step();
  const auto& s = state_of(source, src[0]);
  std::vector<torch::Tensor> want;
  for (auto [codes, absmax] : {std::pair{s.exp_avg(), s.exp_avg_absmax()},
                               std::pair{s.exp_avg_sq(), s.exp_avg_sq_absmax()}}) {
    torchspeed::LowbitDecodeArgs d;
    d.codes = codes.reshape({-1});
    d.absmax = absmax;
    d.state_block = 64;
    want.push_back(torchspeed::lowbit_decode(d));
  }
  ParamList dst = clone_params(src);
  AdamW into_fp32(dst, AdamWOptions(1e-2));
  load_from_string(into_fp32, save_to_string(source));
  REQUIRE(torch::equal(state_of(into_fp32, dst[0]).exp_avg().reshape({-1}), want[0]));
  REQUIRE(torch::equal(state_of(into_fp32, dst[0]).exp_avg_sq().reshape({-1}), want[1]));
  REQUIRE(into_fp32.param_groups()[0].options().get_lr() == 1e-2);

  AdamW into_int8(dst, AdamWOptions(1e-2).state_dtype("int8"));  // state_block 256
  load_from_string(into_int8, save_to_string(source));
  const auto& t = state_of(into_int8, dst[0]);
  REQUIRE(static_cast<const AdamWOptions&>(into_int8.param_groups()[0].options()).state_block() ==
          256);
  for (int k = 0; k < 2; ++k) {
    torchspeed::LowbitEncodeArgs e;
    e.values = want[k];
    e.is_signed = k == 0;
    e.state_block = 256;
    const auto [codes, absmax] = torchspeed::lowbit_encode(e);
    REQUIRE(torch::equal((k == 0 ? t.exp_avg() : t.exp_avg_sq()).reshape({-1}), codes));
    REQUIRE(torch::equal(k == 0 ? t.exp_avg_absmax() : t.exp_avg_sq_absmax(), absmax));
  }
  set_grads(dst, 1);
  into_int8.step();  // and it steps
}

TEST_CASE("low-bit moments of a non-CPU param get the step's layout on that device", "[lowbit]") {
  // No GPU here: meta params go through the Meta kernel (shapes and dtypes, no data), the path a
  // CUDA param takes up to its kernel (kernels/cuda/optim_lowbit.cu).
  ParamList ps = {torch::zeros({10}, torch::kMeta).requires_grad_(true),
                  torch::zeros({5000}, torch::kMeta).requires_grad_(true)};
  for (auto& p : ps) p.mutable_grad() = torch::zeros_like(p);
  AdamW opt(ps, AdamWOptions(1e-2).state_dtype("int8"));
  opt.step();
  const auto& small = state_of(opt, ps[0]);
  const auto& big = state_of(opt, ps[1]);
  REQUIRE(small.exp_avg().scalar_type() == torch::kFloat);  // under min_lowbit_numel
  REQUIRE(big.exp_avg().scalar_type() == torch::kChar);
  REQUIRE(big.exp_avg_sq().scalar_type() == torch::kByte);
  REQUIRE(big.exp_avg_absmax().numel() == (5000 + 255) / 256);
  REQUIRE(big.exp_avg().device().is_meta());
}
