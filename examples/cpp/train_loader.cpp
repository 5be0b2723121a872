// Example: a LibTorch training app with torchspeed's three parts: the C++ loader over WebDataset
// shards (decode, RandomResizedCrop, flip and normalize in C++ threads), the fused AdamW, and the
// step profiler (per-step phase breakdown, Chrome trace).
//   train_loader <steps> <trace.json> shard.tar [shard.tar ...]
// The shards hold <key>.jpg + <key>.cls samples (torchspeed demo's cache, or any written by
// python -m torchspeed.data.write_shards). Build against an installed torchspeed: see README.md.
#include <torch/torch.h>
#include <torchspeed/data.h>
#include <torchspeed/optim.h>
#include <torchspeed/profile/profile.h>

#include <algorithm>
#include <cstdlib>
#include <iomanip>
#include <iostream>
#include <optional>
#include <string>
#include <thread>

// A small conv net: conv-BN-ReLU x3 (stride 2), global average pool, linear.
struct NetImpl : torch::nn::Module {
  explicit NetImpl(int64_t classes) {
    int64_t cin = 3;
    for (int64_t cout : {16, 32, 64}) {
      body->push_back(torch::nn::Conv2d(
          torch::nn::Conv2dOptions(cin, cout, 3).stride(2).padding(1).bias(false)));
      body->push_back(torch::nn::BatchNorm2d(cout));
      body->push_back(torch::nn::ReLU(true));
      cin = cout;
    }
    register_module("body", body);
    fc = register_module("fc", torch::nn::Linear(cin, classes));
  }
  torch::Tensor forward(torch::Tensor x) {
    x = torch::adaptive_avg_pool2d(body->forward(x), {1, 1}).flatten(1);
    return fc(x);
  }
  torch::nn::Sequential body;
  torch::nn::Linear fc{nullptr};
};
TORCH_MODULE(Net);

int main(int argc, char** argv) {
  namespace tsd = torchspeed::data;
  namespace tp = torchspeed::profile;
  if (argc < 4) {
    std::cerr << "usage: " << argv[0] << " <steps> <trace.json> shard.tar [shard.tar ...]\n";
    return 2;
  }
  const int steps = std::atoi(argv[1]);
  const std::string trace_path = argv[2];
  torch::manual_seed(0);

  tsd::WebDatasetOptions wds;
  wds.urls.assign(argv + 3, argv + argc);
  wds.fields = {"jpg", "cls"};
  wds.image.mode = tsd::CropMode::kRandomResizedCrop;
  wds.image.height = wds.image.width = 48;
  wds.image.scale = {0.25, 1.0};
  wds.image.flip_prob = 0.5;
  wds.image.normalize = true;  // float32, ImageNet mean/std
  wds.image.decode_scaling = tsd::DecodeScaling::kFast;

  tsd::LoaderOptions opt;
  opt.batch_size = 32;
  opt.shuffle = true;
  opt.drop_last = true;
  opt.num_workers = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  opt.seed = 1;

  Net model(10);
  torchspeed::optim::AdamW optimizer(model->parameters(),
                                     torchspeed::optim::AdamWOptions(2e-3).weight_decay(0.05));
  tp::set_enabled(true);
  tp::StepProfiler prof;
  try {
    tsd::Loader loader(tsd::webdataset_source(wds), opt);
    std::cout << "torchspeed " << torchspeed::version() << ": " << loader.dataset_size()
              << " samples, " << loader.num_batches() << " batches/epoch, " << opt.num_workers
              << " loader threads\n";
    double first = 0, last = 0;  // mean loss of the first and the last 5 steps
    int step = 0;
    prof.start();
    for (int64_t epoch = 0; step < steps; ++epoch) {
      loader.set_epoch(epoch);
      loader.start_epoch();
      while (step < steps) {
        std::optional<tsd::Batch> batch;
        {
          TORCHSPEED_PHASE("next", tp::Phase::DataWait);
          batch = loader.next();
        }
        if (!batch) break;
        const at::Tensor& x = batch->tensors.at("jpg");  // [32, 3, 48, 48] float32
        const at::Tensor& y = batch->tensors.at("cls");  // [32] int64
        torch::Tensor loss;
        {
          TORCHSPEED_PHASE("forward", tp::Phase::Forward);
          loss = torch::cross_entropy_loss(model->forward(x), y);
        }
        {
          TORCHSPEED_PHASE("backward", tp::Phase::Backward);
          loss.backward();
        }
        optimizer.step();  // reports the optimizer phase itself
        optimizer.zero_grad();
        prof.step(x.size(0));
        const double l = loss.item<double>();
        if (step < 5) first += l / 5;
        if (step >= steps - 5) last += l / 5;
        if (++step % 10 == 0 || step == steps)
          std::cout << "step " << std::setw(4) << step << "  loss " << std::fixed
                    << std::setprecision(4) << l << "\n";
      }
    }
    loader.shutdown();
    std::cout << prof.summary_table() << "\n";
    tp::write_chrome_trace(trace_path, &prof);
    std::cout << "trace written to " << trace_path << "\n";
    // CI runs this: the loss must come down from its start (ln 10 = 2.30 at random).
    if (steps < 10 || !(last < first)) {
      std::cout << "FAILED: loss went from " << first << " to " << last << "\n";
      return 1;
    }
    std::cout << "loss " << first << " -> " << last << ": OK\n";
  } catch (const std::exception& e) {
    std::cerr << e.what() << "\n";
    return 1;
  }
  return 0;
}
