// The state of a torchspeed::data::Loader and its parts' interfaces, split by job:
//   loader_workers.cpp   the worker threads and the ring of batch slots
//   loader_errors.cpp    the error policy (on_error: raise or skip) on a finished batch
//   loader_schedule.cpp  epochs, in-order delivery, draining and shutdown
//   loader_device.cpp    the copy of a batch to the device on a side stream
//   loader.cpp           the public Loader (options checks, epochs, state_dict, stats)
// Every wait has a stop flag and a bounded slice.
#pragma once

#include <c10/core/Event.h>
#include <unistd.h>

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "core/clock.h"
#include "data/sources.h"
#include "torchspeed/data/loader.h"

namespace torchspeed::data {
namespace detail {

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

}  // namespace detail

struct Loader::Impl {
  using AtomicSeconds = detail::AtomicSeconds;
  using InFlight = detail::InFlight;
  using Slot = detail::Slot;

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

  void allocate_slot(Slot* s);

  bool slot_referenced(const Slot& s) const;

  // Called by the consumer before waiting: returns handed-out slots to the free list. The most
  // recent one is the user's current batch and is kept unless `all`.
  void recycle_locked(bool all = false);

  bool has_work_locked() const;

  void worker_loop();

  // Applies the error policy to a complete batch (only the finishing worker touches it).
  void finalize(InFlight* b, Slot* slot);

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

  void start_threads_locked();

  // Abandons in-flight work: bumps the generation and waits until no worker holds a chunk.
  void drain_locked(std::unique_lock<std::mutex>& lk);

  void start_epoch();

  // One attempt to deliver the next batch within max_wait_s seconds.
  bool next_for(double max_wait_s, Batch* out, bool* end);

  void wait_s_add(double s) { wait_s.add(s); }

  // Copies on a side stream; the caller's current stream waits for the copy on the GPU only.
  void copy_to_device(Batch* out, Slot* slot);

  void shutdown();
};

}  // namespace torchspeed::data
