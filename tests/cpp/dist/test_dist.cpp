// The C++ front of torchspeed::dist: AccumulatingDDP over Gloo groups made by new_gloo_group, with
// the ranks as threads of this process around one c10d::HashStore, against a single-process float64
// reference; the collectives counted by Gloo itself; bad options and a bad torchrun environment.
#include <torch/torch.h>

#include <cmath>
#include <cstdlib>
#include <string>
#include <thread>
#include <torch/csrc/distributed/c10d/HashStore.hpp>
#include <vector>

#include "catch_shim.h"
#include "op_schema_check.h"
#include "test_net.h"
#include "torchspeed/dist/ddp.h"
#include "torchspeed/ops/dist.h"

namespace tsd = torchspeed::dist;

namespace {

using torchspeed::test::make_net;

std::pair<torch::Tensor, torch::Tensor> batch(int step, int rank, int micro) {
  auto i = torch::arange(5 * 6, torch::kFloat64).reshape({5, 6});
  const double t = step + 0.5 * rank + 0.25 * micro;
  auto x = torch::cos(0.29 * i + t);
  return {x, torch::sin(x.slice(1, 0, 3) - x.slice(1, 3, 6))};
}

constexpr int kWorld = 2, kMicro = 3, kSteps = 2;

struct RankResult {
  std::vector<torch::Tensor> params;
  std::vector<int64_t> collectives_per_micro;  // Gloo's own sequence numbers
  int64_t buckets = 0;
  std::string error;
};

RankResult run_rank(int rank, const c10::intrusive_ptr<c10d::Store>& store, int perturb) {
  RankResult out;
  try {
    auto group = tsd::new_gloo_group(store, rank, kWorld, std::chrono::seconds(60));
    auto net = make_net();
    if (perturb) {  // construction must broadcast rank 0's params
      torch::NoGradGuard no_grad;
      for (auto& p : net->parameters()) p.add_(1.0);
    }
    tsd::AccumulatingDDP ddp(
        *net, group,
        tsd::DDPOptions().accumulation_steps(kMicro).bucket_cap_mb(0.0015).first_bucket_cap_mb(
            0.0005));
    torch::optim::SGD opt(net->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
    for (int step = 0; step < kSteps; ++step) {
      for (int j = 0; j < kMicro; ++j) {
        const auto before = group->getSequenceNumberForGroup();
        ddp.begin_micro_step();
        auto [x, y] = batch(step, rank, j);
        (torch::mse_loss(net->forward(x), y) / kMicro).backward();
        out.collectives_per_micro.push_back(
            static_cast<int64_t>(group->getSequenceNumberForGroup() - before));
      }
      if (!ddp.sync_now()) throw std::runtime_error("sync_now false at the window's end");
      opt.step();
      opt.zero_grad();  // torch::optim's C++ zero_grad: detach_() + reset on the bucket views
    }
    for (auto& p : net->parameters()) out.params.push_back(p.detach().clone());
    out.buckets = ddp.stats().buckets;
  } catch (const std::exception& e) {
    out.error = e.what();
  }
  return out;
}

std::vector<torch::Tensor> reference() {
  auto net = make_net();
  torch::optim::SGD opt(net->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
  for (int step = 0; step < kSteps; ++step) {
    for (int r = 0; r < kWorld; ++r) {
      for (int j = 0; j < kMicro; ++j) {
        auto [x, y] = batch(step, r, j);
        (torch::mse_loss(net->forward(x), y) / (kMicro * kWorld)).backward();
      }
    }
    opt.step();
    opt.zero_grad();
  }
  std::vector<torch::Tensor> out;
  for (auto& p : net->parameters()) out.push_back(p.detach().clone());
  return out;
}

}  // namespace

TEST_CASE(
    "AccumulatingDDP (C++, 2 Gloo ranks as threads) equals single-process large-batch training") {
  setenv("GLOO_SOCKET_IFNAME", "lo", 0);
  auto store = c10::make_intrusive<c10d::HashStore>();
  RankResult results[kWorld];
  std::vector<std::thread> threads;
  for (int r = 0; r < kWorld; ++r) {
    threads.emplace_back([&, r] { results[r] = run_rank(r, store, r); });
  }
  for (auto& t : threads) t.join();
  const auto ref = reference();
  for (int r = 0; r < kWorld; ++r) {
    INFO("rank " << r << ": " << results[r].error);
    REQUIRE(results[r].error.empty());
    REQUIRE(results[r].buckets >= 2);
    REQUIRE(results[r].params.size() == ref.size());
    for (size_t i = 0; i < ref.size(); ++i) {
      const double err = (results[r].params[i] - ref[i]).abs().max().item<double>();
      const double mag = ref[i].abs().max().item<double>();
      CHECK(err <= 1e-12 * mag);
    }
    // Zero collectives while accumulating, one per bucket on the synchronising micro-step.
    for (size_t m = 0; m < results[r].collectives_per_micro.size(); ++m) {
      const bool sync = m % kMicro == kMicro - 1;
      CHECK(results[r].collectives_per_micro[m] == (sync ? results[r].buckets : 0));
    }
  }
}

TEST_CASE("AccumulatingDDP rejects bad options with the option's name") {
  setenv("GLOO_SOCKET_IFNAME", "lo", 0);
  auto store = c10::make_intrusive<c10d::HashStore>();
  auto group = tsd::new_gloo_group(store, 0, 1);
  auto net = make_net();
  auto build = [&](tsd::DDPOptions o) { tsd::AccumulatingDDP ddp(*net, group, o); };
  auto message = [&](tsd::DDPOptions o) {
    try {
      build(o);
    } catch (const c10::Error& e) {
      return std::string(e.what_without_backtrace());
    }
    return std::string("no error");
  };
  CHECK_THAT(message(tsd::DDPOptions().accumulation_steps(0)),
             Catch::Matchers::Contains("accumulation_steps must be >= 1, got 0"));
  CHECK_THAT(message(tsd::DDPOptions().compression("int8")),
             Catch::Matchers::Contains("compression must be 'none', 'bf16' or 'fp16', got 'int8'"));
  CHECK_THAT(message(tsd::DDPOptions().bucket_cap_mb(-1)),
             Catch::Matchers::Contains("bucket_cap_mb must be finite and > 0, got -1"));
  CHECK_THROWS_AS(build(tsd::DDPOptions().bucket_cap_mb(0)), c10::ValueError);
  CHECK_THROWS_AS(build(tsd::DDPOptions().first_bucket_cap_mb(std::nan(""))), c10::ValueError);
  CHECK_THROWS_AS(build(tsd::DDPOptions().accumulation_steps(-1)), c10::ValueError);
  CHECK_THROWS_AS(tsd::AccumulatingDDP(*net, nullptr), c10::Error);
  CHECK_THROWS_AS(tsd::new_gloo_group(store, 2, 2), c10::Error);
}

TEST_CASE("AccumulatingDDP: models or options that differ between ranks throw on every rank") {
  // Issue 23 items 1 and 4: rank 1's last layer is wider, or its accumulation_steps differ; one
  // small all-reduce at construction finds it and both ranks throw c10::ValueError naming it
  // (Gloo used to abort the process when the broadcast sizes differed).
  setenv("GLOO_SOCKET_IFNAME", "lo", 0);
  for (const bool wider : {true, false}) {
    auto store = c10::make_intrusive<c10d::HashStore>();
    std::string errors[kWorld];
    std::vector<std::thread> threads;
    for (int r = 0; r < kWorld; ++r) {
      threads.emplace_back([&, r] {
        try {
          auto group = tsd::new_gloo_group(store, r, kWorld, std::chrono::seconds(30));
          torch::nn::Sequential net(torch::nn::Linear(6, 24),
                                    torch::nn::Linear(24, wider && r == 1 ? 4 : 3));
          tsd::AccumulatingDDP ddp(*net, group,
                                   tsd::DDPOptions().accumulation_steps(!wider && r == 1 ? 3 : 2));
          errors[r] = "no error";
        } catch (const c10::ValueError& e) {
          errors[r] = e.what_without_backtrace();
        } catch (const std::exception& e) {
          errors[r] = std::string("not a ValueError: ") + e.what();
        }
      });
    }
    for (auto& t : threads) t.join();
    for (int r = 0; r < kWorld; ++r) {
      INFO("rank " << r << ": " << errors[r]);
      CHECK_THAT(errors[r], Catch::Matchers::Contains("every rank must wrap the same model"));
      CHECK_THAT(errors[r], Catch::Matchers::Contains(
                                wider ? "params[2] (1.weight) is Float [4, 24] on rank 1 "
                                        "and Float [3, 24] on rank 0"
                                      : "accumulation_steps is 3 on rank 1 and 2 on "
                                        "rank 0"));
    }
  }
}

TEST_CASE(
    "AccumulatingDDP zero=1 (C++): each rank's grad shard is its slice of the mean gradient") {
  // ZeRO-1 from C++: the buckets are reduce-scattered on the synchronising micro-step only; the
  // shards, the global norm of clip_grad_norm_ and the collective counts against one process.
  setenv("GLOO_SOCKET_IFNAME", "lo", 0);
  setenv("TORCHSPEED_ZERO_COLLECTIVES", "native", 1);  // Gloo's reduce_scatter, not all-reduce
  auto store = c10::make_intrusive<c10d::HashStore>();
  std::vector<torch::Tensor> shards[kWorld];
  std::string modes[kWorld];
  std::vector<std::pair<int64_t, int64_t>> slots[kWorld];
  std::vector<int64_t> collectives[kWorld];
  double norms[kWorld] = {0, 0};
  std::string errors[kWorld];
  std::vector<std::thread> threads;
  for (int r = 0; r < kWorld; ++r) {
    threads.emplace_back([&, r] {
      try {
        auto group = tsd::new_gloo_group(store, r, kWorld, std::chrono::seconds(60));
        auto net = make_net();
        tsd::AccumulatingDDP ddp(*net, group,
                                 tsd::DDPOptions()
                                     .accumulation_steps(kMicro)
                                     .zero(1)
                                     .bucket_cap_mb(0.0015)
                                     .first_bucket_cap_mb(0.0005));
        for (int j = 0; j < kMicro; ++j) {
          const auto before = group->getSequenceNumberForGroup();
          ddp.begin_micro_step();
          auto [x, y] = batch(0, r, j);
          (torch::mse_loss(net->forward(x), y) / kMicro).backward();
          collectives[r].push_back(
              static_cast<int64_t>(group->getSequenceNumberForGroup() - before));
        }
        for (auto& t : ddp.grad_shards()) shards[r].push_back(t.clone());
        slots[r] = ddp.param_slots();
        modes[r] = ddp.zero_collectives();
        if (ddp.last_nonfinite()) throw std::runtime_error("last_nonfinite without an inf");
        norms[r] = ddp.clip_grad_norm_(1e9).item<double>();
      } catch (const std::exception& e) {
        errors[r] = e.what();
      }
    });
  }
  for (auto& t : threads) t.join();
  unsetenv("TORCHSPEED_ZERO_COLLECTIVES");
  // The reference: the mean gradient over every (rank, micro-step) chunk, in one process.
  auto net = make_net();
  for (int r = 0; r < kWorld; ++r) {
    for (int j = 0; j < kMicro; ++j) {
      auto [x, y] = batch(0, r, j);
      (torch::mse_loss(net->forward(x), y) / (kMicro * kWorld)).backward();
    }
  }
  const auto params = net->parameters();
  double sum_sq = 0;
  for (const auto& p : params) sum_sq += p.grad().pow(2).sum().item<double>();
  for (int r = 0; r < kWorld; ++r) {
    INFO("rank " << r << ": " << errors[r]);
    REQUIRE(errors[r].empty());
    REQUIRE(shards[r].size() >= 2);
    CHECK(modes[r] == "reduce_scatter");
    CHECK(std::abs(norms[r] - std::sqrt(sum_sq)) <= 1e-6 * std::sqrt(sum_sq));
    for (int j = 0; j < kMicro; ++j) {  // reduce-scatters + the inf/NaN agreement on the last
      CHECK(collectives[r][j] == (j == kMicro - 1 ? int64_t(shards[r].size()) + 1 : 0));
    }
    std::vector<torch::Tensor> full;
    for (const auto& s : shards[r]) full.push_back(torch::zeros({s.numel() * kWorld}, s.options()));
    for (size_t i = 0; i < params.size(); ++i) {
      const auto [b, offset] = slots[r][i];
      full[b].narrow(0, offset, params[i].numel()).copy_(params[i].grad().reshape(-1));
    }
    for (size_t b = 0; b < full.size(); ++b) {
      const int64_t s = shards[r][b].numel();
      const auto want = full[b].narrow(0, r * s, s);
      const double err = (shards[r][b] - want).abs().max().item<double>();
      CHECK(err <= 1e-12 * (want.abs().max().item<double>() + 1e-30));
    }
  }
}

TEST_CASE("torchrun_env names the missing or malformed variable") {
  auto message = [] {
    try {
      tsd::torchrun_env();
    } catch (const c10::Error& e) {
      return std::string(e.what_without_backtrace());
    }
    return std::string("no error");
  };
  unsetenv("WORLD_SIZE");
  CHECK_THAT(message(), Catch::Matchers::Contains("WORLD_SIZE is not set"));
  setenv("WORLD_SIZE", "2", 1);
  setenv("RANK", "2", 1);
  CHECK_THAT(message(), Catch::Matchers::Contains("RANK must be an integer in [0, 1], got '2'"));
  setenv("RANK", "1", 1);
  setenv("MASTER_ADDR", "127.0.0.1", 1);
  setenv("MASTER_PORT", "http", 1);
  CHECK_THAT(message(), Catch::Matchers::Contains("MASTER_PORT must be an integer"));
  setenv("MASTER_PORT", "29500", 1);
  const tsd::TorchrunEnv env = tsd::torchrun_env();
  CHECK(env.rank == 1);
  CHECK(env.world_size == 2);
  CHECK(env.master_port == 29500);
  for (const char* v : {"WORLD_SIZE", "RANK", "MASTER_ADDR", "MASTER_PORT"}) unsetenv(v);
}

TEST_CASE("the dist op's argument struct matches its schema") {
  torchspeed_test::check_against_schema<torchspeed::ScaleCastArgs>();
}

TEST_CASE("scale_cast_ through the dispatcher: fp32 -> bf16 with the 1/world scale") {
  auto src = torch::linspace(-3, 3, 101);
  auto out = torch::empty({101}, torch::kBFloat16);
  torchspeed::scale_cast_(out, src, 0.5);
  CHECK(torch::equal(out, (src * 0.5).to(torch::kBFloat16)));
  CHECK_THROWS_AS(torchspeed::scale_cast_(torch::empty({3}), src), c10::Error);
}
