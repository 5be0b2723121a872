// The C++ ZeRO-1 front: torchspeed::dist::ZeroOptimizer over AccumulatingDDP(zero=1) on 2 Gloo
// ranks (threads around one c10d::HashStore), against the unsharded single-process step with the
// same optimizer: torchspeed's fused AdamW (float32) and torch::optim::AdamW (float64), on Gloo's
// default all-reduce path and its native all_gather path; each rank holds state for its shard only.
// Checkpoints: state dicts in Python's v2 layout re-shard across world sizes (1, 2 and 4 thread
// ranks) and continue bit-identically; Python-style dicts load; bad states load nothing.
#include <torch/torch.h>

#include <cmath>
#include <cstdlib>
#include <limits>
#include <map>
#include <string>
#include <thread>
#include <torch/csrc/distributed/c10d/HashStore.hpp>
#include <vector>

#include "catch_shim.h"
#include "test_net.h"
#include "torchspeed/dist/ddp.h"
#include "torchspeed/dist/zero.h"
#include "torchspeed/ops/optim.h"
#include "torchspeed/optim/adam.h"
#include "torchspeed/optim/lamb.h"

namespace tsd = torchspeed::dist;

namespace {

constexpr int kWorld = 2, kMicro = 2, kSteps = 3;

using torchspeed::test::make_net;

std::pair<torch::Tensor, torch::Tensor> batch(int step, int rank, int micro, torch::Dtype dtype) {
  auto i = torch::arange(5 * 6, torch::kFloat64).reshape({5, 6});
  const double t = step + 0.5 * rank + 0.25 * micro;
  auto x = torch::cos(0.29 * i + t);
  return {x.to(dtype), torch::sin(x.slice(1, 0, 3) - x.slice(1, 3, 6)).to(dtype)};
}

// int8 moments in blocks of kBlock, from kBlock elements on (smaller pieces keep float32 ones).
constexpr int64_t kBlock = 8;

// The optimizer under test, over any params: torchspeed's fused AdamW (int8: with int8 moments)
// or torch's.
std::unique_ptr<torch::optim::Optimizer> make_opt(bool fused, std::vector<torch::Tensor> params,
                                                  bool int8 = false, bool lamb = false) {
  if (lamb) {
    return std::make_unique<torchspeed::optim::LAMB>(
        std::move(params), torchspeed::optim::LAMBOptions(1e-2).weight_decay(0.1));
  }
  if (fused) {
    auto options = torchspeed::optim::AdamWOptions(1e-2).weight_decay(0.1);
    if (int8) options.state_dtype("int8").state_block(kBlock).min_lowbit_numel(kBlock);
    return std::make_unique<torchspeed::optim::AdamW>(std::move(params), options);
  }
  return std::make_unique<torch::optim::AdamW>(std::move(params),
                                               torch::optim::AdamWOptions(1e-2).weight_decay(0.1));
}

struct RankResult {
  std::vector<torch::Tensor> params;
  int64_t piece_numel = 0;  // elements this rank's optimizers own
  int64_t param_numel = 0;
  int64_t shard_numel = 0;
  tsd::ZeroStats stats;
  std::string collectives;
  std::string error;
};

RankResult run_rank(int rank, const c10::intrusive_ptr<c10d::Store>& store, bool fused,
                    torch::Dtype dtype, bool lamb) {
  RankResult out;
  try {
    auto group = tsd::new_gloo_group(store, rank, kWorld, std::chrono::seconds(60));
    auto net = make_net(dtype);
    tsd::AccumulatingDDP ddp(*net, group,
                             tsd::DDPOptions()
                                 .accumulation_steps(kMicro)
                                 .bucket_cap_mb(0.0015)
                                 .first_bucket_cap_mb(0.0005)
                                 .zero(1));
    tsd::ZeroOptimizer opt(ddp, [fused, lamb](std::vector<torch::Tensor> pieces) {
      return make_opt(fused, std::move(pieces), false, lamb);
    });
    for (int step = 0; step < kSteps; ++step) {
      for (int j = 0; j < kMicro; ++j) {
        ddp.begin_micro_step();
        auto [x, y] = batch(step, rank, j, dtype);
        (torch::mse_loss(net->forward(x), y) / kMicro).backward();
      }
      if (!ddp.sync_now()) throw std::runtime_error("sync_now false at the window's end");
      if (!opt.step()) throw std::runtime_error("a finite step was skipped");
      opt.zero_grad();
    }
    for (auto& p : net->parameters()) {
      out.params.push_back(p.detach().clone());
      out.param_numel += p.numel();
    }
    for (int64_t b = 0; b < opt.shards().num_buckets(); ++b) {
      out.shard_numel += opt.shards().shard_numel(b);
      for (const auto& piece : opt.shards().pieces(b)) out.piece_numel += piece.numel();
      auto* o = opt.optimizer(b);
      if (o != nullptr && o->state().size() != opt.shards().pieces(b).size()) {
        throw std::runtime_error("an optimizer holds state for params outside its shard");
      }
    }
    out.stats = opt.shards().stats();
    out.collectives = opt.shards().collectives();
  } catch (const std::exception& e) {
    out.error = e.what();
  }
  return out;
}

std::vector<torch::Tensor> reference(bool fused, torch::Dtype dtype, bool lamb) {
  auto net = make_net(dtype);
  auto opt = make_opt(fused, net->parameters(), false, lamb);
  for (int step = 0; step < kSteps; ++step) {
    for (int r = 0; r < kWorld; ++r) {
      for (int j = 0; j < kMicro; ++j) {
        auto [x, y] = batch(step, r, j, dtype);
        (torch::mse_loss(net->forward(x), y) / (kMicro * kWorld)).backward();
      }
    }
    opt->step();
    opt->zero_grad();
  }
  std::vector<torch::Tensor> out;
  for (auto& p : net->parameters()) out.push_back(p.detach().clone());
  return out;
}

void check_against_reference(bool fused, torch::Dtype dtype, const char* collectives, double rtol,
                             bool lamb = false) {
  setenv("GLOO_SOCKET_IFNAME", "lo", 0);
  setenv("TORCHSPEED_ZERO_COLLECTIVES", collectives, 1);
  auto store = c10::make_intrusive<c10d::HashStore>();
  RankResult results[kWorld];
  std::vector<std::thread> threads;
  for (int r = 0; r < kWorld; ++r) {
    threads.emplace_back([&, r] { results[r] = run_rank(r, store, fused, dtype, lamb); });
  }
  for (auto& t : threads) t.join();
  unsetenv("TORCHSPEED_ZERO_COLLECTIVES");
  const auto ref = reference(fused, dtype, lamb);
  int64_t pieces_total = 0;
  for (int r = 0; r < kWorld; ++r) {
    INFO("rank " << r << " (" << collectives << "): " << results[r].error);
    REQUIRE(results[r].error.empty());
    const std::string want = std::string(collectives) == "native" ? "reduce_scatter" : "all_reduce";
    CHECK(results[r].collectives == want);
    REQUIRE(results[r].params.size() == ref.size());
    for (size_t i = 0; i < ref.size(); ++i) {
      const double err = (results[r].params[i] - ref[i]).abs().max().item<double>();
      const double mag = ref[i].abs().max().item<double>();
      INFO("param " << i << ": max error " << err << ", max |value| " << mag);
      CHECK(err <= rtol * mag);
    }
    CHECK(results[r].stats.zero_steps == kSteps);
    CHECK(results[r].stats.zero_skipped_steps == 0);
    // State for 1/world of the elements, plus less than one padding block per bucket.
    CHECK(results[r].piece_numel <= results[r].shard_numel);
    CHECK(results[r].shard_numel * kWorld - results[r].param_numel < 8 * kWorld);
    pieces_total += results[r].piece_numel;
  }
  CHECK(pieces_total == results[0].param_numel);  // every element on exactly one rank
}

}  // namespace

