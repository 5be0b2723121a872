// Epochs and delivery: the order of an epoch, in-order delivery to the consumer with bounded
// waits, draining abandoned work, and shutdown (resumable mid-epoch).
#include <algorithm>
#include <chrono>

#include "data/loader_impl.h"
#include "data/sampling.h"

namespace torchspeed::data {

// Abandons in-flight work: bumps the generation and waits until no worker holds a chunk.
void Loader::Impl::drain_locked(std::unique_lock<std::mutex>& lk) {
  paused = true;
  ++generation;
  while (active > 0) idle_cv.wait_for(lk, std::chrono::milliseconds(50));
  for (auto& b : inflight) free_slots.push_back(b->slot);
  inflight.clear();
}

void Loader::Impl::start_epoch() {
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
  if (resume_batch > nbatches) {          // load_state_dict checked the order it knew; a sampler's
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
bool Loader::Impl::next_for(double max_wait_s, Batch* out, bool* end) {
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
  // The deadline is a wait, not a measurement: steady_clock, which condition variables wait on.
  using WaitClock = std::chrono::steady_clock;
  const auto deadline = WaitClock::now() + std::chrono::duration_cast<WaitClock::duration>(
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
    if (WaitClock::now() >= deadline) {
      wait_s_add(seconds_since(t0));
      return false;
    }
    ready_cv.wait_until(lk, std::min(deadline, WaitClock::now() + std::chrono::milliseconds(100)));
  }
  wait_s_add(seconds_since(t0));
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
    return next_for(std::max(0.0, max_wait_s - seconds_since(t0)), out, end);
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

void Loader::Impl::shutdown() {
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

}  // namespace torchspeed::data
