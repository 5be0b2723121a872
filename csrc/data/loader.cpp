// torchspeed::data::Loader: worker threads fill rows of in-flight batches in a ring of reusable
// slots; the consumer takes batches in order. Every wait has a stop flag and a bounded slice.
#include "torchspeed/data/loader.h"

#include <c10/core/DeviceGuard.h>
#include <c10/core/Event.h>
#include <c10/core/Stream.h>
#include <c10/core/StreamGuard.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <iterator>
#include <limits>
#include <mutex>
#include <thread>

#include "sampling.h"
#include "sources.h"
#include "utf8.h"

namespace torchspeed {
namespace data {
namespace {

using Clock = std::chrono::steady_clock;
double since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// Seconds summed from many threads, stored as integer nanoseconds.
struct AtomicSeconds {
  std::atomic<int64_t> ns{0};
  void add(double s) { ns.fetch_add(static_cast<int64_t>(s * 1e9), std::memory_order_relaxed); }
  double get() const { return static_cast<double>(ns.load(std::memory_order_relaxed)) * 1e-9; }
  void reset() { ns.store(0); }
};

struct Slot {
  std::vector<at::Tensor> tensors;                // [batch_size, ...] per tensor field
  std::vector<std::vector<std::string>> strings;  // per string field
  std::optional<c10::Event> copy_done;            // device copy that still reads the slot
};

struct InFlight {
  int64_t batch = 0;
  int slot = -1;
  std::vector<int64_t> indices;
  int64_t next_row = 0;             // rows handed to workers
  int64_t done_rows = 0;            // rows finished
  std::vector<std::string> errors;  // per row; empty = ok
  bool ready = false;
  int64_t valid_rows = 0;
  std::string error;       // on_error="raise": the first failing row's message
  int64_t skipped = 0;     // on_error="skip": rows dropped (counted when the batch is delivered)
  std::string last_error;  // on_error="skip": the last dropped row's message
};

}  // namespace

struct Loader::Impl {
  std::shared_ptr<Source> source;
  LoaderOptions opt;
  bool skip_errors = false;
  std::vector<FieldSpec> fields;
  bool pin = false;
  c10::optional<c10::Device> device;

  // ---- state guarded by mu
  mutable std::mutex mu;
  std::condition_variable work_cv;   // workers: new work or stop
  std::condition_variable ready_cv;  // consumer: batch ready
  std::condition_variable idle_cv;   // restart: workers left the old epoch
  std::vector<std::thread> threads;
  bool stop = false;
  bool paused = true;  // no epoch running
  uint64_t generation = 0;
  int active = 0;     // chunks being processed
  std::string fatal;  // unexpected worker failure

  std::vector<Slot> slots;
  std::vector<int> free_slots;
  std::deque<int> handed;  // slots handed to the consumer, oldest first
  std::deque<std::unique_ptr<InFlight>> inflight;

  int64_t epoch = 0;
  std::optional<int64_t> pending_epoch;  // set_epoch() during an epoch: applies to the next one
  bool in_epoch = false;
  int64_t resume_batch = 0;
  std::optional<std::vector<int64_t>> user_indices;  // a sampler's order (may be empty)
  std::vector<int64_t> order;
  int64_t nbatches = 0;
  int64_t next_schedule = 0;
  int64_t next_deliver = 0;

  // ---- stats
  AtomicSeconds read_s, decode_s, transform_s, collate_s, copy_s, wait_s;
  std::atomic<int64_t> batches{0}, samples{0}, ready_sum{0}, ready_count{0};
  // Skipped samples of delivered batches (guarded by mu): exact whatever the workers are doing.
  int64_t skipped = 0;
  std::atomic<int64_t> epoch_samples{0};  // for samples_per_s of the current epoch
  Clock::time_point epoch_start = Clock::now();
  std::string last_error;  // guarded by mu

  int64_t rows_of(int64_t b) const {
    return std::min(opt.batch_size, static_cast<int64_t>(order.size()) - b * opt.batch_size);
  }

  void allocate_slot(Slot* s) {
    s->tensors.clear();
    s->strings.clear();
    for (const auto& f : fields) {
      if (f.is_string) {
        s->tensors.emplace_back();
        s->strings.emplace_back(static_cast<size_t>(opt.batch_size));
      } else {
        std::vector<int64_t> shape{opt.batch_size};
        shape.insert(shape.end(), f.shape.begin(), f.shape.end());
        s->tensors.push_back(
            at::empty(shape, at::TensorOptions().dtype(f.dtype).pinned_memory(pin)));
        s->strings.emplace_back();
      }
    }
  }

  bool slot_referenced(const Slot& s) const {
    for (const auto& t : s.tensors) {
      if (t.defined() && t.storage().use_count() > 1) return true;
    }
    return false;
  }

