// Example: train a small LibTorch MLP on synthetic regression data with torchspeed::optim::AdamW,
// the fused drop-in for torch::optim::AdamW.
//   train_mlp [steps] [cuda]
// Build against an installed torchspeed: see examples/cpp/README.md.
#include <torch/torch.h>
#include <torchspeed/optim.h>

#include <cstdlib>
#include <iomanip>
#include <iostream>
#include <string>

struct MLPImpl : torch::nn::Module {
  MLPImpl(int64_t in, int64_t hidden, int64_t out)
      : fc1(register_module("fc1", torch::nn::Linear(in, hidden))),
        fc2(register_module("fc2", torch::nn::Linear(hidden, hidden))),
        fc3(register_module("fc3", torch::nn::Linear(hidden, out))) {}
  torch::Tensor forward(torch::Tensor x) { return fc3(torch::gelu(fc2(torch::gelu(fc1(x))))); }
  torch::nn::Linear fc1, fc2, fc3;
};
TORCH_MODULE(MLP);

int main(int argc, char** argv) {
  const int steps = argc > 1 ? std::atoi(argv[1]) : 300;
  const bool use_cuda = argc > 2 && std::string(argv[2]) == "cuda" && torch::cuda::is_available();
  const torch::Device device = use_cuda ? torch::kCUDA : torch::kCPU;
  torch::manual_seed(0);

  // Synthetic regression: y = sin(x W) + noise, 16 inputs -> 4 targets.
  const auto w_true = torch::randn({16, 4}) / 4;
  auto x = torch::randn({2048, 16});
  auto y = torch::sin(x.mm(w_true)) + 0.01 * torch::randn({2048, 4});
  x = x.to(device);
  y = y.to(device);

  MLP model(16, 64, 4);
  model->to(device);
  torchspeed::optim::AdamW optimizer(
      model->parameters(),
      torchspeed::optim::AdamWOptions(3e-3).weight_decay(1e-2).max_grad_norm(1.0));
  torch::optim::StepLR scheduler(optimizer, /*step_size=*/100, /*gamma=*/0.5);

  std::cout << "torchspeed " << torchspeed::version() << ", device " << device << ", CPU ISA "
            << torchspeed::cpu_isa() << "\n";
  const int64_t batch = 256;
  double first_loss = 0, last_loss = 0;
  for (int step = 1; step <= steps; ++step) {
    const auto idx =
        torch::randint(x.size(0), {batch}, torch::TensorOptions(device).dtype(torch::kLong));
    optimizer.zero_grad();
    auto loss = torch::mse_loss(model->forward(x.index_select(0, idx)), y.index_select(0, idx));
    loss.backward();
    optimizer.step();
    scheduler.step();
    if (step == 1 || step % 50 == 0) {
      torch::NoGradGuard no_grad;
      const double full = torch::mse_loss(model->forward(x), y).item<double>();
      if (step == 1) first_loss = full;
      last_loss = full;
      std::cout << "step " << std::setw(4) << step << "  loss " << std::fixed
                << std::setprecision(5) << full << "\n";
    }
  }
  torch::serialize::OutputArchive archive;
  optimizer.save(archive);  // the fused state saves like torch::optim's
  // CI runs this example: training must at least halve the loss.
  if (!(last_loss < 0.5 * first_loss)) {
    std::cout << "FAILED: loss went from " << first_loss << " to " << last_loss << "\n";
    return 1;
  }
  std::cout << "loss " << first_loss << " -> " << last_loss << ": OK\n";
  return 0;
}