TEST_CASE("ZeroOptimizer (C++) with torchspeed's fused AdamW equals the unsharded step") {
  check_against_reference(/*fused=*/true, torch::kFloat32, "all_reduce", 1e-5);
  check_against_reference(/*fused=*/true, torch::kFloat32, "native", 1e-5);
}

TEST_CASE("ZeroOptimizer (C++) with torchspeed's LAMB equals the unsharded step") {
  // Each param's trust ratio from the norms of all of its pieces (summed across the ranks).
  check_against_reference(/*fused=*/true, torch::kFloat32, "all_reduce", 1e-5, /*lamb=*/true);
  check_against_reference(/*fused=*/true, torch::kFloat32, "native", 1e-5, /*lamb=*/true);
}

TEST_CASE("ZeroOptimizer (C++) with torch::optim::AdamW in float64 equals the unsharded step") {
  check_against_reference(/*fused=*/false, torch::kFloat64, "all_reduce", 1e-12);
}

TEST_CASE("ZeroOptimizer (C++) refuses an AccumulatingDDP without zero=1 and no factory") {
  setenv("GLOO_SOCKET_IFNAME", "lo", 0);
  auto store = c10::make_intrusive<c10d::HashStore>();
  auto group = tsd::new_gloo_group(store, 0, 1);
  auto net = make_net(torch::kFloat32);
  tsd::AccumulatingDDP ddp(*net, group);
  try {
    tsd::ZeroOptimizer opt(ddp, [](std::vector<torch::Tensor> p) { return make_opt(true, p); });
    FAIL("no error");
  } catch (const c10::ValueError& e) {
    CHECK_THAT(std::string(e.what_without_backtrace()),
               Catch::Matchers::Contains("must be built with zero=1, got zero=0"));
  }
  tsd::AccumulatingDDP sharded(*net, group, tsd::DDPOptions().zero(1));
  try {
    tsd::ZeroOptimizer opt(sharded, tsd::ZeroOptimizer::Factory());
    FAIL("no error");
  } catch (const c10::ValueError& e) {
    CHECK_THAT(std::string(e.what_without_backtrace()),
               Catch::Matchers::Contains("make_optimizer must be a callable"));
  }
}

