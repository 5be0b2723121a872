// The recorder: interned names, one fixed ring of events per recording thread (no lock on the
// hot path), the registry readers walk, and the dropped-event count.
#include <pthread.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <new>
#include <stdexcept>
#include <string>
#include <unordered_map>
#include <vector>

#include "profile/recorder_internal.h"
#include "torchspeed/profile/profile.h"

namespace torchspeed::profile {

const char* phase_name(Phase phase) {
  switch (phase) {
    case Phase::DataWait:
      return "data_wait";
    case Phase::H2D:
      return "h2d";
    case Phase::Forward:
      return "forward";
    case Phase::Backward:
      return "backward";
    case Phase::Optimizer:
      return "optimizer";
    case Phase::Comm:
      return "comm";
    case Phase::Other:
      return "other";
    case Phase::None:
      return "none";
  }
  return "none";
}

Phase parse_phase(std::string_view name) {
  for (int i = 0; i < kNumPhases; ++i) {
    if (name == phase_name(static_cast<Phase>(i))) return static_cast<Phase>(i);
  }
  if (name == "none") return Phase::None;
  throw std::invalid_argument(
      "torchspeed.profile: phase must be one of data_wait, h2d, forward, backward, optimizer, "
      "comm, other, none; got '" +
      std::string(name) + "'");
}

// ---- names --------------------------------------------------------------------------------------

namespace {

struct Names {
  std::mutex mu;
  std::unordered_map<std::string, NameId> ids;
  std::vector<std::string> text;
};
Names& names() {
  static Names* n = new Names;  // never destroyed: ranges may run during static destruction
  return *n;
}

}  // namespace

namespace detail {
std::mutex& names_mutex() { return names().mu; }
}  // namespace detail

NameId intern(std::string_view name) {
  Names& n = names();
  std::lock_guard<std::mutex> lk(n.mu);
  auto it = n.ids.find(std::string(name));
  if (it != n.ids.end()) return it->second;
  const auto id = static_cast<NameId>(n.text.size());
  n.text.emplace_back(name);
  n.ids.emplace(std::string(name), id);
  return id;
}

std::string name_of(NameId id) {
  Names& n = names();
  std::lock_guard<std::mutex> lk(n.mu);
  if (id >= n.text.size()) {
    throw std::out_of_range("torchspeed.profile: unknown name id " + std::to_string(id));
  }
  return n.text[id];
}

// ---- rings --------------------------------------------------------------------------------------

namespace detail {

std::atomic<bool> g_enabled{[] {
  const char* env = std::getenv("TORCHSPEED_PROFILE");
  return env != nullptr && env[0] != '\0' && std::string(env) != "0";
}()};

Ring::Ring(size_t capacity_events, uint64_t tid, std::string name)
    : slots(new Slot[capacity_events]),
      mask(capacity_events - 1),
      os_tid(tid),
      thread_name(std::move(name)) {
  // Touch every page now, so the first recorded events do not pay for page faults.
  for (size_t i = 0; i < capacity_events; ++i) {
    slots[i].begin.store(0, std::memory_order_relaxed);
    slots[i].end.store(0, std::memory_order_relaxed);
    slots[i].meta.store(0, std::memory_order_relaxed);
  }
}

uint64_t Ring::take(uint64_t from, std::vector<Event>* out) {
  const uint64_t cap = mask + 1;
  const uint64_t h = head.load(std::memory_order_acquire);
  uint64_t start = std::max(from, h > cap ? h - cap : 0);
  const size_t first = out ? out->size() : 0;
  if (out) {
    for (uint64_t i = start; i < h; ++i) {
      const Slot& s = slots[i & mask];
      const uint64_t meta = s.meta.load(std::memory_order_relaxed);
      out->push_back(Event{s.begin.load(std::memory_order_relaxed),
                           s.end.load(std::memory_order_relaxed), static_cast<NameId>(meta),
                           static_cast<Phase>(meta >> 32)});
    }
  }
  // The writer kept going while we copied: the slots it reached again may be torn. Drop those,
  // including the one it may be writing now (event h2 goes where event h2 - cap was), unless no
  // one can be writing: the ring is the reader's own, or its thread has exited.
  const uint64_t h2 = head.load(std::memory_order_acquire);
  const bool quiet = this == current_ring() || exited.load(std::memory_order_acquire);
  const uint64_t in_flight = quiet ? 0 : 1;
  const uint64_t safe = h2 + in_flight > cap ? h2 + in_flight - cap : 0;
  if (safe > start && out) {
    const uint64_t torn = std::min(safe, h) - start;
    out->erase(out->begin() + static_cast<std::ptrdiff_t>(first),
               out->begin() + static_cast<std::ptrdiff_t>(first + torn));
    start += torn;
  }
  mark_read(std::min(start, h), h);
  return h;
}

void Ring::mark_read(uint64_t first_read, uint64_t upto) {
  // Events in [covered, first_read) were overwritten before any reader saw them.
  uint64_t c = covered.load(std::memory_order_relaxed);
  while (c < upto) {
    if (covered.compare_exchange_weak(c, upto, std::memory_order_relaxed)) {
      if (first_read > c) lost.fetch_add(first_read - c, std::memory_order_relaxed);
      break;
    }
  }
}

uint64_t Ring::unread_lost() const {
  const uint64_t cap = mask + 1;
  const uint64_t h = head.load(std::memory_order_acquire);
  const uint64_t c = covered.load(std::memory_order_relaxed);
  const uint64_t oldest = h > cap ? h - cap : 0;
  return lost.load(std::memory_order_relaxed) + (oldest > c ? oldest - c : 0);
}

Registry& registry() {
  static Registry* r = new Registry;  // never destroyed, like names()
  return *r;
}

namespace {

size_t ring_capacity_from_env() {
  const char* env = std::getenv("TORCHSPEED_PROFILE_RING");
  if (env == nullptr) return 65536;
  char* endp = nullptr;
  const unsigned long long v = std::strtoull(env, &endp, 10);
  if (endp == env || *endp != '\0' || v < 1024 || v > (1u << 24)) return 65536;
  size_t p = 1024;
  while (p < v) p <<= 1;
  return p;
}
std::atomic<size_t> g_ring_capacity{ring_capacity_from_env()};

// Marks the thread's ring exited when the thread ends, so the registry may let it go later.
struct ThreadRing {
  std::shared_ptr<Ring> ring;
  bool failed = false;
  ~ThreadRing() {
    if (ring) ring->exited.store(true, std::memory_order_release);
  }
};
thread_local ThreadRing t_ring;
// The same ring as a plain pointer: a thread_local with a destructor is reached through a guard
// check on every access, a trivial one is not (the hot path reads only this).
thread_local Ring* t_ring_ptr = nullptr;

constexpr size_t kKeptExitedRings = 64;

Ring* register_thread() noexcept {
  if (t_ring.failed) return nullptr;
  try {
    char name[64] = {0};
    pthread_getname_np(pthread_self(), name, sizeof(name));
    auto ring = std::make_shared<Ring>(g_ring_capacity.load(std::memory_order_relaxed),
                                       static_cast<uint64_t>(syscall(SYS_gettid)), name);
    Registry& r = registry();
    std::lock_guard<std::mutex> lk(r.mu);
    // Bounded memory with short-lived threads: keep the newest kKeptExitedRings exited rings.
    size_t exited = 0;
    for (const auto& x : r.rings) exited += x->exited.load(std::memory_order_acquire);
    for (auto it = r.rings.begin(); it != r.rings.end() && exited > kKeptExitedRings;) {
      if ((*it)->exited.load(std::memory_order_acquire)) {
        const uint64_t h = (*it)->head.load(std::memory_order_acquire);
        const uint64_t c = (*it)->covered.load(std::memory_order_relaxed);
        r.released_lost += (*it)->unread_lost() + (h > c ? std::min(h - c, (*it)->mask + 1) : 0);
        it = r.rings.erase(it);
        --exited;
      } else {
        ++it;
      }
    }
    r.rings.push_back(ring);
    t_ring.ring = std::move(ring);
    t_ring_ptr = t_ring.ring.get();
    return t_ring_ptr;
  } catch (...) {
    t_ring.failed = true;  // out of memory: this thread records nothing, and counts it
    return nullptr;
  }
}

}  // namespace

Ring* current_ring() noexcept { return t_ring_ptr; }

namespace {
// fork(): the child has only the forking thread. The locks are held across the fork so the child
// never inherits one locked by a thread that no longer exists; the child then forgets the
// parent's rings (their threads are gone, and their events are the parent's) and starts its own.
void before_fork() {
  names_mutex().lock();
  registry().mu.lock();
}
void after_fork_parent() {
  registry().mu.unlock();
  names_mutex().unlock();
}
void after_fork_child() {
  Registry& r = registry();
  r.rings.clear();
  r.released_lost = 0;
  r.mu.unlock();
  names_mutex().unlock();
  t_ring_ptr = nullptr;
  t_ring.ring.reset();
  t_ring.failed = false;
}
[[maybe_unused]] const int g_atfork =
    pthread_atfork(before_fork, after_fork_parent, after_fork_child);
}  // namespace

Ring* this_thread_ring() noexcept {
  Ring* r = t_ring_ptr;
  return r != nullptr ? r : register_thread();
}

namespace {
// The thread's first event: out of line, so record() itself stays a leaf with no saved registers.
[[gnu::noinline, gnu::cold]] void record_first(uint64_t begin, uint64_t end, NameId name,
                                               Phase phase) noexcept {
  if (register_thread() != nullptr) {
    record(begin, end, name, phase);
  } else {  // no memory for a ring: counted, so the trace says it is incomplete
    registry().not_recorded.fetch_add(1, std::memory_order_relaxed);
  }
}
}  // namespace

void record(uint64_t begin, uint64_t end, NameId name, Phase phase) noexcept {
  Ring* r = t_ring_ptr;
  if (__builtin_expect(r == nullptr, 0)) return record_first(begin, end, name, phase);
  const uint64_t h = r->head.load(std::memory_order_relaxed);
  Slot& s = r->slots[h & r->mask];
  s.begin.store(begin, std::memory_order_relaxed);
  s.end.store(end, std::memory_order_relaxed);
  s.meta.store(static_cast<uint64_t>(name) | (static_cast<uint64_t>(phase) << 32),
               std::memory_order_relaxed);
  r->head.store(h + 1, std::memory_order_release);
}

}  // namespace detail

void set_enabled(bool on) noexcept { detail::g_enabled.store(on, std::memory_order_relaxed); }

size_t ring_capacity() noexcept { return detail::g_ring_capacity.load(std::memory_order_relaxed); }

void set_ring_capacity(size_t events) {
  if (events < 1024 || events > (size_t{1} << 24)) {
    throw std::invalid_argument(
        "torchspeed.profile: ring capacity must be in [1024, 16777216] events, got " +
        std::to_string(events));
  }
  size_t p = 1024;
  while (p < events) p <<= 1;
  detail::g_ring_capacity.store(p, std::memory_order_relaxed);
}

uint64_t dropped_events() noexcept {
  detail::Registry& r = detail::registry();
  std::lock_guard<std::mutex> lk(r.mu);
  uint64_t n = r.released_lost + r.not_recorded.load(std::memory_order_relaxed);
  for (const auto& ring : r.rings) n += ring->unread_lost();
  return n;
}

std::vector<ThreadEvents> snapshot() {
  detail::Registry& r = detail::registry();
  std::vector<std::shared_ptr<detail::Ring>> rings;
  {
    std::lock_guard<std::mutex> lk(r.mu);
    rings = r.rings;
  }
  std::vector<ThreadEvents> out;
  out.reserve(rings.size());
  for (const auto& ring : rings) {
    ThreadEvents te;
    te.os_tid = ring->os_tid;
    te.thread_name = ring->thread_name;
    ring->take(ring->cleared.load(std::memory_order_relaxed), &te.events);
    out.push_back(std::move(te));
  }
  return out;
}

void clear() noexcept {
  detail::Registry& r = detail::registry();
  std::lock_guard<std::mutex> lk(r.mu);
  r.released_lost = 0;
  r.not_recorded.store(0, std::memory_order_relaxed);
  for (const auto& ring : r.rings) {
    const uint64_t h = ring->head.load(std::memory_order_acquire);
    ring->cleared.store(h, std::memory_order_relaxed);
    ring->covered.store(h, std::memory_order_relaxed);
    ring->lost.store(0, std::memory_order_relaxed);
  }
}

// ---- begin()/end(): the per-thread stack of open ranges
// ------------------------------------------

namespace {

struct Open {
  uint64_t begin;  // 0: opened while profiling was off (closed without recording)
  NameId name;
  Phase phase;
};
constexpr size_t kMaxOpen = 1024;
struct OpenStack {
  std::vector<Open> open;
  size_t overflow = 0;  // begin() calls past kMaxOpen, matched by end() without recording
};
thread_local OpenStack t_open;

}  // namespace

void begin(NameId name, Phase phase) noexcept {
  OpenStack& s = t_open;
  if (s.open.size() >= kMaxOpen) {
    ++s.overflow;
    detail::registry().not_recorded.fetch_add(1, std::memory_order_relaxed);
    return;
  }
  try {
    if (s.open.capacity() == 0) s.open.reserve(64);
    const bool on = enabled();
    if (on && detail::g_nvtx) detail::nvtx_push(name);
    s.open.push_back(Open{on ? ticks() : 0, name, phase});
  } catch (...) {
    ++s.overflow;
    detail::registry().not_recorded.fetch_add(1, std::memory_order_relaxed);
  }
}

namespace {

bool close_at(OpenStack& s, size_t index, uint64_t t) noexcept {
  const Open o = s.open[index];
  s.open.erase(s.open.begin() + static_cast<std::ptrdiff_t>(index));
  if (o.begin != 0) {
    if (enabled()) detail::record(o.begin, t, o.name, o.phase);
    if (detail::g_nvtx) detail::nvtx_pop();
  }
  return true;
}

}  // namespace

bool end() noexcept {
  const uint64_t t = ticks();
  OpenStack& s = t_open;
  if (s.overflow > 0) {
    --s.overflow;
    return true;
  }
  if (s.open.empty()) return false;
  return close_at(s, s.open.size() - 1, t);
}

bool end(NameId name) noexcept {
  const uint64_t t = ticks();
  OpenStack& s = t_open;
  for (size_t i = s.open.size(); i-- > 0;) {
    if (s.open[i].name == name) return close_at(s, i, t);
  }
  if (s.overflow > 0) {  // not among the kept ones: one of those past the cap
    --s.overflow;
    return true;
  }
  return false;
}

}  // namespace torchspeed::profile
