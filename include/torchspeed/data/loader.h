// torchspeed::data::Loader: a multi-threaded prefetching loader writing batches into reusable
// (pinned when CUDA is available) slots, with deterministic per-sample augmentation and resume.
//
//   #include <torchspeed/data/loader.h>
//   namespace tsd = torchspeed::data;
//   tsd::WebDatasetOptions wds;
//   wds.urls = {"train-000000.tar", "train-000001.tar"};
//   wds.image.flip_prob = 0.5;                       // RandomResizedCrop(224) + flip, uint8 CHW
//   tsd::LoaderOptions opt;
//   opt.batch_size = 256; opt.shuffle = true; opt.num_workers = 8; opt.seed = 1;
//   tsd::Loader loader(tsd::webdataset_source(wds), opt);
//   for (int epoch = 0; epoch < 90; ++epoch) {
//     loader.set_epoch(epoch);
//     loader.start_epoch();
//     while (auto batch = loader.next()) {
//       at::Tensor images = batch->tensors.at("jpg"), labels = batch->tensors.at("cls");
//     }
//   }
//
// Ownership: a batch's tensors view a slot of the ring. The loader reuses a slot only when no
// tensor outside the loader references it any more (otherwise it allocates a fresh buffer for
// the slot), so keeping a batch is always safe; dropping it promptly keeps allocation at zero.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "torchspeed/data/options.h"
#include "torchspeed/export.h"

namespace torchspeed::data {

// A random-access collection of samples (see the factory functions below).
class Source;

// WebDataset tar shards. `fields` picks what each sample yields, by extension; alternatives are
// separated by ';' (e.g. {"jpg;jpeg;png", "cls"}); the output key is the spec string. Empty
// `fields` takes every recognised extension of the first sample. Kinds, by the last extension
// part: jpg/jpeg/png -> image (per `image`), cls/cls2/id/index -> int64 scalar (decimal text),
// txt/json -> string, npy -> tensor (same shape and dtype in every sample).
// An index per shard is built by scanning tar headers (read with pread; member data is skipped)
// or read from "<shard>.idx" when its recorded shard size and modification time still match.
// Shards are read, not mapped: one truncated or rewritten under the loader gives an error naming
// it (raise) or a skipped sample (skip), never a crash.
struct WebDatasetOptions {
  std::vector<std::string> urls;
  std::vector<std::string> fields;
  ImageTransformOptions image;
  // Polled between shards and during long scans while webdataset_source() indexes; returning true
  // stops it with a std::runtime_error saying it was cancelled (torchspeed::data::Cancelled).
  // The Python binding polls Ctrl-C here.
  std::function<bool()> should_stop;
};

TORCHSPEED_API std::shared_ptr<Source> webdataset_source(const WebDatasetOptions& options);
// .npy files (read with pread), one per output field, all with the same first dimension.
TORCHSPEED_API std::shared_ptr<Source> npy_source(
    const std::vector<std::pair<std::string, std::string>>& name_and_path);
// In-memory tensors (CPU, same first dimension); batches are gathered with index_select.
TORCHSPEED_API std::shared_ptr<Source> tensor_source(
    const std::vector<std::pair<std::string, at::Tensor>>& name_and_tensor);
// Number of samples of a source.
TORCHSPEED_API int64_t source_size(const Source& source);

struct LoaderOptions {
  int64_t batch_size = 1;
  bool shuffle = false;
  bool drop_last = false;
  int num_workers = 1;      // worker threads (0 is treated as 1)
  int prefetch_factor = 2;  // batches in flight per worker; ring = workers * factor + 2 slots
  bool pin_memory = true;   // pinned slots when torch has CUDA, plain CPU memory otherwise
  double timeout_s = 0;     // > 0: next() throws if a batch takes longer
  uint64_t seed = 0;        // shuffle order and augmentation draws
  std::string on_error = "raise";  // "raise" or "skip" (skipped samples are counted)
  int rank = 0;                    // distributed sharding
  int world_size = 1;
  bool drop_uneven = false;  // drop the tail instead of padding to a multiple of world_size
  std::string device;        // "" (host) or a device such as "cuda:0": copies on a side stream
};

// One batch: tensors by field name (first dimension = batch), string fields, and the sample keys.
struct Batch {
  int64_t epoch = 0;
  int64_t index = 0;  // batch number within the epoch
  std::map<std::string, at::Tensor> tensors;
  std::map<std::string, std::vector<std::string>> strings;
  std::vector<int64_t> sample_indices;  // dataset indices of the rows (after skips)
  int64_t size() const { return static_cast<int64_t>(sample_indices.size()); }
};

class TORCHSPEED_API Loader {
 public:
  Loader(std::shared_ptr<Source> source, LoaderOptions options);
  ~Loader();
  Loader(const Loader&) = delete;
  Loader& operator=(const Loader&) = delete;

  // Starts an epoch (threads start on first use). A new call abandons an unfinished epoch and
  // moves to the next one (or to the one set_epoch named meanwhile); after load_state_dict it
  // starts at the loaded position.
  void start_epoch();
  // The next batch in order, or nullopt at the end of the epoch. Data errors (corrupt image,
  // missing field, ...) throw std::runtime_error naming the shard and the sample key.
  // `should_stop`, when set, is called between short waits (about 50 ms); true throws Cancelled
  // (how Python's Ctrl-C reaches a waiting loop). timeout_s applies either way.
  std::optional<Batch> next(const std::function<bool()>& should_stop = {});
  // Like next() but waits at most `wait_s`; returns false (and leaves `out` alone) if nothing
  // arrived yet. `*end` is set at the end of the epoch. Used by bindings to stay interruptible.
  bool next_for(double wait_s, Batch* out, bool* end);

  // The epoch whose order and draws the next start_epoch uses (>= 0). Called during an epoch, the
  // current one still runs to its end (torch: set_epoch inside the batch loop).
  void set_epoch(int64_t epoch);
  // An explicit sample order for the coming epochs (a user sampler); may be empty (no batches).
  // Indices must be in [0, dataset_size()).
  void set_indices(std::vector<int64_t> indices);
  // Back to the built-in order (shuffle, rank sharding).
  void clear_indices();
  int64_t epoch() const;
  int64_t num_batches() const;  // batches per epoch for this rank
  int64_t dataset_size() const;

  // Small resume state: epoch, batches consumed, skipped count, and what fixes the order (seed,
  // sizes, shuffle, drop_last). load_state_dict validates every field (ValueError in Python)
  // before changing anything.
  std::map<std::string, int64_t> state_dict() const;
  void load_state_dict(const std::map<std::string, int64_t>& state);

  LoaderStats stats() const;
  void reset_stats();
  // Stops and joins the worker threads (start_epoch restarts them). Safe to call twice.
  void shutdown();
  const LoaderOptions& options() const;

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

// Indexes the WebDataset tar `shard` and writes `<shard>.idx` next to it (atomically: a reader
// never sees half an index), which later loads read instead of scanning the tar. Returns the
// number of samples. Throws std::runtime_error for a damaged shard, Cancelled when `should_stop`
// returns true.
TORCHSPEED_API int64_t write_shard_index(const std::string& shard,
                                         const std::function<bool()>& should_stop = {});

}  // namespace torchspeed::data