// ---- checkpoints: state_dict / load_state_dict across world sizes
// --------------------------------

namespace {

constexpr int kGlobalMicro = 4, kResumeSteps = 4, kSaveAt = 2;

// Micro-batch g of the global batch of one step: world w runs kGlobalMicro / w micro-steps per
// rank, so every world size trains on the same samples.
std::pair<torch::Tensor, torch::Tensor> global_batch(int step, int g, torch::Dtype dtype) {
  auto i = torch::arange(5 * 6, torch::kFloat64).reshape({5, 6});
  auto x = torch::cos(0.29 * i + step + 0.37 * g);
  return {x.to(dtype), torch::sin(x.slice(1, 0, 3) - x.slice(1, 3, 6)).to(dtype)};
}

struct Resume {
  explicit Resume(int world = 2, int from = 0, int to = kResumeSteps, bool fused = false,
                  std::vector<torch::Tensor> params = {}, std::vector<c10::IValue> state = {},
                  bool own = false)
      : world(world),
        from(from),
        to(to),
        fused(fused),
        params(std::move(params)),
        state(std::move(state)),
        own(own) {}
  int world;
  int from, to;
  bool fused;
  std::vector<torch::Tensor> params;  // the model at `from` (empty: its initial values)
  std::vector<c10::IValue> state;     // what every rank loads (empty: nothing)
  bool own;                           // each rank loads state[rank] alone
  bool int8 = false;                  // fused AdamW with int8 moments (make_opt)
};

struct ResumeOut {
  std::vector<torch::Tensor> params, saved_params;
  c10::IValue saved, last;  // the state dict at kSaveAt, and at the end
  std::string error;
};

torch::Dtype dtype_of(bool fused) { return fused ? torch::kFloat32 : torch::kFloat64; }

ResumeOut resume_rank(const Resume& run, int rank, const c10::intrusive_ptr<c10d::Store>& store) {
  ResumeOut out;
  try {
    auto group = tsd::new_gloo_group(store, rank, run.world, std::chrono::seconds(60));
    auto net = make_net(dtype_of(run.fused));
    const int k = kGlobalMicro / run.world;
    tsd::AccumulatingDDP ddp(*net, group,
                             tsd::DDPOptions()
                                 .accumulation_steps(k)
                                 .bucket_cap_mb(0.0015)
                                 .first_bucket_cap_mb(0.0005)
                                 .zero(1));
    tsd::ZeroOptimizer opt(ddp, [&](std::vector<torch::Tensor> pieces) {
      return make_opt(run.fused, std::move(pieces), run.int8);
    });
    if (!run.params.empty()) {
      torch::NoGradGuard no_grad;
      auto ps = net->parameters();
      for (size_t i = 0; i < ps.size(); ++i) ps[i].copy_(run.params[i]);
    }
    if (!run.state.empty()) {
      opt.load_state_dict(run.own ? std::vector<c10::IValue>{run.state[rank]} : run.state);
    }
    const auto snapshot = [&] {
      std::vector<torch::Tensor> v;
      for (auto& p : net->parameters()) v.push_back(p.detach().clone());
      return v;
    };
    for (int step = run.from; step < run.to; ++step) {
      for (int j = 0; j < k; ++j) {
        ddp.begin_micro_step();
        auto [x, y] = global_batch(step, rank * k + j, dtype_of(run.fused));
        (torch::mse_loss(net->forward(x), y) / k).backward();
      }
      if (!opt.step()) throw std::runtime_error("a finite step was skipped");
      opt.zero_grad();
      if (step + 1 == kSaveAt) {
        out.saved = opt.state_dict().deepcopy();
        out.saved_params = snapshot();
      }
    }
    out.params = snapshot();
    out.last = opt.state_dict().deepcopy();
  } catch (const std::exception& e) {
    out.error = e.what();
  }
  return out;
}

std::vector<ResumeOut> resume_world(const Resume& run) {
  setenv("GLOO_SOCKET_IFNAME", "lo", 0);
  auto store = c10::make_intrusive<c10d::HashStore>();
  std::vector<ResumeOut> out(run.world);
  std::vector<std::thread> threads;
  for (int r = 0; r < run.world; ++r) {
    threads.emplace_back([&, r] { out[r] = resume_rank(run, r, store); });
  }
  for (auto& t : threads) t.join();
  for (int r = 0; r < run.world; ++r) {
    INFO("world " << run.world << " rank " << r << ": " << out[r].error);
    REQUIRE(out[r].error.empty());
  }
  return out;
}

std::vector<c10::IValue> saved_of(const std::vector<ResumeOut>& ranks, bool last = false) {
  std::vector<c10::IValue> out;
  for (const auto& r : ranks) out.push_back(last ? r.last : r.saved);
  return out;
}

// Plain single-process training over the same global batches.
std::vector<torch::Tensor> plain_reference(bool fused) {
  auto net = make_net(dtype_of(fused));
  auto opt = make_opt(fused, net->parameters());
  for (int step = 0; step < kResumeSteps; ++step) {
    for (int g = 0; g < kGlobalMicro; ++g) {
      auto [x, y] = global_batch(step, g, dtype_of(fused));
      (torch::mse_loss(net->forward(x), y) / kGlobalMicro).backward();
    }
    opt->step();
    opt->zero_grad();
  }
  std::vector<torch::Tensor> out;
  for (auto& p : net->parameters()) out.push_back(p.detach().clone());
  return out;
}

void require_equal(const std::vector<torch::Tensor>& got, const std::vector<torch::Tensor>& want,
                   const std::string& what) {
  REQUIRE(got.size() == want.size());
  for (size_t i = 0; i < want.size(); ++i) {
    INFO(what << ": param " << i << " differs by "
              << (got[i] - want[i]).abs().max().item<double>());
    CHECK(torch::equal(got[i], want[i]));
  }
}

void require_close(const std::vector<torch::Tensor>& got, const std::vector<torch::Tensor>& want,
                   double rtol, const std::string& what) {
  REQUIRE(got.size() == want.size());
  for (size_t i = 0; i < want.size(); ++i) {
    const double err = (got[i] - want[i]).abs().max().item<double>();
    INFO(what << ": param " << i << " max error " << err);
    CHECK(err <= rtol * want[i].abs().max().item<double>());
  }
}

// The whole run's checkpoints: 2 ranks save at step 2; their state goes 2 -> 1 -> 2 and
// 2 -> 4 -> 2 (loaded, written again at the other world size, loaded back) and each continues
// bit-identically to the 2-rank run that never stopped, as does each rank reloading its own dict;
// 2 -> 1 and 2 -> 4 continue to the single-process result.
void check_resharding(bool fused) {
  const double rtol = fused ? 1e-5 : 1e-12;
  const auto full = resume_world(Resume{2, 0, kResumeSteps, fused});
  const auto state2 = saved_of(full);
  const auto params2 = full[0].saved_params;
  const auto want = full[0].params;
  const auto ref = plain_reference(fused);
  require_close(want, ref, rtol, "2 ranks against one process");

  const auto own = resume_world(Resume{2, kSaveAt, kResumeSteps, fused, params2, state2, true});
  for (const auto& r : own) require_equal(r.params, want, "2 -> 2, each rank its own dict");

  const auto on1 = resume_world(Resume{1, kSaveAt, kSaveAt, fused, params2, state2});
  const auto back_from_1 =
      resume_world(Resume{2, kSaveAt, kResumeSteps, fused, params2, saved_of(on1, true)});
  for (const auto& r : back_from_1) require_equal(r.params, want, "2 -> 1 -> 2");

  const auto on4 = resume_world(Resume{4, kSaveAt, kSaveAt, fused, params2, state2});
  const auto back_from_4 =
      resume_world(Resume{2, kSaveAt, kResumeSteps, fused, params2, saved_of(on4, true)});
  for (const auto& r : back_from_4) require_equal(r.params, want, "2 -> 4 -> 2");

  for (int world : {1, 4}) {
    const auto cont = resume_world(Resume{world, kSaveAt, kResumeSteps, fused, params2, state2});
    for (const auto& r : cont) {
      require_close(r.params, ref, rtol, "2 -> " + std::to_string(world) + " continued");
    }
  }
}

// A state dict as Python's ZeroOptimizer over torch.optim.AdamW writes it: each step count a 0-dim
// float32 tensor, and the options torch.optim has beyond torch::optim's.
c10::IValue python_style(const c10::IValue& d) {
  c10::IValue out = d.deepcopy();
  for (const auto& shard : out.toGenericDict().at("shards").toListRef()) {
    for (const auto& item : shard.toGenericDict().at("state").toGenericDict()) {
      auto st = item.value().toGenericDict();
      st.insert_or_assign("step", torch::tensor(static_cast<float>(st.at("step").toInt())));
    }
    for (const auto& g : shard.toGenericDict().at("param_groups").toListRef()) {
      auto group = g.toGenericDict();
      group.insert_or_assign("foreach", c10::IValue());
      group.insert_or_assign("maximize", false);
      group.insert_or_assign("decoupled_weight_decay", true);
    }
  }
  return out;
}

// A 1-rank ZeroOptimizer over the test net with the checkpoints' buckets, for the refusal tests.
struct OneRank {
  explicit OneRank(bool fused, bool int8 = false)
      : group(make_group()),
        net(make_net(dtype_of(fused))),
        ddp(*net, group,
            tsd::DDPOptions()
                .accumulation_steps(kGlobalMicro)
                .bucket_cap_mb(0.0015)
                .first_bucket_cap_mb(0.0005)
                .zero(1)),
        opt(ddp, [fused, int8](std::vector<torch::Tensor> p) {
          return make_opt(fused, std::move(p), int8);
        }) {}
  static c10::intrusive_ptr<c10d::ProcessGroup> make_group() {
    setenv("GLOO_SOCKET_IFNAME", "lo", 0);
    return tsd::new_gloo_group(c10::make_intrusive<c10d::HashStore>(), 0, 1);
  }
  c10::intrusive_ptr<c10d::ProcessGroup> group;
  torch::nn::Sequential net;
  tsd::AccumulatingDDP ddp;
  tsd::ZeroOptimizer opt;
};

std::string load_error(tsd::ZeroOptimizer& opt, const std::vector<c10::IValue>& dicts) {
  try {
    opt.load_state_dict(dicts);
  } catch (const c10::Error& e) {
    return e.what_without_backtrace();
  }
  return "no error";
}

}  // namespace

