// Torch-free tests of the profiler core: the clock against steady_clock, names, ranges on and off,
// the per-thread rings (wrap, dropped count, a concurrent reader never sees a torn event), the
// step breakdown against hand-computed phase times, the StepProfiler history and the trace file.
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <new>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "catch_shim.h"
#include "torchspeed/profile/profile.h"

namespace tp = torchspeed::profile;

// Heap allocations made by the calling thread (the hot path must make none). Every unaligned form
// of new and delete is replaced, so that no block crosses between this malloc/free pair and a
// sanitizer's own operator new (ASan reports such a pair as alloc-dealloc-mismatch); the aligned
// forms stay the runtime's on both sides.
static thread_local long t_allocs = 0;
static void* counted_alloc(std::size_t n) noexcept {
  ++t_allocs;
  return std::malloc(n ? n : 1);
}
void* operator new(std::size_t n) {
  if (void* p = counted_alloc(n)) return p;
  throw std::bad_alloc();
}
void* operator new[](std::size_t n) {
  if (void* p = counted_alloc(n)) return p;
  throw std::bad_alloc();
}
void* operator new(std::size_t n, const std::nothrow_t&) noexcept { return counted_alloc(n); }
void* operator new[](std::size_t n, const std::nothrow_t&) noexcept { return counted_alloc(n); }
void operator delete(void* p) noexcept { std::free(p); }
void operator delete[](void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }
void operator delete[](void* p, std::size_t) noexcept { std::free(p); }
void operator delete(void* p, const std::nothrow_t&) noexcept { std::free(p); }
void operator delete[](void* p, const std::nothrow_t&) noexcept { std::free(p); }

namespace {

int64_t steady_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// The events this thread's ring holds, found by the thread id in a snapshot.
std::vector<tp::Event> my_events(uint64_t os_tid) {
  for (auto& te : tp::snapshot()) {
    if (te.os_tid == os_tid) return te.events;
  }
  return {};
}

uint64_t my_tid() {
  // The ring of the calling thread is the one whose newest event we just recorded.
  static const tp::NameId probe = tp::intern("test.probe");
  tp::detail::record(1, 2, probe, tp::Phase::None);
  for (auto& te : tp::snapshot()) {
    if (!te.events.empty() && te.events.back().name == probe && te.events.back().begin == 1) {
      return te.os_tid;
    }
  }
  return 0;
}

}  // namespace

