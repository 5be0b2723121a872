// The quant area from C++: quantize_int8 / dequantize_int8 through the dispatcher against an
// int64/double reference written here (per tensor, per channel, per group, zero points, the
// int8 extremes), the argument structs against the schemas, and the validators' messages.
#include <torch/torch.h>

#include <cmath>
#include <string>

#include "catch_shim.h"
#include "op_schema_check.h"
#include "torchspeed/quant.h"

namespace {

int64_t reference_q(float x, float scale, int32_t zp) {
  const float inv = 1.0f / scale;
  const double r = std::nearbyint(static_cast<double>(x * inv));  // fp32 product, then rint
  return std::clamp<int64_t>(static_cast<int64_t>(r) + zp, -128, 127);
}

}  // namespace

TEST_CASE("quantize_int8 equals the reference at every granularity, dequantize inverts it") {
  torch::manual_seed(0);
  const int64_t rows = 5, cols = 24;
  auto x = torch::randn({rows, cols}) * 3;
  x[0][0] = 1e6;   // saturates at 127
  x[1][1] = -1e6;  // and at -128
  for (auto scale : {torch::full({1}, 0.05f), torch::rand({rows}) * 0.1 + 0.01,
                     torch::rand({rows, 3}) * 0.1 + 0.01}) {
    auto zp = torch::randint(-20, 20, scale.sizes(), torch::kInt);
    for (bool with_zp : {false, true}) {
      INFO("scale shape " << scale.sizes() << ", zero point " << with_zp);
      const auto q = torchspeed::quantize_int8(
          x, scale, with_zp ? std::optional<at::Tensor>(zp) : std::nullopt);
      const auto back = torchspeed::dequantize_int8(
          q, scale, with_zp ? std::optional<at::Tensor>(zp) : std::nullopt);
      REQUIRE(q.scalar_type() == torch::kChar);
      auto qa = q.accessor<int8_t, 2>();
      auto xa = x.accessor<float, 2>();
      auto ba = back.accessor<float, 2>();
      const auto sf = scale.reshape({-1});
      const auto zf = zp.reshape({-1});
      for (int64_t r = 0; r < rows; ++r) {
        for (int64_t c = 0; c < cols; ++c) {
          const int64_t s = scale.numel() == 1 ? 0 : (scale.dim() == 1 ? r : r * 3 + c / 8);
          const float sc = sf[s].item<float>();
          const int32_t z = with_zp ? zf[s].item<int32_t>() : 0;
          REQUIRE(qa[r][c] == reference_q(xa[r][c], sc, z));
          REQUIRE(ba[r][c] == (static_cast<float>(qa[r][c]) - static_cast<float>(z)) * sc);
        }
      }
    }
  }
}

TEST_CASE("quantize_int8 maps NaN to 127 (as torch.quantize_per_tensor) and saturates inf") {
  // 35 elements: the vector body and the scalar tail of every ISA see each special value.
  auto x = torch::zeros({35});
  for (int64_t i : {0, 9, 34}) x[i] = NAN;
  x[1] = INFINITY;
  x[33] = -INFINITY;
  const auto q = torchspeed::quantize_int8(
      x, torch::full({1}, 0.5f), std::optional<at::Tensor>(torch::full({1}, -7, torch::kInt)));
  for (int64_t i : {0, 9, 34, 1}) CHECK(q[i].item<int>() == 127);
  CHECK(q[33].item<int>() == -128);
  CHECK(q[2].item<int>() == -7);
}

TEST_CASE("the quant ops' argument structs match their schemas") {
  torchspeed_test::check_against_schema<torchspeed::QuantizeInt8Args>();
  torchspeed_test::check_against_schema<torchspeed::DequantizeInt8Args>();
  torchspeed_test::check_against_schema<torchspeed::FakeQuantizeArgs>();
  torchspeed_test::check_against_schema<torchspeed::FakeQuantizeBackwardArgs>();
}

TEST_CASE("fake_quantize from C++: y = dequantize(quantize(x)) in range, the mask marks it") {
  const auto x = torch::randn({5, 64}) * 4;
  const auto scale = torch::full({5}, 0.02f);
  const auto zp = torch::arange(-2, 3, torch::kInt);
  const auto [y, mask] = torchspeed::fake_quantize(x, scale, zp);
  const auto q = torchspeed::quantize_int8(x, scale, zp);
  const auto back = torchspeed::dequantize_int8(q, scale, zp);
  REQUIRE(mask.scalar_type() == torch::kBool);
  REQUIRE(mask.sum().item<int64_t>() > 0);
  // where x is in range, fake-quant is quantize then dequantize; outside, the clamped value too
  REQUIRE(torch::equal(y, back));
  const auto [y4, mask4] = torchspeed::fake_quantize(x, scale, std::nullopt, -8, 7);
  REQUIRE(mask4.sum().item<int64_t>() < mask.sum().item<int64_t>());
  REQUIRE(y4.abs().max().item<float>() <= 8 * 0.02f);
}

TEST_CASE("quantize_int8 names the bad argument") {
  auto msg = [](auto fn) {
    try {
      fn();
    } catch (const c10::Error& e) {
      return std::string(e.what_without_backtrace());
    }
    return std::string("no error");
  };
  const auto x = torch::randn({4, 6});
  CHECK_THAT(msg([&] { torchspeed::quantize_int8(x, torch::ones({3})); }),
             Catch::Matchers::Contains("a per-channel scale must have 4 elements"));
  CHECK_THAT(msg([&] { torchspeed::quantize_int8(x, torch::ones({4, 4})); }),
             Catch::Matchers::Contains("groups dividing 6"));
  CHECK_THAT(msg([&] { torchspeed::quantize_int8(x, torch::zeros({1})); }),
             Catch::Matchers::Contains("scale[0] must be finite and > 0, got 0"));
  CHECK_THAT(msg([&] {
               torchspeed::quantize_int8(x, torch::ones({1}), torch::full({1}, 300, torch::kInt));
             }),
             Catch::Matchers::Contains("zero_point[0] must be in [-128, 127], got 300"));
  CHECK_THAT(msg([&] { torchspeed::dequantize_int8(x, torch::ones({1})); }),
             Catch::Matchers::Contains("q must be int8"));
}