TEST_CASE("ZeroOptimizer (C++) state dicts re-shard 2 -> 1 -> 2 and 2 -> 4 -> 2 bit-identically") {
  SECTION("torch::optim::AdamW, float64") { check_resharding(/*fused=*/false); }
  SECTION("torchspeed's fused AdamW, float32") { check_resharding(/*fused=*/true); }
}

TEST_CASE("ZeroOptimizer (C++) state dicts have Python's v2 layout and pickle") {
  const auto run = resume_world(Resume{2, 0, kSaveAt, false});
  const auto d = run[1].last.toGenericDict();
  CHECK(d.at("format").toStringRef() == "torchspeed.dist.zero1/v2");
  CHECK(d.at("world_size").toInt() == 2);
  CHECK(d.at("rank").toInt() == 1);
  CHECK(d.at("optimizer_class").toStringRef() == "torch::optim::AdamW");
  const auto layout = d.at("layout").toListRef();
  REQUIRE(layout.size() >= 2);
  CHECK(layout[0].toGenericDict().at("dtype").toStringRef() == "torch.float64");
  // Every piece's state: AdamW's names, elementwise tensors as long as the piece.
  const auto shards = d.at("shards").toListRef();
  int64_t pieces = 0;
  for (size_t b = 0; b < shards.size(); ++b) {
    const auto rows = layout[b].toGenericDict().at("pieces").toListRef();
    for (const auto& item : shards[b].toGenericDict().at("state").toGenericDict()) {
      const auto st = item.value().toGenericDict();
      const int64_t n = rows[item.key().toInt()].toListRef()[2].toInt();
      CHECK(st.at("exp_avg").toTensor().numel() == n);
      CHECK(st.at("exp_avg_sq").toTensor().numel() == n);
      CHECK(st.at("step").toInt() == kSaveAt);
      ++pieces;
    }
  }
  CHECK(pieces > 0);
  // torch::pickle_save / pickle_load (torch.save / torch.load's format) keep it whole.
  const c10::IValue back = torch::pickle_load(torch::pickle_save(run[1].last));
  const auto again =
      resume_world(Resume{2, kSaveAt, kSaveAt, false, run[0].params, {run[0].last, back}});
  CHECK(again[1].last.toGenericDict().at("rank").toInt() == 1);
}

