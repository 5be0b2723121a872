// Example: train-style loop over WebDataset shards with torchspeed::data::Loader from a LibTorch
// app.
//   loader_example shard-000000.tar shard-000001.tar ...
// Build against an installed torchspeed: find_package(torchspeed) + target_link_libraries(app
// torchspeed::torchspeed).
#include <torch/torch.h>
#include <torchspeed/data.h>

#include <algorithm>
#include <iostream>
#include <thread>

int main(int argc, char** argv) {
  namespace tsd = torchspeed::data;
  if (argc < 2) {
    std::cerr << "usage: " << argv[0] << " shard.tar [shard.tar ...]\n";
    return 2;
  }
  tsd::WebDatasetOptions wds;
  wds.urls.assign(argv + 1, argv + argc);
  wds.fields = {"jpg;jpeg;png", "cls"};
  wds.image.mode = tsd::CropMode::kRandomResizedCrop;  // RandomResizedCrop(224) + flip, uint8 CHW
  wds.image.flip_prob = 0.5;

  tsd::LoaderOptions opt;
  opt.batch_size = 64;
  opt.shuffle = true;
  opt.num_workers = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  opt.seed = 1;
  opt.on_error = "skip";
  if (torch::cuda::is_available()) opt.device = "cuda:0";

  try {
    tsd::Loader loader(tsd::webdataset_source(wds), opt);
    std::cout << "samples: " << loader.dataset_size() << ", batches/epoch: " << loader.num_batches()
              << "\n";
    for (int64_t epoch = 0; epoch < 2; ++epoch) {
      loader.set_epoch(epoch);
      loader.start_epoch();
      int64_t label_sum = 0;
      while (auto batch = loader.next()) {
        const at::Tensor& images = batch->tensors.at("jpg;jpeg;png");  // [B, 3, 224, 224] uint8
        const at::Tensor& labels = batch->tensors.at("cls");           // [B] int64
        label_sum += labels.sum().item<int64_t>();
        (void)images;
      }
      const tsd::LoaderStats s = loader.stats();
      std::cout << "epoch " << epoch << ": " << s.samples_per_s << " samples/s, decode "
                << s.decode_s << " s, transform " << s.transform_s << " s, consumer wait "
                << s.consumer_wait_s << " s, skipped " << s.skipped << ", label sum " << label_sum
                << "\n";
      loader.reset_stats();
    }
    // Resume later exactly where we are: save loader.state_dict() with the checkpoint.
  } catch (const std::exception& e) {
    std::cerr << e.what() << "\n";
    return 1;
  }
  return 0;
}
