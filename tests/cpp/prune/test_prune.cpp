// The prune area from C++: the ops through the dispatcher against references written here (the
// N:M and exact-count magnitude choices, the packed layout), the argument structs against the
// schemas, and the validators' messages (raised before anything is written).
#include <torch/torch.h>

#include <string>

#include "catch_shim.h"

// The int[] fields of these ops (int is in op_schema_check.h), for check_against_schema's default
// comparison (declared before op_schema_check.h so its template finds them).
namespace torchspeed_test {
inline c10::IValue as_ivalue(at::IntArrayRef v) { return c10::IValue(v.vec()); }
}  // namespace torchspeed_test

#include "op_schema_check.h"
#include "torchspeed/prune.h"

TEST_CASE("pack_mask/unpack_mask round trip, little-endian bits, apply_mask_ zeroes exactly") {
  torch::manual_seed(0);
  auto keep = torch::rand({13, 7}) > 0.4;
  const auto packed = torchspeed::pack_mask(keep);
  REQUIRE(packed.scalar_type() == torch::kByte);
  REQUIRE(packed.numel() == (13 * 7 + 7) / 8);
  auto flat = keep.reshape({-1});
  auto p = packed.accessor<uint8_t, 1>();
  for (int64_t i = 0; i < flat.numel(); ++i) {
    REQUIRE(bool((p[i / 8] >> (i % 8)) & 1) == flat[i].item<bool>());
  }
  REQUIRE(torch::equal(torchspeed::unpack_mask(packed, {13, 7}), keep));
  auto w = torch::randn({13, 7});
  auto expected = torch::where(keep, w, torch::zeros_like(w));
  torchspeed::apply_mask_(w, packed);
  REQUIRE(torch::equal(w, expected));
}

TEST_CASE("nm_mask keeps the n largest of every m; magnitude_mask prunes exactly `amount`") {
  torch::manual_seed(1);
  auto w = torch::randn({6, 16});
  const auto keep = torchspeed::unpack_mask(torchspeed::nm_mask(w, 2, 4), {6, 16});
  const auto groups = w.abs().reshape({6, 4, 4});
  const auto top = std::get<1>(groups.topk(2, -1));
  auto ref = torch::zeros({6, 4, 4}, torch::kBool).scatter_(-1, top, true).reshape({6, 16});
  REQUIRE(torch::equal(keep, ref));
  for (int64_t amount : {0, 1, 50, 95, 96}) {
    const auto m = torchspeed::unpack_mask(torchspeed::magnitude_mask(w, amount), {6, 16});
    REQUIRE(m.logical_not().sum().item<int64_t>() == amount);
    if (amount > 0 && amount < 96) {  // every pruned |w| <= every kept |w|
      REQUIRE(w.abs().masked_select(m.logical_not()).max().item<float>() <=
              w.abs().masked_select(m).min().item<float>());
    }
  }
}

TEST_CASE("the prune ops reject bad input before writing, with the argument named") {
  auto w = torch::randn({4, 6});
  const auto before = w.clone();
  auto msg = [](auto&& f) {
    try {
      f();
    } catch (const c10::Error& e) {
      return std::string(e.what_without_backtrace());
    }
    return std::string("no error");
  };
  CHECK(msg([&] { torchspeed::nm_mask(w, 2, 4); }).find("multiple of m = 4") != std::string::npos);
  CHECK(msg([&] { torchspeed::nm_mask(w, 5, 3); }).find("n must be in [0, m = 3]") !=
        std::string::npos);
  CHECK(msg([&] { torchspeed::magnitude_mask(w, 25); }).find("amount must be in [0, numel = 24]") !=
        std::string::npos);
  CHECK(msg([&] {
          torchspeed::apply_mask_(w, torch::zeros({2}, torch::kByte));
        }).find("packed must have ceil(24 / 8) = 3 bytes") != std::string::npos);
  CHECK(msg([&] {
          torchspeed::apply_mask_(w, torch::zeros({3}, torch::kFloat));
        }).find("packed must be uint8") != std::string::npos);
  REQUIRE(torch::equal(w, before));
}

TEST_CASE("the prune ops' argument structs match their schemas") {
  torchspeed_test::check_against_schema<torchspeed::PackMaskArgs>();
  torchspeed_test::check_against_schema<torchspeed::UnpackMaskArgs>();
  torchspeed_test::check_against_schema<torchspeed::ApplyMaskArgs>();
  torchspeed_test::check_against_schema<torchspeed::NmMaskArgs>();
  torchspeed_test::check_against_schema<torchspeed::MagnitudeMaskArgs>();
}