TEST_CASE("ZeroOptimizer (C++) load_state_dict refuses bad states and loads nothing of them") {
  const auto run = resume_world(Resume{2, 0, kSaveAt, false});
  const auto two = saved_of(run, true);
  OneRank one(/*fused=*/false);
  tsd::ZeroOptimizer& opt = one.opt;
  opt.load_state_dict(two);  // 2 -> 1: the state to keep through every refusal below
  const auto before = torch::pickle_save(opt.state_dict());
  using Catch::Matchers::Contains;

  CHECK_THAT(load_error(opt, {}), Contains("state_dicts must hold this rank's state dict"));
  CHECK_THAT(load_error(opt, {c10::IValue(int64_t{3})}), Contains("state_dicts[0] must be a dict"));
  auto wrong_format = two[0].deepcopy();
  wrong_format.toGenericDict().insert_or_assign("format", std::string("torchspeed.dist.zero1/v1"));
  CHECK_THAT(load_error(opt, {wrong_format, two[1]}),
             Contains("state_dicts[0] must be a ZeroOptimizer state dict (format "
                      "torchspeed.dist.zero1/v2), got format torchspeed.dist.zero1/v1"));
  CHECK_THAT(
      load_error(opt, {two[0]}),
      Contains("re-sharding a world size 2 checkpoint needs every rank's state dict, got 1"));
  CHECK_THAT(load_error(opt, {two[1], two[0]}),
             Contains("in rank order, got rank 1 of world size 2 at index 0"));
  auto other_net = torch::nn::Sequential(torch::nn::Linear(6, 3));
  other_net->to(torch::kFloat64);
  tsd::AccumulatingDDP other_ddp(*other_net, one.group, tsd::DDPOptions().zero(1));
  tsd::ZeroOptimizer other(other_ddp,
                           [](std::vector<torch::Tensor> p) { return make_opt(false, p); });
  CHECK_THAT(load_error(other, two),
             Contains("must be written for this model and bucket layout, got another"));
  // A piece whose exp_avg is cut short, in the last bucket: found before anything is loaded.
  auto short_state = two[1].deepcopy();
  auto shards = short_state.toGenericDict().at("shards").toListRef();
  bool cut = false;
  for (size_t b = shards.size(); b-- > 0 && !cut;) {
    for (const auto& item : shards[b].toGenericDict().at("state").toGenericDict()) {
      auto st = item.value().toGenericDict();
      const auto t = st.at("exp_avg").toTensor();
      st.insert_or_assign("exp_avg", t.narrow(0, 0, t.numel() - 1).clone());
      cut = true;
      break;
    }
  }
  REQUIRE(cut);
  CHECK_THAT(load_error(opt, {two[0], short_state}),
             Contains("must be elementwise in every piece"));
  auto own = opt.state_dict().deepcopy();
  own.toGenericDict().insert_or_assign("rank", int64_t{1});
  own.toGenericDict().insert_or_assign("world_size", int64_t{1});
  CHECK_THAT(load_error(opt, {own}), Contains("state_dicts[0] must be rank 0's shard"));
  CHECK(torch::pickle_save(opt.state_dict()) == before);  // nothing half-loaded
}

