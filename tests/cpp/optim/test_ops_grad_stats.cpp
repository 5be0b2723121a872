// grad_stats through the dispatcher and the public C++ API: float64 reference, error messages,
// and nothing modified when an argument is bad.
#include <torch/torch.h>

#include "catch_shim.h"
#include "torchspeed/torchspeed.h"

namespace {
double reference_norm(const std::vector<at::Tensor>& ts) {
  double s = 0;
  for (const auto& t : ts) s += t.to(at::kDouble).pow(2).sum().item<double>();
  return std::sqrt(s);
}
}  // namespace

TEST_CASE("grad_stats through the C++ API matches a float64 reference") {
  torch::manual_seed(0);
  std::vector<at::Tensor> ts = {torch::randn({1000}), torch::randn({3, 70000}),
                                torch::randn({5}).to(at::kBFloat16), torch::randn({17, 3}).t()};
  const double ref = reference_norm(ts);
  auto stats = torchspeed::grad_stats(ts, /*per_tensor=*/true);
  CHECK(stats.total_norm.item<double>() == Approx(ref).epsilon(1e-6));
  REQUIRE(stats.per_tensor_norms.size(0) == 4);
  for (size_t i = 0; i < ts.size(); ++i) {
    CHECK(stats.per_tensor_norms[i].item<double>() ==
          Approx(reference_norm({ts[i]})).epsilon(1e-6));
  }
  CHECK(stats.found_inf.item<float>() == 0.f);
}

TEST_CASE("grad_stats_unscale_ unscales in place, including non-contiguous tensors") {
  torch::manual_seed(1);
  std::vector<at::Tensor> ts = {torch::randn({100}), torch::randn({20, 30}).t()};
  std::vector<at::Tensor> before = {ts[0].clone(), ts[1].clone()};
  auto inv = torch::full({1}, 0.25f);
  auto stats = torchspeed::grad_stats_unscale_(ts, inv);
  CHECK(torch::equal(ts[0], before[0] * 0.25));
  CHECK(torch::equal(ts[1], before[1] * 0.25));
  CHECK(stats.total_norm.item<double>() == Approx(reference_norm(ts)).epsilon(1e-6));
}

TEST_CASE("grad_stats rejects bad input with the argument's name, before modifying anything") {
  auto good = torch::ones({10});
  auto inv = torch::full({1}, 0.5f);
  auto expect_error = [&](std::vector<at::Tensor> ts, const std::string& needle) {
    try {
      torchspeed::grad_stats_unscale_(ts, inv);
      FAIL("no error raised");
    } catch (const c10::Error& e) {
      INFO(e.what());
      CHECK(std::string(e.what()).find(needle) != std::string::npos);
    }
    CHECK(torch::equal(good, torch::ones({10})));  // untouched
  };
  expect_error({good, torch::ones({3}, at::kLong)}, "tensors[1] must be float32");
  expect_error({good, torch::ones({3}).to_sparse()}, "tensors[1] must be a dense");
  expect_error({good, torch::ones({3}, at::device(at::kMeta))}, "tensors[1] must be on cpu");
}

TEST_CASE("grad_stats of no tensors is norm 0, as clip_grad_norm_ of no params") {
  auto stats = torchspeed::grad_stats({});
  CHECK(stats.total_norm.item<float>() == 0.f);
  CHECK(stats.found_inf.item<float>() == 0.f);
  CHECK(stats.per_tensor_norms.size(0) == 0);
  stats = torchspeed::grad_stats_unscale_({}, torch::full({1}, 0.5f), /*per_tensor=*/true);
  CHECK(stats.total_norm.item<float>() == 0.f);
  CHECK_THROWS_AS(torchspeed::grad_stats_unscale_({}, torch::ones({2})), c10::Error);
}
