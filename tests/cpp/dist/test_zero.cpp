// The C++ ZeRO-1 front: torchspeed::dist::ZeroOptimizer over AccumulatingDDP(zero=1) on 2 Gloo
// ranks (threads around one c10d::HashStore), against the unsharded single-process step with the
// same optimizer: torchspeed's fused AdamW (float32) and torch::optim::AdamW (float64), on Gloo's
// default all-reduce path and its native all_gather path; each rank holds state for its shard only.
#include <torch/torch.h>

#include <cstdlib>
#include <string>
#include <thread>
#include <torch/csrc/distributed/c10d/HashStore.hpp>
#include <vector>

#include "catch_shim.h"
#include "test_net.h"
#include "torchspeed/dist/ddp.h"
#include "torchspeed/dist/zero.h"
#include "torchspeed/optim/adam.h"

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

// The optimizer under test, over any params: torchspeed's fused AdamW or torch's.
std::unique_ptr<torch::optim::Optimizer> make_opt(bool fused, std::vector<torch::Tensor> params) {
  if (fused) {
    return std::make_unique<torchspeed::optim::AdamW>(
        std::move(params), torchspeed::optim::AdamWOptions(1e-2).weight_decay(0.1));
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
                    torch::Dtype dtype) {
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
    tsd::ZeroOptimizer opt(ddp, [fused](std::vector<torch::Tensor> pieces) {
      return make_opt(fused, std::move(pieces));
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

std::vector<torch::Tensor> reference(bool fused, torch::Dtype dtype) {
  auto net = make_net(dtype);
  auto opt = make_opt(fused, net->parameters());
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

void check_against_reference(bool fused, torch::Dtype dtype, const char* collectives, double rtol) {
  setenv("GLOO_SOCKET_IFNAME", "lo", 0);
  setenv("TORCHSPEED_ZERO_COLLECTIVES", collectives, 1);
  auto store = c10::make_intrusive<c10d::HashStore>();
  RankResult results[kWorld];
  std::vector<std::thread> threads;
  for (int r = 0; r < kWorld; ++r) {
    threads.emplace_back([&, r] { results[r] = run_rank(r, store, fused, dtype); });
  }
  for (auto& t : threads) t.join();
  unsetenv("TORCHSPEED_ZERO_COLLECTIVES");
  const auto ref = reference(fused, dtype);
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