TEST_CASE("ZeroOptimizer (C++) loads state dicts written by Python's ZeroOptimizer") {
  const auto full = resume_world(Resume{2, 0, kResumeSteps, false});
  std::vector<c10::IValue> python;
  for (const auto& r : full) python.push_back(python_style(r.saved));
  const auto cont =
      resume_world(Resume{2, kSaveAt, kResumeSteps, false, full[0].saved_params, python});
  for (const auto& r : cont) require_equal(r.params, full[0].params, "Python's dicts -> C++");
}

TEST_CASE("ZeroOptimizer (C++) load_state_dict puts every bucket back when one optimizer refuses") {
  const auto run = resume_world(Resume{2, 0, kSaveAt, /*fused=*/true});
  const auto two = saved_of(run, true);
  OneRank one(/*fused=*/true);
  tsd::ZeroOptimizer& opt = one.opt;
  REQUIRE(opt.shards().num_buckets() >= 2);
  opt.load_state_dict(two);  // 2 -> 1: the state to keep through the refusal below
  const auto before = torch::pickle_save(opt.state_dict());
  // The last bucket's options carry a negative lr, which the fused AdamW refuses when it loads
  // them, after the buckets before it have loaded theirs.
  std::vector<c10::IValue> bad;
  for (const auto& d : two) {
    c10::IValue copy = d.deepcopy();
    const auto shards = copy.toGenericDict().at("shards").toListRef();
    for (const auto& g : shards.back().toGenericDict().at("param_groups").toListRef()) {
      g.toGenericDict().insert_or_assign("lr", -1.0);
    }
    bad.push_back(copy);
  }
  using Catch::Matchers::Contains;
  const std::string err = load_error(opt, bad);
  CHECK_THAT(err, Contains("every bucket's optimizer must accept its state and options by name"));
  CHECK_THAT(err, Contains("nothing was loaded"));
  CHECK(torch::pickle_save(opt.state_dict()) == before);
}

// ---- a rank whose shard is padding only
// ------------------------------------------------------------

namespace {

struct EmptyRankOut {
  std::vector<torch::Tensor> params;
  std::vector<bool> stepped;  // per step: opt.step()'s result
  std::vector<double> flag;   // per step: the nonfinite flag after backward (NaN: undefined)
  int64_t owned = 0;
  std::string error;
};

torch::nn::Sequential tiny_net() {  // 9 elements: on 4 ranks rank 3's shard is padding only
  torch::nn::Sequential net(torch::nn::Linear(8, 1), torch::nn::Tanh());
  net->to(torch::kFloat64);
  torch::NoGradGuard no_grad;
  int i = 0;
  for (auto& p : net->parameters()) {
    p.copy_((0.3 * torch::cos(torch::arange(p.numel(), torch::kFloat64) + ++i)).reshape(p.sizes()));
  }
  return net;
}

std::pair<torch::Tensor, torch::Tensor> tiny_batch(int step, int rank) {
  auto x = torch::sin(0.7 * torch::arange(5 * 8, torch::kFloat64).reshape({5, 8}) + step + rank);
  if (step == 1 && rank == 0) x[0][0] = std::numeric_limits<double>::infinity();
  return {x, torch::cos(x.sum(1, true))};
}

EmptyRankOut empty_rank(int rank, const c10::intrusive_ptr<c10d::Store>& store) {
  EmptyRankOut out;
  try {
    auto group = tsd::new_gloo_group(store, rank, 4, std::chrono::seconds(60));
    auto net = tiny_net();
    tsd::AccumulatingDDP ddp(*net, group, tsd::DDPOptions().zero(1));
    tsd::ZeroOptimizer opt(ddp, [](std::vector<torch::Tensor> p) { return make_opt(false, p); });
    for (int64_t b = 0; b < opt.shards().num_buckets(); ++b) {
      for (const auto& piece : opt.shards().pieces(b)) out.owned += piece.numel();
    }
    for (int step = 0; step < 3; ++step) {
      ddp.begin_micro_step();
      auto [x, y] = tiny_batch(step, rank);
      torch::mse_loss(net->forward(x), y).backward();
      const auto& flag = opt.shards().nonfinite_flag();
      out.flag.push_back(flag.defined() ? flag.item<double>() : std::nan(""));
      out.stepped.push_back(opt.step());
      opt.zero_grad();
    }
    for (auto& p : net->parameters()) out.params.push_back(p.detach().clone());
  } catch (const std::exception& e) {
    out.error = e.what();
  }
  return out;
}

}  // namespace

