// The int8 Linear from C++: int8_pack_weight / int8_linear through the dispatcher on every int8
// path this CPU runs (TORCHSPEED_CPU_ISA forced) against an int64 reference of the accumulation
// and the fp32 epilogue written here, the argument structs against the schemas, the packed
// header's path check, and the torchspeed::quant::Int8Linear module.
#include <torch/torch.h>

#include <cstdlib>
#include <string>
#include <vector>

#include "catch_shim.h"
#include "op_schema_check.h"
#include "torchspeed/quant.h"
#include "torchspeed/quant/linear.h"
#include "torchspeed/torchspeed.h"

namespace {

/// Sets TORCHSPEED_CPU_ISA for a scope.
struct ForceIsa {
  explicit ForceIsa(const std::string& isa) { setenv("TORCHSPEED_CPU_ISA", isa.c_str(), 1); }
  ~ForceIsa() { unsetenv("TORCHSPEED_CPU_ISA"); }
};

std::vector<std::string> runnable_int8_levels() {
  const std::vector<std::string> order = {"scalar", "avx2", "avx512", "avx512_vnni", "amx"};
  const std::string best = torchspeed::cpu_isa_detected();
  const std::string compiled = "," + torchspeed::cpu_isas_compiled() + ",";
  std::vector<std::string> out;
  for (const auto& isa : order) {
    if (compiled.find("," + isa + ",") != std::string::npos) out.push_back(isa);
    if (isa == best) break;
  }
  return out;
}

/// The reference: torch's formula for the row quantization, int64 sums, the fp32 epilogue.
at::Tensor reference(const at::Tensor& x, const at::Tensor& w, const at::Tensor& w_scale,
                     const at::Tensor& bias, bool relu) {
  auto absmax = x.abs().amax(1);
  auto scale = torch::where(absmax == 0, torch::ones_like(absmax), absmax / 127.0);
  auto q = torch::clamp(torch::round(x * (1.0 / scale).unsqueeze(1)), -127, 127).to(torch::kLong);
  auto acc = torch::matmul(q, w.to(torch::kLong).t());
  auto y = acc.to(torch::kFloat) * (scale.unsqueeze(1) * w_scale.unsqueeze(0)) + bias;
  return relu ? torch::where(y < 0, torch::zeros_like(y), y) : y;
}

template <class F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const c10::Error& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST_CASE("int8_linear equals the int64 reference bit for bit on every int8 path") {
  torch::manual_seed(0);
  for (const auto& isa : runnable_int8_levels()) {
    ForceIsa force(isa);
    for (auto [m, n, k] : std::vector<std::tuple<int64_t, int64_t, int64_t>>{
             {1, 1, 1}, {37, 97, 200}, {48, 35, 129}, {5, 16, 4096}}) {
      INFO("isa " << isa << " (int8 path " << torchspeed::cpu_int8_path() << ") m " << m << " n "
                  << n << " k " << k);
      auto x = torch::randn({m, k}) * 2;
      auto w = torch::randint(-127, 128, {n, k}, torch::kChar);
      w.index_put_({0}, 127);
      auto w_scale = torch::rand({n}) * 0.01 + 1e-3;
      auto bias = torch::randn({n});
      const auto packed = torchspeed::int8_pack_weight(w);
      for (bool relu : {false, true}) {
        const auto out = torchspeed::int8_linear(x, packed, w_scale, bias, relu);
        REQUIRE(torch::equal(out, reference(x, w, w_scale, bias, relu)));
      }
    }
  }
}

TEST_CASE("the int8 ops' argument structs match their schemas") {
  torchspeed_test::check_against_schema<torchspeed::Int8PackWeightArgs>();
  torchspeed_test::check_against_schema<torchspeed::Int8LinearArgs>();
}

TEST_CASE("int8_linear rejects a buffer packed for another path, and bad shapes") {
  const auto levels = runnable_int8_levels();
  auto w = torch::randint(-127, 128, {8, 16}, torch::kChar);
  auto x = torch::randn({2, 16});
  auto s = torch::ones({8});
  at::Tensor packed;
  {
    ForceIsa force("scalar");
    packed = torchspeed::int8_pack_weight(w);
  }
  if (levels.size() > 1) {
    ForceIsa force(levels.back());
    REQUIRE(error_of([&] {
              torchspeed::int8_linear(x, packed, s);
            }).find("packed for the int8 path 'scalar'") != std::string::npos);
  }
  ForceIsa force("scalar");
  REQUIRE(error_of([&] {
            torchspeed::int8_linear(torch::randn({2, 100}), packed, s);
          }).find("int8_pack_weight's result for N = 8") != std::string::npos);
}

TEST_CASE("torchspeed::quant::Int8Linear matches the reference and round-trips its state") {
  torch::manual_seed(1);
  torch::nn::Linear lin(torch::nn::LinearOptions(24, 10));
  auto m = torchspeed::quant::from_float(lin);
  auto x = torch::randn({3, 24});
  torch::NoGradGuard no_grad;
  const auto y = m->forward(x);
  REQUIRE(y.sizes() == torch::IntArrayRef({3, 10}));
  REQUIRE(torch::equal(y, reference(x, m->weight, m->weight_scale, m->bias, false)));
  const auto rel = ((y - lin->forward(x)).norm() / lin->forward(x).norm()).item<float>();
  REQUIRE(rel < 0.02f);
  auto m2 = torchspeed::quant::Int8Linear(torchspeed::quant::Int8LinearOptions(24, 10));
  auto src = m->named_buffers();
  for (auto& b : m2->named_buffers()) b.value().copy_(src[b.key()]);
  REQUIRE(torch::equal(m2->forward(x), y));
}
