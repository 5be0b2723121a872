// Example: data-parallel training with gradient accumulation from C++, launched by torchrun.
//   torchrun --nproc-per-node 2 --no-python build/examples/ddp_train [steps] [accumulation]
//   [out.pt]
// Rank, world size and the rendezvous address come from torchrun's environment; the Gloo group
// is made over a c10d::TCPStore (served by rank 0, or by torchrun's agent). The model and data are
// the formulas of examples/python/ddp_accumulate.py, so both fronts reach the same parameters.
#include <torch/torch.h>
#include <torchspeed/dist/ddp.h>
#include <torchspeed/optim.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

namespace tsd = torchspeed::dist;

// The same formulas as make_model() and micro_batch() in examples/python/ddp_accumulate.py.
torch::nn::Sequential make_model() {
  torch::nn::Sequential model(torch::nn::Linear(8, 32), torch::nn::Tanh(),
                              torch::nn::Linear(32, 4));
  torch::NoGradGuard no_grad;
  int64_t i = 0;
  for (auto& p : model->parameters()) {
    auto idx = torch::arange(p.numel(), torch::kFloat64);
    p.copy_((0.3 * torch::sin(idx * 0.7 + static_cast<double>(i + 1))).reshape(p.sizes()));
    ++i;
  }
  return model;
}

std::pair<torch::Tensor, torch::Tensor> micro_batch(int64_t step, int64_t rank, int64_t micro,
                                                    int64_t size = 16) {
  auto i = torch::arange(size * 8, torch::kFloat64).reshape({size, 8});
  const double t = 1.3 * step + 0.71 * rank + 0.19 * micro;
  auto x = torch::sin(0.37 * i + t);
  auto y = torch::cos(x.slice(1, 0, 4) * 2.0 + x.slice(1, 4, 8) + 0.1 * t);
  return {x.to(torch::kFloat32), y.to(torch::kFloat32)};
}

int main(int argc, char** argv) {
  const int64_t steps = argc > 1 ? std::atoll(argv[1]) : 20;
  const int64_t k = argc > 2 ? std::atoll(argv[2]) : 4;
  const std::string out = argc > 3 ? argv[3] : "";

  // torchrun's environment -> a TCPStore (rank 0 serves it) -> a Gloo process group.
  const tsd::TorchrunEnv env = tsd::torchrun_env();
  c10d::TCPStoreOptions store_opts;
  store_opts.port = static_cast<uint16_t>(env.master_port);
  store_opts.isServer = env.store_server();  // rank 0, unless torchrun's agent serves it
  store_opts.numWorkers = static_cast<size_t>(env.world_size);
  auto store = c10::make_intrusive<c10d::TCPStore>(env.master_addr, store_opts);
  auto group = tsd::new_gloo_group(store, env.rank, env.world_size);
  // (tsd::init_process_group_from_env("gloo") does these three steps in one call.)

  auto model = make_model();
  tsd::AccumulatingDDP ddp(*model, group, tsd::DDPOptions().accumulation_steps(k));
  torchspeed::optim::AdamW opt(model->parameters(), torchspeed::optim::AdamWOptions(1e-2));

  for (int64_t step = 0; step < steps; ++step) {
    double total = 0;
    for (int64_t j = 0; j < k; ++j) {
      ddp.begin_micro_step();  // before the forward: decides whether this backward reduces
      auto [x, y] = micro_batch(step, env.rank, j);
      auto loss = torch::mse_loss(model->forward(x), y) / static_cast<double>(k);
      loss.backward();  // all-reduces only on the k-th micro-step
      total += loss.item<double>();
    }
    if (!ddp.sync_now()) {
      std::fprintf(stderr, "the window's last micro-step must synchronise\n");
      return 1;
    }
    opt.step();
    opt.zero_grad();
    if (env.rank == 0 && ((step + 1) % std::max<int64_t>(1, steps / 5) == 0 || step + 1 == steps)) {
      const tsd::DDPStats s = ddp.stats();
      std::printf("optimizer step %lld  loss %.5f  buckets %lld  comm %.2f ms  overlap %.0f%%\n",
                  static_cast<long long>(step + 1), total, static_cast<long long>(s.buckets),
                  s.last_comm_ns / 1e6, 100 * s.last_overlap);
    }
  }
  if (!out.empty() && env.rank == 0) {
    // torch::pickle_save writes what Python's torch.load reads.
    c10::List<torch::Tensor> params;
    for (auto& p : model->parameters()) params.push_back(p.detach().clone());
    const std::vector<char> bytes = torch::pickle_save(params);
    std::ofstream(out, std::ios::binary)
        .write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  }
  std::printf("rank %lld done: %lld micro-steps, %lld all-reduces\n",
              static_cast<long long>(env.rank), static_cast<long long>(ddp.stats().micro_steps),
              static_cast<long long>(ddp.stats().bucket_collectives));
  return 0;
}