TEST_CASE(
    "ZeroOptimizer (C++): a rank that owns no element skips with the others and steps equal") {
  setenv("GLOO_SOCKET_IFNAME", "lo", 0);
  auto store = c10::make_intrusive<c10d::HashStore>();
  std::vector<EmptyRankOut> out(4);
  std::vector<std::thread> threads;
  for (int r = 0; r < 4; ++r) threads.emplace_back([&, r] { out[r] = empty_rank(r, store); });
  for (auto& t : threads) t.join();
  // One process: the mean over the 4 ranks' batches, step 1 skipped (its gradient is not finite).
  auto net = tiny_net();
  auto ref_opt = make_opt(false, net->parameters());
  for (int step = 0; step < 3; ++step) {
    for (int r = 0; r < 4; ++r) {
      auto [x, y] = tiny_batch(step, r);
      (torch::mse_loss(net->forward(x), y) / 4).backward();
    }
    if (step != 1) ref_opt->step();
    ref_opt->zero_grad();
  }
  std::vector<torch::Tensor> ref;
  for (auto& p : net->parameters()) ref.push_back(p.detach().clone());
  for (int r = 0; r < 4; ++r) {
    INFO("rank " << r << ": " << out[r].error);
    REQUIRE(out[r].error.empty());
    CHECK(out[r].stepped == std::vector<bool>{true, false, true});
    CHECK((out[r].owned == 0) == (r == 3));
    if (r == 3) {  // the flag GradScaler sees on the empty rank: inf exactly when all skip
      CHECK(out[r].flag[0] == 0.0);
      CHECK(std::isinf(out[r].flag[1]));
      CHECK(out[r].flag[2] == 0.0);
    } else {
      CHECK(std::isnan(out[r].flag[0]));  // undefined: its pieces carry the inf
    }
    require_close(out[r].params, ref, 1e-12, "rank " + std::to_string(r));
  }
}

// ---- int8 optimizer states across world sizes -------------------------------------------------

namespace {

// [slot, offset, numel] of piece k of bucket b in a state dict's layout.
std::vector<int64_t> piece_row(const c10::IValue& d, size_t b, int64_t k) {
  const auto layout = d.toGenericDict().at("layout").toListRef();
  return layout[b].toGenericDict().at("pieces").toListRef()[k].toIntVector();
}

// Per param slot and moment: every element's float32 value in the state dicts `dicts` (int8
// codes decoded piece by piece with the pieces' own blocks; float32 as stored).
std::map<int64_t, std::map<std::string, torch::Tensor>> moments_per_element(
    const std::vector<c10::IValue>& dicts) {
  std::map<int64_t, std::map<std::string, std::map<int64_t, torch::Tensor>>> parts;
  for (const auto& d : dicts) {
    const auto shards = d.toGenericDict().at("shards").toListRef();
    for (size_t b = 0; b < shards.size(); ++b) {
      for (const auto& item : shards[b].toGenericDict().at("state").toGenericDict()) {
        const auto row = piece_row(d, b, item.key().toInt());
        const auto st = item.value().toGenericDict();
        for (const std::string key : {"exp_avg", "exp_avg_sq"}) {
          torch::Tensor v = st.at(key).toTensor();
          if (st.contains(key + "_absmax")) {
            torchspeed::LowbitDecodeArgs a;
            a.codes = v;
            a.absmax = st.at(key + "_absmax").toTensor();
            a.state_block = kBlock;
            v = torchspeed::lowbit_decode(a);
          }
          parts[row[0]][key][row[1]] = v.to(torch::kFloat32);
        }
      }
    }
  }
  std::map<int64_t, std::map<std::string, torch::Tensor>> out;
  for (const auto& [slot, keys] : parts) {
    for (const auto& [key, by_offset] : keys) {
      std::vector<torch::Tensor> cat;
      for (const auto& [off, v] : by_offset) cat.push_back(v);
      out[slot][key] = torch::cat(cat);
    }
  }
  return out;
}

}  // namespace

