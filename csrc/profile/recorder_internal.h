// The recorder's ring and registry, shared by recorder.cpp, step.cpp and trace.cpp (not installed).
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "torchspeed/profile/profile.h"

namespace torchspeed::profile::detail {

// Relaxed atomics: plain moves on x86-64 and AArch64, and a reader copying a slot the writer is
// overwriting is no data race (take() then discards the torn copy).
struct Slot {
  std::atomic<uint64_t> begin{0};
  std::atomic<uint64_t> end{0};
  std::atomic<uint64_t> meta{0};  // name | phase << 32
};

// One thread's events: written only by that thread, read by anyone.
struct Ring {
  Ring(size_t capacity_events, uint64_t tid, std::string name);
  // Appends the whole events at indices >= from to *out (oldest first; out may be null) and
  // returns the head it read up to. Marks them read for the dropped count.
  uint64_t take(uint64_t from, std::vector<Event>* out);
  void mark_read(uint64_t first_read, uint64_t upto);
  // Events overwritten before any reader saw them (counted, plus not yet counted).
  uint64_t unread_lost() const;

  std::unique_ptr<Slot[]> slots;
  uint64_t mask;
  std::atomic<uint64_t> head{0};     // events written so far
  std::atomic<uint64_t> covered{0};  // events up to here were read or counted lost
  std::atomic<uint64_t> lost{0};
  std::atomic<uint64_t> cleared{0};  // clear() hides the events before this
  std::atomic<bool> exited{false};
  uint64_t os_tid;
  std::string thread_name;
};

struct Registry {
  std::mutex mu;
  std::vector<std::shared_ptr<Ring>> rings;
  uint64_t released_lost = 0;  // unread events of exited rings that were let go
  // Ranges never recorded: begin() past the open-range cap, or a thread with no memory for a ring.
  std::atomic<uint64_t> not_recorded{0};
};
Registry& registry();
// The calling thread's ring, created on first use (null if it could not be allocated).
Ring* this_thread_ring() noexcept;
// The calling thread's ring if it has one (never creates it).
Ring* current_ring() noexcept;
// The lock of the interned names (held across fork()).
std::mutex& names_mutex();

}  // namespace torchspeed::profile::detail
