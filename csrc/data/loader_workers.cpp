// The loader's worker threads and its ring of reusable batch slots (pinned when CUDA is
// available): workers fill rows of the oldest in-flight batch first.
#include <algorithm>
#include <cstring>
#include <memory>

#ifdef __linux__
#include <pthread.h>
#endif

#include "core/utf8.h"
#include "data/loader_impl.h"
#include "torchspeed/profile/profile.h"

namespace torchspeed::data {

void Loader::Impl::allocate_slot(Slot* s) {
  s->tensors.clear();
  s->strings.clear();
  for (const auto& f : fields) {
    if (f.is_string) {
      s->tensors.emplace_back();
      s->strings.emplace_back(static_cast<size_t>(opt.batch_size));
    } else {
      std::vector<int64_t> shape{opt.batch_size};
      shape.insert(shape.end(), f.shape.begin(), f.shape.end());
      s->tensors.push_back(at::empty(shape, at::TensorOptions().dtype(f.dtype).pinned_memory(pin)));
      s->strings.emplace_back();
    }
  }
}

bool Loader::Impl::slot_referenced(const Slot& s) const {
  for (const auto& t : s.tensors) {
    if (t.defined() && t.storage().use_count() > 1) return true;
  }
  return false;
}

// Called by the consumer before waiting: returns handed-out slots to the free list. The most
// recent one is the user's current batch and is kept unless `all`.
void Loader::Impl::recycle_locked(bool all) {
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

bool Loader::Impl::has_work_locked() const {
  if (paused) return false;
  for (const auto& b : inflight) {
    if (b->next_row < static_cast<int64_t>(b->indices.size())) return true;
  }
  return next_schedule < nbatches && !free_slots.empty();
}

void Loader::Impl::worker_loop() {
#ifdef __linux__
  // Named so tools (top -H, py-spy) and the doctor (profile/loader_cpu.py, which reads this
  // thread's CPU time from /proc) tell the loader's threads from torch's intra-op threads.
  pthread_setname_np(pthread_self(), "ts-loader");
#endif
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
    TORCHSPEED_RANGE("torchspeed.data.fill_batch");  // a worker's batch, on its thread's track

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

void Loader::Impl::start_threads_locked() {
  if (!threads.empty()) return;
  threads_pid = getpid();
  stop = false;
  const int n = std::max(1, opt.num_workers);
  for (int i = 0; i < n; ++i) threads.emplace_back([this] { worker_loop(); });
}

}  // namespace torchspeed::data