TEST_CASE("profile clock: monotonic, on steady_clock's time line, TSC rate calibrated") {
  const int64_t s0 = steady_ns();
  const int64_t a = tp::now_ns();
  const int64_t s1 = steady_ns();
  // The converted TSC lands on steady_clock's time line (within the calibration's error).
  CHECK(a >= s0 - 200'000);
  CHECK(a <= s1 + 200'000);
  int64_t prev = tp::now_ns();
  for (int i = 0; i < 100000; ++i) {
    const int64_t t = tp::now_ns();
    REQUIRE(t >= prev);
    prev = t;
  }
  // A 30 ms sleep measured by both clocks agrees to 0.2 % + 20 us.
  const int64_t c0 = tp::now_ns(), q0 = steady_ns();
  std::this_thread::sleep_for(std::chrono::milliseconds(30));
  const int64_t c1 = tp::now_ns(), q1 = steady_ns();
  const double ours = static_cast<double>(c1 - c0), theirs = static_cast<double>(q1 - q0);
  CHECK(std::abs(ours - theirs) <= 0.002 * theirs + 20'000);
  CHECK(tp::ns_per_tick() > 0.01);
  CHECK(tp::ns_per_tick() < 100.0);
  const std::string src = tp::clock_source();
  CHECK((src == "tsc" || src == "steady_clock"));
}

TEST_CASE("profile names: interned once, text round trips, unknown ids throw") {
  const tp::NameId a = tp::intern("alpha"), b = tp::intern("beta");
  CHECK(a != b);
  CHECK(tp::intern("alpha") == a);
  CHECK(tp::name_of(a) == "alpha");
  CHECK(tp::name_of(b) == "beta");
  CHECK_THROWS_AS(tp::name_of(0xFFFFFFF0u), std::out_of_range);
  CHECK(tp::parse_phase("optimizer") == tp::Phase::Optimizer);
  CHECK(tp::parse_phase("none") == tp::Phase::None);
  CHECK_THROWS_AS(tp::parse_phase("Forward"), std::invalid_argument);
  for (int p = 0; p < tp::kNumPhases; ++p) {
    CHECK(tp::parse_phase(tp::phase_name(static_cast<tp::Phase>(p))) == static_cast<tp::Phase>(p));
  }
}

TEST_CASE("profile ranges: nothing recorded while off; name, phase and order while on") {
  std::thread([] {
    const uint64_t tid = my_tid();
    REQUIRE(tid != 0);
    const size_t before = my_events(tid).size();
    tp::set_enabled(false);
    for (int i = 0; i < 100; ++i) {
      TORCHSPEED_RANGE("test.off");
    }
    CHECK(my_events(tid).size() == before);
    tp::set_enabled(true);
    {
      TORCHSPEED_PHASE("test.outer", tp::Phase::Forward);
      TORCHSPEED_RANGE("test.inner");
    }
    tp::set_enabled(false);
    const auto ev = my_events(tid);
    REQUIRE(ev.size() == before + 2);
    const tp::Event& inner = ev[ev.size() - 2];  // the inner one ends first
    const tp::Event& outer = ev.back();
    CHECK(tp::name_of(inner.name) == "test.inner");
    CHECK(inner.phase == tp::Phase::None);
    CHECK(tp::name_of(outer.name) == "test.outer");
    CHECK(outer.phase == tp::Phase::Forward);
    CHECK(outer.begin <= inner.begin);
    CHECK(inner.begin <= inner.end);
    CHECK(inner.end <= outer.end);
  }).join();
}

TEST_CASE("profile ranges: no heap allocation once the thread's ring exists") {
  std::thread([] {
    tp::set_enabled(true);
    const auto hot = [] { TORCHSPEED_RANGE("test.hot"); };
    hot();  // creates the ring and interns the site's name
    const tp::NameId id = tp::intern("test.hot.begin_end");
    tp::begin(id);  // the open-range stack reserves once, on its first use
    tp::end();
    const long before = t_allocs;
    for (int i = 0; i < 10000; ++i) hot();
    for (int i = 0; i < 10000; ++i) {
      tp::begin(id, tp::Phase::Backward);
      tp::end();
    }
    const long after = t_allocs;  // read before CHECK, which allocates for its message
    tp::set_enabled(false);
    CHECK(after == before);
  }).join();
}

TEST_CASE("profile begin/end: a per-thread stack; end() without begin() is refused") {
  std::thread([] {
    const uint64_t tid = my_tid();
    tp::set_enabled(true);
    CHECK_FALSE(tp::end());
    const tp::NameId a = tp::intern("test.a"), b = tp::intern("test.b");
    const size_t before = my_events(tid).size();
    tp::begin(a, tp::Phase::DataWait);
    tp::begin(b, tp::Phase::H2D);
    CHECK(tp::end());
    CHECK(tp::end());
    CHECK_FALSE(tp::end());
    // end(name): the newest open range with that name, even under a newer one (async code).
    const size_t mid = my_events(tid).size();
    tp::begin(a);
    tp::begin(b);
    CHECK(tp::end(a));        // a closes; b stays open
    CHECK_FALSE(tp::end(a));  // no a left
    CHECK(tp::end(b));
    CHECK_FALSE(tp::end());
    const auto ev2 = my_events(tid);
    REQUIRE(ev2.size() == mid + 2);
    CHECK(ev2[mid].name == a);
    CHECK(ev2[mid + 1].name == b);
    CHECK(ev2[mid].begin <= ev2[mid + 1].begin);
    CHECK(ev2[mid].end <= ev2[mid + 1].end);
    // Opened while off: closed without recording, even if profiling was turned on in between.
    tp::set_enabled(false);
    tp::begin(a);
    tp::set_enabled(true);
    CHECK(tp::end());
    tp::set_enabled(false);
    const auto ev = my_events(tid);
    REQUIRE(ev.size() == before + 4);
    CHECK(ev[before].name == b);
    CHECK(ev[before].phase == tp::Phase::H2D);
    CHECK(ev[before + 1].name == a);
    CHECK(ev[before + 1].phase == tp::Phase::DataWait);
    // Past 1024 open ranges the extra ones are matched without recording (no unbounded stack).
    tp::set_enabled(true);
    for (int i = 0; i < 1500; ++i) tp::begin(a);
    for (int i = 0; i < 1500; ++i) REQUIRE(tp::end());
    CHECK_FALSE(tp::end());
    tp::set_enabled(false);
    CHECK(my_events(tid).size() == before + 4 + 1024);
    CHECK(tp::dropped_events() >= 1500 - 1024);  // the ones past the cap are counted
  }).join();
}

TEST_CASE("profile ring: wraps at its capacity, keeps the newest, counts the overwritten") {
  const size_t old_cap = tp::ring_capacity();
  CHECK_THROWS_AS(tp::set_ring_capacity(10), std::invalid_argument);
  CHECK_THROWS_AS(tp::set_ring_capacity(size_t{1} << 30), std::invalid_argument);
  tp::set_ring_capacity(1000 + 24);
  CHECK(tp::ring_capacity() == 1024);
  tp::set_ring_capacity(1025);  // rounded up to a power of two
  CHECK(tp::ring_capacity() == 2048);
  tp::set_ring_capacity(1024);
  std::thread([] {
    const uint64_t tid = my_tid();  // creates this thread's ring (1024) and reads it once
    const tp::NameId id = tp::intern("test.wrap");
    const uint64_t dropped0 = tp::dropped_events();
    for (uint64_t i = 0; i < 3000; ++i) tp::detail::record(10 + i, 11 + i, id, tp::Phase::Comm);
    // 3000 written, 1024 still there, 1976 overwritten before anyone read them.
    CHECK(tp::dropped_events() - dropped0 == 3000 - 1024);
    const auto ev = my_events(tid);
    REQUIRE(ev.size() == 1024);
    for (size_t k = 0; k < ev.size(); ++k) {
      REQUIRE(ev[k].begin == 10 + (3000 - 1024) + k);
      REQUIRE(ev[k].end == ev[k].begin + 1);
    }
    // Reading does not count them twice.
    CHECK(tp::dropped_events() - dropped0 == 3000 - 1024);
  }).join();
  tp::set_ring_capacity(old_cap);
}

TEST_CASE("profile ring: a concurrent reader never sees a torn event") {
  tp::set_ring_capacity(1024);  // small, so the writer laps the reader often
  std::atomic<bool> stop{false};
  std::atomic<uint64_t> writer_tid{0};
  const tp::NameId id = tp::intern("test.race");
  std::thread writer([&] {
    writer_tid = my_tid();
    uint64_t i = 0;
    while (!stop.load(std::memory_order_relaxed)) {
      // end - begin and the name encode the begin: a torn copy breaks the relation.
      tp::detail::record(1000 + i, 1000 + 2 * i, id, static_cast<tp::Phase>(i % 7));
      ++i;
    }
  });
  while (writer_tid.load() == 0) std::this_thread::yield();
  long checked = 0;
  // 300 reads at least, and on until one saw the writer's events (its first may come late on a
  // loaded machine or under the sanitizers), with a deadline so a broken ring fails, not hangs.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  for (int round = 0; round < 300 || (checked == 0 && std::chrono::steady_clock::now() < deadline);
       ++round) {
    for (const tp::ThreadEvents& te : tp::snapshot()) {
      if (te.os_tid != writer_tid.load()) continue;
      for (const tp::Event& e : te.events) {
        if (e.name != id) continue;
        const uint64_t i = e.begin - 1000;
        REQUIRE(e.end == 1000 + 2 * i);
        REQUIRE(e.phase == static_cast<tp::Phase>(i % 7));
        ++checked;
      }
    }
  }
  stop = true;
  writer.join();
  CHECK(checked > 0);
  tp::set_ring_capacity(65536);
}

TEST_CASE("profile breakdown: innermost phase wins, the rest is other, phases sum to the step") {
  const double npt = tp::ns_per_tick();
  const auto ns = [&](uint64_t ticks) {
    return static_cast<int64_t>(static_cast<double>(ticks) * npt);
  };
  const auto P = [](tp::Phase p) { return static_cast<int>(p); };
  const tp::NameId n = tp::intern("test.bd");
  const uint64_t B = 1'000'000, E = B + 100'000;
  SECTION("no events: all other") {
    const tp::StepRecord r = tp::breakdown({}, B, E);
    CHECK(r.phase_ns[P(tp::Phase::Other)] == r.end_ns - r.begin_ns);
  }
  SECTION("nested, unsorted, clipped, plain ranges transparent") {
    std::vector<tp::Event> ev = {
        {B + 20'000, B + 60'000, n, tp::Phase::Forward},
        {B + 30'000, B + 40'000, n, tp::Phase::H2D},        // inside forward: counts as h2d
        {B + 25'000, B + 35'000, n, tp::Phase::None},       // plain: time stays with its phase
        {B - 50'000, B + 10'000, n, tp::Phase::DataWait},   // sticks out before the step
        {B + 90'000, E + 50'000, n, tp::Phase::Optimizer},  // sticks out after it
        {B + 70'000, B + 70'000, n, tp::Phase::Backward},   // empty
    };
    const tp::StepRecord r = tp::breakdown(ev, B, E);
    int64_t sum = 0;
    for (int p = 0; p < tp::kNumPhases; ++p) sum += r.phase_ns[p];
    CHECK(sum == r.end_ns - r.begin_ns);
    CHECK(std::abs(r.phase_ns[P(tp::Phase::DataWait)] - ns(10'000)) <= 1);
    CHECK(std::abs(r.phase_ns[P(tp::Phase::Forward)] - ns(30'000)) <= 1);
    CHECK(std::abs(r.phase_ns[P(tp::Phase::H2D)] - ns(10'000)) <= 1);
    CHECK(std::abs(r.phase_ns[P(tp::Phase::Optimizer)] - ns(10'000)) <= 1);
    CHECK(r.phase_ns[P(tp::Phase::Backward)] == 0);
    CHECK(std::abs(r.phase_ns[P(tp::Phase::Other)] - ns(40'000)) <= 8);
  }
  SECTION("improper nesting: the later-begun range owns the overlap") {
    std::vector<tp::Event> ev = {{B + 10'000, B + 50'000, n, tp::Phase::Forward},
                                 {B + 40'000, B + 80'000, n, tp::Phase::Backward}};
    const tp::StepRecord r = tp::breakdown(ev, B, E);
    CHECK(std::abs(r.phase_ns[P(tp::Phase::Forward)] - ns(30'000)) <= 1);
    CHECK(std::abs(r.phase_ns[P(tp::Phase::Backward)] - ns(40'000)) <= 1);
  }
  SECTION("an empty or reversed span") {
    const tp::StepRecord r = tp::breakdown({{B, E, n, tp::Phase::Forward}}, E, B);
    CHECK(r.end_ns == r.begin_ns);
    for (int p = 0; p < tp::kNumPhases; ++p) CHECK(r.phase_ns[p] == 0);
  }
}

TEST_CASE("profile StepProfiler: real phases measured, bounded history") {
  std::thread([] {
    tp::set_enabled(true);
    tp::StepProfiler prof(4);
    CHECK_THROWS_AS(tp::StepProfiler(0), std::invalid_argument);
    prof.start();
    for (int s = 0; s < 10; ++s) {
      const int64_t t0 = tp::now_ns();
      {
        TORCHSPEED_PHASE("test.fwd", tp::Phase::Forward);
        std::this_thread::sleep_for(std::chrono::milliseconds(3));
      }
      const int64_t fwd = tp::now_ns() - t0;
      const tp::StepRecord r = prof.step(32);
      int64_t sum = 0;
      for (int p = 0; p < tp::kNumPhases; ++p) sum += r.phase_ns[p];
      CHECK(sum == r.end_ns - r.begin_ns);
      // The measured forward matches a direct measurement within 0.2 ms (step() itself and the
      // range's own clock reads are the difference).
      CHECK(std::abs(r.phase_ns[static_cast<int>(tp::Phase::Forward)] - fwd) < 200'000);
      CHECK(r.samples == 32);
    }
    tp::set_enabled(false);
    CHECK(prof.steps() == 10);
    CHECK(prof.steps_dropped() == 6);
    const auto h = prof.history();
    REQUIRE(h.size() == 4);
    for (size_t i = 1; i < h.size(); ++i) CHECK(h[i].begin_ns == h[i - 1].end_ns);  // oldest first
    const std::string table = prof.summary_table();
    CHECK(table.find("forward") != std::string::npos);
    CHECK(table.find("4 steps") != std::string::npos);
  }).join();
}

TEST_CASE("profile trace: a Chrome trace file with escaped names and the steps track") {
  std::thread([] {
    tp::set_enabled(true);
    tp::StepProfiler prof;
    prof.start();
    { TORCHSPEED_PHASE("test \"quoted\"\n\x01 \xff name", tp::Phase::Backward); }
    prof.step();
    tp::set_enabled(false);
    const std::string path = "test_profile_trace.json";
    tp::write_chrome_trace(path, &prof);
    std::ifstream f(path);
    std::stringstream ss;
    ss << f.rdbuf();
    const std::string text = ss.str();
    std::remove(path.c_str());
    CHECK(text.rfind("{\"displayTimeUnit\":\"ns\",\"traceEvents\":[", 0) == 0);
    CHECK(text.find("test \\\"quoted\\\"\\u000a\\u0001 \\\\xff name") != std::string::npos);
    CHECK(text.find("\"cat\":\"backward\"") != std::string::npos);
    CHECK(text.find("\"name\":\"step 0\",\"cat\":\"step\"") != std::string::npos);
    CHECK(text.find("\"dropped_events\":") != std::string::npos);
    CHECK_THROWS_AS(tp::write_chrome_trace("/nonexistent-dir/x/trace.json"), std::runtime_error);
  }).join();
}

TEST_CASE("profile nvtx: refused in a build without CUDA") {
  if (tp::nvtx_available()) {
    tp::set_nvtx(true);
    tp::set_nvtx(false);
  } else {
    CHECK_THROWS_AS(tp::set_nvtx(true), std::runtime_error);
    tp::set_nvtx(false);
  }
}
