// The smallest standard LibTorch app (find_package(Torch) + find_package(torchspeed), only ATen and
// torchspeed used), run with LD_LIBRARY_PATH unset: checks grad_stats against plain torch ops in
// float64 and exits non-zero on any mismatch.
#include <ATen/ATen.h>
#include <torchspeed/torchspeed.h>
#include <torchspeed/version.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <vector>

int main() {
  at::manual_seed(0);
  const std::vector<at::Tensor> grads = {at::randn({513}), at::randn({17, 9}),
                                         at::randn({5}).to(at::kHalf)};
  const auto stats = torchspeed::grad_stats(grads, /*per_tensor=*/true);
  std::vector<at::Tensor> ref_norms;
  for (const auto& g : grads) ref_norms.push_back(g.to(at::kDouble).pow(2).sum().sqrt());
  const at::Tensor ref_per_tensor = at::stack(ref_norms);
  const double ref = ref_per_tensor.pow(2).sum().sqrt().item<double>();
  const double got = stats.total_norm.item<double>();
  const double per_tensor_err =
      (stats.per_tensor_norms.to(at::kDouble) - ref_per_tensor).abs().max().item<double>();
  std::printf("minimal_app: torchspeed %s, grad_stats norm %.6f, float64 reference %.6f\n",
              torchspeed::version(), got, ref);
  // The header's compile-time version and the library's must be the one CMake wrote.
  if (std::strcmp(torchspeed::version(), TORCHSPEED_VERSION_STRING) != 0) {
    std::printf("FAILED: library version %s, header version %s\n", torchspeed::version(),
                TORCHSPEED_VERSION_STRING);
    return 1;
  }
  // float32 accumulation over ~670 elements: a relative tolerance of 1e-5 is ample.
  if (!(std::fabs(got - ref) <= 1e-5 * ref) || !(per_tensor_err <= 1e-5 * ref) ||
      stats.found_inf.item<float>() != 0.f) {
    std::printf("FAILED: grad_stats does not match the torch reference (per-tensor error %.3g)\n",
                per_tensor_err);
    return 1;
  }
  std::printf("minimal_app OK\n");
  return 0;
}
