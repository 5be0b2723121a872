// The small deterministic net of the dist tests (test_dist.cpp, test_zero.cpp): two Linear layers
// with sin-pattern weights, so every rank and the single-process reference start equal.
#pragma once

#include <torch/torch.h>

namespace torchspeed::test {

inline torch::nn::Sequential make_net(torch::Dtype dtype = torch::kFloat64) {
  torch::nn::Sequential net(torch::nn::Linear(6, 24), torch::nn::Tanh(), torch::nn::Linear(24, 3));
  net->to(dtype);
  torch::NoGradGuard no_grad;
  int i = 0;
  for (auto& p : net->parameters()) {
    auto idx = torch::arange(p.numel(), torch::kFloat64);
    p.copy_((0.4 * torch::sin(idx * 0.3 + ++i)).reshape(p.sizes()));
  }
  return net;
}

}  // namespace torchspeed::test