  // Called by the consumer before waiting: returns handed-out slots to the free list. The most
  // recent one is the user's current batch and is kept unless `all`.
  void recycle_locked(bool all = false) {
    while (handed.size() > (all ? 0u : 1u)) {
      const int s = handed.front();
      handed.pop_front();
      Slot& slot = slots[static_cast<size_t>(s)];
      if (slot.copy_done) {
        slot.copy_done->synchronize();  // normally long complete: it was issued 2 batches ago
        slot.copy_done.reset();
      }
      if (slot_referenced(slot)) allocate_slot(&slot);  // the user kept it: give it away
      free_slots.push_back(s);
    }
    work_cv.notify_all();
  }

  bool has_work_locked() const {
    if (paused) return false;
    for (const auto& b : inflight) {
      if (b->next_row < static_cast<int64_t>(b->indices.size())) return true;
    }
    return next_schedule < nbatches && !free_slots.empty();
  }

  void worker_loop() {
    std::unique_lock<std::mutex> lk(mu);
    StageTimes times;
    while (true) {
      work_cv.wait(lk, [&] { return stop || has_work_locked(); });
      if (stop) return;
      InFlight* b = nullptr;
      for (auto& p : inflight) {
        if (p->next_row < static_cast<int64_t>(p->indices.size())) {
          b = p.get();
          break;
        }
      }
      if (b == nullptr) {  // start a new batch in a free slot
        auto nb = std::make_unique<InFlight>();
        nb->batch = next_schedule++;
        nb->slot = free_slots.back();
        free_slots.pop_back();
        const int64_t rows = rows_of(nb->batch);
        nb->indices.assign(order.begin() + nb->batch * opt.batch_size,
                           order.begin() + nb->batch * opt.batch_size + rows);
        nb->errors.resize(static_cast<size_t>(rows));
        b = nb.get();
        inflight.push_back(std::move(nb));
      }
      const int64_t rows = static_cast<int64_t>(b->indices.size());
      const int64_t r0 = b->next_row;
      // Batched sources take the whole batch; per-sample sources take small chunks so that all
      // threads work on the oldest batch first (low first-batch latency).
      const int64_t nthreads = static_cast<int64_t>(threads.size());
      const int64_t chunk =
          source->batched() ? rows : std::min<int64_t>(8, rows / (4 * nthreads) + 1);
      const int64_t r1 = std::min(rows, r0 + chunk);
      b->next_row = r1;
      ++active;
      const uint64_t gen = generation;
      Slot& slot = slots[static_cast<size_t>(b->slot)];
      const uint64_t ep = static_cast<uint64_t>(epoch);
      lk.unlock();

      FillContext ctx{opt.seed, ep, &times};
      SlotView view{&slot.tensors, &slot.strings};
      bool failed_hard = false;
      std::string hard_msg;
      try {
        if (source->batched()) {
          try {
            source->fill_batch(b->indices, view, ctx);
          } catch (const std::exception& e) {
            const std::string msg = escape_invalid_utf8(e.what());
            for (int64_t r = r0; r < r1; ++r) b->errors[static_cast<size_t>(r)] = msg;
          }
        } else {
          for (int64_t r = r0; r < r1; ++r) {
            try {
              source->fill(b->indices[static_cast<size_t>(r)], r, view, ctx);
            } catch (const std::exception& e) {
              b->errors[static_cast<size_t>(r)] = escape_invalid_utf8(e.what());
            }
          }
        }
      } catch (...) {
        failed_hard = true;
        hard_msg = "torchspeed.data.Loader: a worker thread failed with a non-standard exception";
      }
      read_s.add(times.read);
      decode_s.add(times.decode);
      transform_s.add(times.transform);
      collate_s.add(times.collate);
      times = StageTimes{};

      bool complete = false;
      lk.lock();
      if (failed_hard) fatal = hard_msg;
      if (gen == generation) {
        b->done_rows += r1 - r0;
        complete = b->done_rows == rows;
      }
      if (complete) {
        lk.unlock();
        finalize(b, &slot);
        lk.lock();
        b->ready = true;
        ready_cv.notify_all();
      }
      --active;
      if (active == 0) idle_cv.notify_all();
      if (failed_hard) ready_cv.notify_all();
    }
  }

