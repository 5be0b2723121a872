// torchspeed::data::Loader, the public side: options checks, construction and teardown (fork
// aware), epochs and sampler order, state_dict, stats. The machinery is split by job: see
// data/loader_impl.h.
#include "torchspeed/data/loader.h"

#include <algorithm>
#include <limits>
#include <mutex>

#include "core/clock.h"
#include "core/utf8.h"
#include "data/loader_impl.h"
#include "data/sampling.h"

namespace torchspeed::data {

Loader::Loader(std::shared_ptr<Source> source, LoaderOptions options)
    : impl_(std::make_unique<Impl>()) {
  TORCH_CHECK(source != nullptr, "torchspeed.data.Loader: source must not be null");
  // ValueError in Python, as torch's DataLoader raises for these.
  TORCH_CHECK_VALUE(options.batch_size >= 1,
                    "torchspeed.data.Loader: batch_size must be >= 1, got ", options.batch_size);
  TORCH_CHECK_VALUE(options.num_workers >= 0,
                    "torchspeed.data.Loader: num_workers must be >= 0, got ", options.num_workers);
  TORCH_CHECK_VALUE(options.prefetch_factor >= 1,
                    "torchspeed.data.Loader: prefetch_factor must be >= 1, got ",
                    options.prefetch_factor);
  constexpr int64_t kMaxSlots = 1 << 16;
  const int64_t slots_wanted =
      int64_t{std::max(1, options.num_workers)} * options.prefetch_factor + 2;
  TORCH_CHECK_VALUE(
      slots_wanted <= kMaxSlots,
      "torchspeed.data.Loader: num_workers * prefetch_factor must be <= ", kMaxSlots - 2,
      " (batches in flight), got ", options.num_workers, " * ", options.prefetch_factor);
  TORCH_CHECK_VALUE(options.timeout_s >= 0, "torchspeed.data.Loader: timeout must be >= 0, got ",
                    options.timeout_s);
  TORCH_CHECK_VALUE(options.on_error == "raise" || options.on_error == "skip",
                    "torchspeed.data.Loader: on_error must be 'raise' or 'skip', got '",
                    escape_invalid_utf8(options.on_error), "'");
  TORCH_CHECK_VALUE(
      options.world_size >= 1 && options.rank >= 0 && options.rank < options.world_size,
      "torchspeed.data.Loader: rank must be in [0, world_size), got rank ", options.rank,
      " and world_size ", options.world_size);
  Impl& d = *impl_;
  d.source = std::move(source);
  d.opt = std::move(options);
  d.skip_errors = d.opt.on_error == "skip";
  d.fields = d.source->fields();
  if (!d.opt.device.empty()) {
    c10::Device dev(d.opt.device);
    if (!dev.is_cpu()) d.device = dev;
  }
  d.pin = d.opt.pin_memory && at::hasCUDA();
  const int nslots = static_cast<int>(slots_wanted);
  d.slots.resize(static_cast<size_t>(nslots));
  for (int s = 0; s < nslots; ++s) {
    d.allocate_slot(&d.slots[static_cast<size_t>(s)]);
    d.free_slots.push_back(nslots - 1 - s);
  }
}

Loader::~Loader() {
  // In a forked child the threads, and any waiter on the condition variables, exist only in the
  // parent: joining or destroying them would hang, so the child leaves the object alone.
  if (impl_->forked_away()) {
    (void)impl_.release();
    return;
  }
  try {
    impl_->shutdown();
  } catch (...) {
  }
}

void Loader::start_epoch() { impl_->start_epoch(); }

std::optional<Batch> Loader::next(const std::function<bool()>& should_stop) {
  TORCHSPEED_PHASE("torchspeed.data.Loader.next", profile::Phase::DataWait);
  Batch b;
  bool end = false;
  const double timeout = impl_->opt.timeout_s;
  const auto t0 = Clock::now();
  while (true) {
    if (impl_->next_for(0.05, &b, &end)) return b;
    if (end) return std::nullopt;
    if (should_stop && should_stop()) throw Cancelled("torchspeed.data.Loader: interrupted");
    TORCH_CHECK(timeout <= 0 || seconds_since(t0) < timeout,
                "torchspeed.data.DataLoader: timed out after ", timeout, " s waiting for batch ",
                impl_->next_deliver, " of epoch ", impl_->epoch);
  }
}

bool Loader::next_for(double wait_s, Batch* out, bool* end) {
  return impl_->next_for(wait_s, out, end);
}

namespace {

constexpr const char* kStateKeys[] = {"epoch",      "batches_consumed", "seed", "dataset_size",
                                      "batch_size", "world_size",       "rank", "shuffle",
                                      "drop_last",  "skipped"};

// The one epoch rule, for set_epoch and load_state_dict: 0 <= epoch < INT64_MAX (the next epoch
// must exist).
void check_epoch(int64_t epoch, const char* op) {
  TORCH_CHECK_VALUE(epoch >= 0 && epoch < std::numeric_limits<int64_t>::max(), "torchspeed.data.",
                    op, ": epoch must be in [0, 2^63 - 1), got ", epoch);
}

int64_t batches_for(int64_t samples, const LoaderOptions& o) {
  return batch_count(samples, o.batch_size, o.drop_last);
}

}  // namespace

void Loader::set_epoch(int64_t epoch) {
  check_epoch(epoch, "Loader.set_epoch");
  impl_->check_not_forked();
  std::lock_guard<std::mutex> g(impl_->mu);
  // During an epoch (torch: inside the batch loop) it sets the next epoch and the current one
  // runs to its end; between epochs it sets the coming one.
  if (impl_->in_epoch) {
    impl_->pending_epoch = epoch;
  } else {
    impl_->epoch = epoch;
    impl_->resume_batch = 0;
  }
}

void Loader::set_indices(std::vector<int64_t> indices) {
  const int64_t n = impl_->source->size();
  for (auto i : indices) {
    TORCH_CHECK_VALUE(i >= 0 && i < n, "torchspeed.data.Loader: sampler index must be in [0, ", n,
                      "), got ", i);
  }
  std::lock_guard<std::mutex> g(impl_->mu);
  impl_->user_indices = std::move(indices);
}

void Loader::clear_indices() {
  std::lock_guard<std::mutex> g(impl_->mu);
  impl_->user_indices.reset();
}

int64_t Loader::epoch() const {
  std::lock_guard<std::mutex> g(impl_->mu);
  return impl_->epoch;
}

int64_t Loader::num_batches() const {
  const auto& o = impl_->opt;
  {
    std::lock_guard<std::mutex> g(impl_->mu);
    if (impl_->user_indices) {
      return batches_for(static_cast<int64_t>(impl_->user_indices->size()), o);
    }
  }
  const int64_t n = impl_->source->size();
  if (o.world_size == 1) return batches_for(n, o);
  return batches_for(o.drop_uneven ? n / o.world_size : (n + o.world_size - 1) / o.world_size, o);
}

int64_t Loader::dataset_size() const { return impl_->source->size(); }

std::map<std::string, int64_t> Loader::state_dict() const {
  std::lock_guard<std::mutex> g(impl_->mu);
  const Impl& d = *impl_;
  const int64_t consumed = d.in_epoch ? d.next_deliver : d.resume_batch;
  return {{"epoch", d.epoch},
          {"batches_consumed", consumed},
          {"seed", static_cast<int64_t>(d.opt.seed)},
          {"dataset_size", d.source->size()},
          {"batch_size", d.opt.batch_size},
          {"world_size", d.opt.world_size},
          {"rank", d.opt.rank},
          {"shuffle", d.opt.shuffle ? 1 : 0},
          {"drop_last", d.opt.drop_last ? 1 : 0},
          {"skipped", d.skipped}};
}

void Loader::load_state_dict(const std::map<std::string, int64_t>& state) {
  // Validates every field before changing anything (a failed load leaves the loader as it was).
  constexpr const char* op = "torchspeed.data.Loader.load_state_dict";
  for (const auto& [k, v] : state) {
    (void)v;
    TORCH_CHECK_VALUE(std::find_if(std::begin(kStateKeys), std::end(kStateKeys),
                                   [&](const char* e) { return k == e; }) != std::end(kStateKeys),
                      op, ": unexpected key '", escape_invalid_utf8(k),
                      "' (a loader state has epoch, batches_consumed, seed, dataset_size, ",
                      "batch_size, world_size, rank, shuffle, drop_last, skipped)");
  }
  auto get = [&](const char* k) {
    auto it = state.find(k);
    TORCH_CHECK_VALUE(it != state.end(), op, ": missing key '", k, "'");
    return it->second;
  };
  const Impl& d = *impl_;
  const auto& o = d.opt;
  // What shapes the sample order must match: another value gives other batches.
  const std::pair<const char*, int64_t> must_match[] = {
      {"seed", static_cast<int64_t>(o.seed)}, {"dataset_size", d.source->size()},
      {"batch_size", o.batch_size},           {"world_size", o.world_size},
      {"shuffle", o.shuffle ? 1 : 0},         {"drop_last", o.drop_last ? 1 : 0}};
  for (const auto& [k, mine] : must_match) {
    TORCH_CHECK_VALUE(get(k) == mine, op, ": the state was saved with ", k, "=", get(k),
                      ", this loader has ", k, "=", mine,
                      " (resuming needs the same sample order: same seed, dataset, batch_size, ",
                      "world_size, shuffle and drop_last)");
  }
  const int64_t rank = get("rank");  // may differ: one rank's state restores every rank
  TORCH_CHECK_VALUE(rank >= 0 && rank < o.world_size, op, ": rank must be in [0, ", o.world_size,
                    "), got ", rank);
  const int64_t epoch = get("epoch");
  check_epoch(epoch, "Loader.load_state_dict");
  const int64_t consumed = get("batches_consumed");
  const int64_t per_epoch = num_batches();
  TORCH_CHECK_VALUE(consumed >= 0 && consumed <= per_epoch, op,
                    ": batches_consumed must be in [0, ", per_epoch,
                    "] (the batches of one epoch), got ", consumed);
  const int64_t skipped = get("skipped");
  TORCH_CHECK_VALUE(skipped >= 0, op, ": skipped must be >= 0, got ", skipped);

  impl_->check_not_forked();
  std::unique_lock<std::mutex> lk(impl_->mu);
  impl_->drain_locked(lk);
  impl_->epoch = epoch;
  impl_->pending_epoch.reset();
  impl_->resume_batch = consumed;
  impl_->in_epoch = false;
  impl_->skipped = skipped;
}

LoaderStats Loader::stats() const {
  const Impl& d = *impl_;
  LoaderStats s;
  s.batches = d.batches.load();
  s.samples = d.samples.load();
  s.read_s = d.read_s.get();
  s.decode_s = d.decode_s.get();
  s.transform_s = d.transform_s.get();
  s.collate_s = d.collate_s.get();
  s.copy_s = d.copy_s.get();
  s.consumer_wait_s = d.wait_s.get();
  const int64_t rc = d.ready_count.load();
  s.mean_ready_batches = rc > 0 ? static_cast<double>(d.ready_sum.load()) / rc : 0.0;
  std::lock_guard<std::mutex> g(d.mu);
  s.elapsed_s = seconds_since(d.epoch_start);
  s.samples_per_s = s.elapsed_s > 0 ? d.epoch_samples.load() / s.elapsed_s : 0.0;
  for (const auto& b : d.inflight) s.ready_batches += b->ready;
  s.slots = static_cast<int64_t>(d.slots.size());
  s.skipped = d.skipped;
  s.last_error = d.last_error;
  return s;
}

void Loader::reset_stats() {
  Impl& d = *impl_;
  for (auto* a : {&d.read_s, &d.decode_s, &d.transform_s, &d.collate_s, &d.copy_s, &d.wait_s}) {
    a->reset();
  }
  d.batches = 0;
  d.samples = 0;
  d.ready_sum = 0;
  d.ready_count = 0;
  d.epoch_samples = 0;
  std::lock_guard<std::mutex> g(d.mu);
  d.epoch_start = Clock::now();
}

void Loader::shutdown() { impl_->shutdown(); }

const LoaderOptions& Loader::options() const { return impl_->opt; }

}  // namespace torchspeed::data