TEST_CASE("ZeroOptimizer (C++) re-shards int8 optimizer states by decoding and re-quantizing") {
  Resume base;
  base.fused = true;
  base.int8 = true;
  const auto full = resume_world(base);
  const auto state2 = saved_of(full);
  const auto want = full[0].params;

  Resume own = base;
  own.from = kSaveAt;
  own.params = full[0].saved_params;
  own.state = state2;
  own.own = true;
  for (const auto& r : resume_world(own)) require_equal(r.params, want, "int8 2 -> 2, own dict");

  // Another world size: each new piece's state is the old one per element (each old piece
  // decoded with its blocks), cut for the piece and quantized in the piece's own blocks.
  const auto old = moments_per_element(state2);
  for (int world : {1, 4}) {
    Resume load = own;
    load.own = false;
    load.world = world;
    load.to = kSaveAt;  // `last` is the state right after the load
    int64_t int8_pieces = 0, pieces = 0;
    for (const auto& r : resume_world(load)) {
      const auto shards = r.last.toGenericDict().at("shards").toListRef();
      for (size_t b = 0; b < shards.size(); ++b) {
        for (const auto& item : shards[b].toGenericDict().at("state").toGenericDict()) {
          const auto row = piece_row(r.last, b, item.key().toInt());
          const auto st = item.value().toGenericDict();
          ++pieces;
          for (const std::string key : {"exp_avg", "exp_avg_sq"}) {
            INFO("world " << world << " bucket " << b << " piece " << item.key().toInt() << " "
                          << key);
            const torch::Tensor cut = old.at(row[0]).at(key).narrow(0, row[1], row[2]);
            if (!st.contains(key + "_absmax")) {
              CHECK(row[2] < kBlock);
              CHECK(torch::equal(st.at(key).toTensor(), cut));
              continue;
            }
            torchspeed::LowbitEncodeArgs e;
            e.values = cut.contiguous();
            e.is_signed = key == "exp_avg";
            e.state_block = kBlock;
            const auto [codes, absmax] = torchspeed::lowbit_encode(e);
            CHECK(torch::equal(st.at(key).toTensor(), codes));
            CHECK(torch::equal(st.at(key + "_absmax").toTensor(), absmax));
            ++int8_pieces;
          }
        }
      }
    }
    CHECK(int8_pieces > 0);
    CHECK(pieces > 0);
    // It continues close to the run that never stopped: each step moves a param by about
    // lr = 1e-2, and re-quantized moments (within one int8 step of theirs) change that little.
    Resume cont = load;
    cont.to = kResumeSteps;
    for (const auto& r : resume_world(cont)) {
      for (size_t i = 0; i < want.size(); ++i) {
        const double err = (r.params[i] - want[i]).abs().max().item<double>();
        INFO("world " << world << " param " << i << " max error " << err);
        CHECK(err <= 0.25 * 1e-2 * (kResumeSteps - kSaveAt));
      }
    }
  }
}

TEST_CASE("ZeroOptimizer (C++) refuses int8 states it cannot decode and loads nothing of them") {
  Resume base;
  base.fused = true;
  base.int8 = true;
  base.to = kSaveAt;
  const auto two = saved_of(resume_world(base), true);
  OneRank one(/*fused=*/true, /*int8=*/true);
  tsd::ZeroOptimizer& opt = one.opt;
  opt.load_state_dict(two);  // 2 -> 1: the state to keep through the refusals below
  const auto before = torch::pickle_save(opt.state_dict());
  // The last int8 piece of rank 1: a NaN absmax, then one absmax too few.
  const auto last_int8 = [](c10::IValue& d) {
    const auto shards = d.toGenericDict().at("shards").toListRef();
    for (size_t b = shards.size(); b-- > 0;) {
      for (const auto& item : shards[b].toGenericDict().at("state").toGenericDict()) {
        if (item.value().toGenericDict().contains("exp_avg_absmax")) {
          return item.value().toGenericDict();
        }
      }
    }
    FAIL("no int8 piece");
    return c10::impl::GenericDict(c10::StringType::get(), c10::AnyType::get());
  };
  using Catch::Matchers::Contains;
  auto nan = two[1].deepcopy();
  last_int8(nan).at("exp_avg_absmax").toTensor()[0] = std::nan("");
  CHECK_THAT(load_error(opt, {two[0], nan}),
             Contains("'s 'exp_avg_absmax' must hold finite absmaxes >= 0"));
  auto cut = two[1].deepcopy();
  auto st = last_int8(cut);
  const auto a = st.at("exp_avg_absmax").toTensor();
  st.insert_or_assign("exp_avg_absmax", a.narrow(0, 0, a.numel() - 1).clone());
  CHECK_THAT(load_error(opt, {two[0], cut}), Contains("'s 'exp_avg' (state_block 8): "));
  CHECK(torch::pickle_save(opt.state_dict()) == before);  // nothing half-loaded
}