  // Applies the error policy to a complete batch (only the finishing worker touches it).
  void finalize(InFlight* b, Slot* slot) {
    const int64_t rows = static_cast<int64_t>(b->indices.size());
    int64_t bad = 0;
    for (const auto& e : b->errors) bad += !e.empty();
    b->valid_rows = rows;
    if (bad == 0) return;
    if (!skip_errors) {
      for (const auto& e : b->errors) {
        if (!e.empty()) {
          b->error = e;
          break;
        }
      }
      return;
    }
    // Skip: compact the good rows to the front, in order (deterministic for any worker count).
    auto t0 = Clock::now();
    int64_t dst = 0;
    std::vector<int64_t> kept;
    for (int64_t r = 0; r < rows; ++r) {
      if (!b->errors[static_cast<size_t>(r)].empty()) continue;
      if (dst != r) {
        for (size_t f = 0; f < fields.size(); ++f) {
          if (fields[f].is_string) {
            slot->strings[f][static_cast<size_t>(dst)] = slot->strings[f][static_cast<size_t>(r)];
          } else {
            at::Tensor& t = slot->tensors[f];
            const size_t rb = static_cast<size_t>(t.numel() / t.size(0)) * t.element_size();
            auto* base = static_cast<uint8_t*>(t.data_ptr());
            std::memmove(base + static_cast<size_t>(dst) * rb, base + static_cast<size_t>(r) * rb,
                         rb);
          }
        }
      }
      kept.push_back(b->indices[static_cast<size_t>(r)]);
      ++dst;
    }
    collate_s.add(since(t0));
    b->skipped = bad;
    for (const auto& e : b->errors) {
      if (!e.empty()) b->last_error = e;
    }
    std::lock_guard<std::mutex> g(mu);
    b->indices = std::move(kept);
    b->valid_rows = dst;
  }

  // The process that started the worker threads. A forked child (torch DataLoader workers,
  // multiprocessing) inherits the object but not the threads: it must neither use nor join them.
  // Read without the mutex, which a parent thread may have held at fork time. 0: no threads.
  std::atomic<pid_t> threads_pid{0};
  bool forked_away() const {
    const pid_t p = threads_pid.load();
    return p != 0 && p != getpid();
  }
  void check_not_forked() const {
    TORCH_CHECK(!forked_away(),
                "torchspeed.data.Loader: this loader's worker threads run in process ",
                threads_pid.load(), "; it cannot be used in the forked process ", getpid(),
                " (create the loader in the process that iterates it)");
  }

  void start_threads_locked() {
    if (!threads.empty()) return;
    threads_pid = getpid();
    stop = false;
    const int n = std::max(1, opt.num_workers);
    for (int i = 0; i < n; ++i) threads.emplace_back([this] { worker_loop(); });
  }

  // Abandons in-flight work: bumps the generation and waits until no worker holds a chunk.
  void drain_locked(std::unique_lock<std::mutex>& lk) {
    paused = true;
    ++generation;
    while (active > 0) idle_cv.wait_for(lk, std::chrono::milliseconds(50));
    for (auto& b : inflight) free_slots.push_back(b->slot);
    inflight.clear();
  }

  void start_epoch() {
    check_not_forked();
    std::unique_lock<std::mutex> lk(mu);
    if (!fatal.empty()) TORCH_CHECK(false, fatal);
    drain_locked(lk);
    if (in_epoch) {  // an abandoned epoch: move on like a new torch iterator
      epoch = pending_epoch.value_or(epoch + 1);
      resume_batch = 0;
    }
    pending_epoch.reset();
    recycle_locked(/*all=*/true);
    if (user_indices) {
      order = *user_indices;
    } else {
      order = epoch_indices(source->size(), opt.shuffle, opt.seed, static_cast<uint64_t>(epoch),
                            opt.rank, opt.world_size, opt.drop_uneven);
    }
    nbatches = batch_count(static_cast<int64_t>(order.size()), opt.batch_size, opt.drop_last);
    if (resume_batch > nbatches) {  // load_state_dict checked the order it knew; a sampler's
      const int64_t wanted = resume_batch;  // order is known only now
      resume_batch = 0;
      TORCH_CHECK_VALUE(false, "torchspeed.data.Loader: the loaded state resumes after batch ",
                        wanted, " but this epoch has ", nbatches,
                        " batches (the sampler's length changed since the state was saved?)");
    }
    next_schedule = next_deliver = resume_batch;
    resume_batch = 0;
    in_epoch = true;
    epoch_start = Clock::now();
    epoch_samples = 0;
    start_threads_locked();
    paused = false;
    work_cv.notify_all();
  }

  // One attempt to deliver the next batch within max_wait_s seconds.
  bool next_for(double max_wait_s, Batch* out, bool* end) {
    *end = false;
    check_not_forked();
    std::unique_lock<std::mutex> lk(mu);
    if (!in_epoch) {
      lk.unlock();
      start_epoch();
      lk.lock();
    } else if (threads.empty()) {  // shut down mid-epoch: resume where the consumer is
      start_threads_locked();
      paused = false;
      work_cv.notify_all();
    }
    recycle_locked();
    const auto deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                             std::chrono::duration<double>(max_wait_s));
    const auto t0 = Clock::now();
    while (true) {
      if (!fatal.empty()) TORCH_CHECK(false, fatal);
      if (next_deliver >= nbatches) {
        in_epoch = false;
        paused = true;
        epoch = pending_epoch.value_or(epoch + 1);  // what the next start_epoch runs
        pending_epoch.reset();
        *end = true;
        return false;
      }
      InFlight* front = inflight.empty() ? nullptr : inflight.front().get();
      if (front != nullptr && front->batch == next_deliver && front->ready) break;
      if (Clock::now() >= deadline) {
        wait_s_add(since(t0));
        return false;
      }
      ready_cv.wait_until(lk, std::min(deadline, Clock::now() + std::chrono::milliseconds(100)));
    }
    wait_s_add(since(t0));
    int64_t ready_now = 0;
    for (const auto& b : inflight) ready_now += b->ready;
    ready_sum += ready_now - 1;
    ++ready_count;

    std::unique_ptr<InFlight> b = std::move(inflight.front());
    inflight.pop_front();
    ++next_deliver;
    skipped += b->skipped;
    if (!b->last_error.empty()) last_error = std::move(b->last_error);
    work_cv.notify_all();
    if (!b->error.empty()) {
      free_slots.push_back(b->slot);
      work_cv.notify_all();
      TORCH_CHECK(false, "torchspeed.data.Loader: ", b->error);
    }
    if (b->valid_rows == 0) {  // every sample skipped: move on to the next batch
      free_slots.push_back(b->slot);
      work_cv.notify_all();
      lk.unlock();
      return next_for(std::max(0.0, max_wait_s - since(t0)), out, end);
    }
    handed.push_back(b->slot);
    Slot& slot = slots[static_cast<size_t>(b->slot)];
    out->epoch = epoch;
    out->index = b->batch;
    out->tensors.clear();
    out->strings.clear();
    for (size_t f = 0; f < fields.size(); ++f) {
      if (fields[f].is_string) {
        out->strings[fields[f].name] = std::vector<std::string>(
            slot.strings[f].begin(), slot.strings[f].begin() + b->valid_rows);
      } else {
        out->tensors[fields[f].name] = slot.tensors[f].narrow(0, 0, b->valid_rows);
      }
    }
    out->sample_indices = b->indices;
    batches += 1;
    samples += b->valid_rows;
    epoch_samples += b->valid_rows;
    lk.unlock();
    if (device) copy_to_device(out, &slot);
    return true;
  }

  void wait_s_add(double s) { wait_s.add(s); }

  // Copies on a side stream; the caller's current stream waits for the copy on the GPU only.
  void copy_to_device(Batch* out, Slot* slot) {
    const auto t0 = Clock::now();
    const c10::impl::VirtualGuardImpl impl(device->type());
    const c10::Stream current = impl.getStream(*device);
    const c10::Stream side = impl.getStreamFromGlobalPool(*device);
    std::map<std::string, at::Tensor> moved;
    {
      c10::StreamGuard guard(side);
      for (auto& [name, t] : out->tensors) {
        at::Tensor dst = at::empty(t.sizes(), t.options().device(*device).pinned_memory(false));
        dst.copy_(t, /*non_blocking=*/pin);
        moved[name] = dst;
      }
    }
    c10::Event done(device->type());
    done.record(side);
    done.block(current);
    // Allocated on `side`, used on `current`: tell the caching allocator.
    for (auto& [name, t] : moved) t.record_stream(current);
    slot->copy_done = std::move(done);  // the slot's host memory is reused only after the copy
    out->tensors = std::move(moved);
    copy_s.add(since(t0));
  }

  void shutdown() {
    if (forked_away()) return;  // the threads are the parent's
    std::unique_lock<std::mutex> lk(mu);
    if (threads.empty()) return;
    drain_locked(lk);
    stop = true;
    work_cv.notify_all();
    std::vector<std::thread> ts = std::move(threads);
    threads.clear();
    lk.unlock();
    for (auto& t : ts) t.join();
    threads_pid = 0;
    lk.lock();
    stop = false;
    // An unfinished epoch stays current: next() restarts the threads and continues from the
    // consumer's position; start_epoch() abandons it like a new torch iterator would.
    next_schedule = next_deliver;
  }
};

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

std::optional<Batch> Loader::next() {
  Batch b;
  bool end = false;
  const double timeout = impl_->opt.timeout_s;
  const auto t0 = Clock::now();
  while (true) {
    if (impl_->next_for(0.1, &b, &end)) return b;
    if (end) return std::nullopt;
    TORCH_CHECK(timeout <= 0 || since(t0) < timeout, "torchspeed.data.Loader: timed out after ",
                timeout, " s waiting for batch ", impl_->next_deliver, " of epoch ", impl_->epoch);
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
  s.elapsed_s = since(d.epoch_start);
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

}  // namespace data
}  // namespace torchspeed
