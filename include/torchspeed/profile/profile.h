// torchspeed's profiler core: one nanosecond clock, nanosecond ranges recorded into per-thread
// rings, and the step profiler's per-step phase breakdown. Torch-free; usable from any C++ code.
//
//   #include <torchspeed/profile/profile.h>
//   namespace tp = torchspeed::profile;
//   tp::set_enabled(true);
//   tp::StepProfiler prof;
//   for (...) {
//     { TORCHSPEED_PHASE("load", tp::Phase::DataWait); batch = loader.next(); }
//     { TORCHSPEED_PHASE("forward", tp::Phase::Forward); loss = model(batch); }
//     { TORCHSPEED_RANGE("my_helper"); helper(); }   // in the trace; its time stays in its phase
//     prof.step();
//   }
//   std::cout << prof.summary_table();
//   tp::write_chrome_trace("trace.json");              // opens in Perfetto / chrome://tracing
//
// Cost: a range costs one relaxed load and a predictable branch when profiling is off, and two
// clock reads plus a 24-byte store into the calling thread's ring when it is on (bench/RESULTS.md).
// Memory is fixed: each thread's ring holds the newest ring_capacity() events and counts what it
// overwrote before anyone read it (dropped_events()).
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "torchspeed/export.h"

#if defined(__x86_64__) || defined(_M_X64)
#include <x86intrin.h>
#endif

namespace torchspeed::profile {

// ---- phases of a training step ------------------------------------------------------------------

/// What a range's time counts as in the step breakdown. The phases of a step sum to its time:
/// time no phase range covers is Other. Nested phase ranges: the innermost one wins (a copy
/// inside the forward counts as H2D, not Forward). None: a plain range (trace only; its time
/// counts for the phase around it).
enum class Phase : uint8_t {
  DataWait = 0,
  H2D = 1,
  Forward = 2,
  Backward = 3,
  Optimizer = 4,
  Comm = 5,
  Other = 6,
  None = 255,
};
constexpr int kNumPhases = 7;

/// "data_wait", "h2d", "forward", "backward", "optimizer", "comm", "other" ("none" for None).
TORCHSPEED_API const char* phase_name(Phase phase);
/// The phase with that name (the names above); throws std::invalid_argument naming the choices.
TORCHSPEED_API Phase parse_phase(std::string_view name);

// ---- the clock ----------------------------------------------------------------------------------

/// Raw clock ticks: the CPU's time-stamp counter where it is invariant and the kernel's clock
/// source is the TSC, else steady_clock nanoseconds. Only differences and ticks_to_ns() mean
/// anything.
inline uint64_t ticks() noexcept;
/// Nanoseconds on steady_clock's time line (CLOCK_MONOTONIC) for a ticks() value. The TSC rate is
/// calibrated once against steady_clock (2 ms, when the library loads).
TORCHSPEED_API int64_t ticks_to_ns(uint64_t t) noexcept;
/// ticks_to_ns(ticks()): the one clock every torchspeed timer reads.
TORCHSPEED_API int64_t now_ns() noexcept;
/// Nanoseconds per tick (1.0 for steady_clock).
TORCHSPEED_API double ns_per_tick() noexcept;
/// "tsc" or "steady_clock" (TORCHSPEED_PROFILE_CLOCK=steady forces the latter).
TORCHSPEED_API const char* clock_source() noexcept;

// ---- recording ----------------------------------------------------------------------------------

/// An interned range name: record the id, build the string at export.
using NameId = uint32_t;
/// The id of `name`, the same for the same text from every thread. Thread-safe; takes a lock, so
/// call it once per site (the macros keep it in a function-local static).
TORCHSPEED_API NameId intern(std::string_view name);
/// The text of an id from intern(); throws std::out_of_range for an unknown id.
TORCHSPEED_API std::string name_of(NameId id);

namespace detail {
TORCHSPEED_API extern std::atomic<bool> g_enabled;
TORCHSPEED_API extern bool g_tsc;
TORCHSPEED_API extern bool g_nvtx;
/// Appends one finished range to the calling thread's ring (allocated on its first event).
TORCHSPEED_API void record(uint64_t begin, uint64_t end, NameId name, Phase phase) noexcept;
TORCHSPEED_API void nvtx_push(NameId name) noexcept;
TORCHSPEED_API void nvtx_pop() noexcept;
}  // namespace detail

/// Whether ranges record. Off by default; TORCHSPEED_PROFILE=1 turns it on at load.
inline bool enabled() noexcept { return detail::g_enabled.load(std::memory_order_relaxed); }
TORCHSPEED_API void set_enabled(bool on) noexcept;

/// Mirrors every recorded range into NVTX (a registered string per name, domain "torchspeed"), for
/// Nsight Systems. CUDA builds only: set_nvtx(true) throws std::runtime_error in a CPU build.
TORCHSPEED_API void set_nvtx(bool on);
TORCHSPEED_API bool nvtx_available() noexcept;

/// Times a scope. Profiling off: one relaxed load and a branch. On: two ticks() and one record().
class Range {
 public:
  explicit Range(NameId name, Phase phase = Phase::None) noexcept : name_(name), phase_(phase) {
    if (enabled()) {
      active_ = true;
      if (detail::g_nvtx) detail::nvtx_push(name_);
      begin_ = ticks();
    }
  }
  ~Range() {
    if (active_) {
      detail::record(begin_, ticks(), name_, phase_);
      if (detail::g_nvtx) detail::nvtx_pop();
    }
  }
  Range(const Range&) = delete;
  Range& operator=(const Range&) = delete;

 private:
  uint64_t begin_ = 0;
  NameId name_;
  Phase phase_;
  bool active_ = false;
};

/// Ranges whose begin and end are separate calls (Python's `with`, hooks): a per-thread stack.
/// end() closes the newest open one; end(name) the newest open one with that name, even if newer
/// ones are open (interleaved async code), which stay open. Both return false (and record
/// nothing) when there is none. Past 1024 open ranges a begin() is not kept and counts as dropped.
TORCHSPEED_API void begin(NameId name, Phase phase = Phase::None) noexcept;
TORCHSPEED_API bool end() noexcept;
TORCHSPEED_API bool end(NameId name) noexcept;

#define TORCHSPEED_PROFILE_CAT2(a, b) a##b
#define TORCHSPEED_PROFILE_CAT(a, b) TORCHSPEED_PROFILE_CAT2(a, b)
/// Times the rest of the enclosing scope as range `name` (a string literal or constant).
#define TORCHSPEED_RANGE(name) TORCHSPEED_PHASE(name, ::torchspeed::profile::Phase::None)
/// Times the rest of the enclosing scope as range `name` counted as `phase` in the step breakdown.
#define TORCHSPEED_PHASE(name, phase)                                                           \
  static const ::torchspeed::profile::NameId TORCHSPEED_PROFILE_CAT(ts_profile_id_, __LINE__) = \
      ::torchspeed::profile::intern(name);                                                      \
  ::torchspeed::profile::Range TORCHSPEED_PROFILE_CAT(ts_profile_range_, __LINE__)(             \
      TORCHSPEED_PROFILE_CAT(ts_profile_id_, __LINE__), phase)

// ---- reading the rings --------------------------------------------------------------------------

/// One recorded range, in ticks (ticks_to_ns converts).
struct Event {
  uint64_t begin = 0;
  uint64_t end = 0;
  NameId name = 0;
  Phase phase = Phase::None;
};

/// Events per thread ring (a power of two; default 65536 = 1.5 MiB per recording thread).
TORCHSPEED_API size_t ring_capacity() noexcept;
/// Sets the capacity of rings created from now on (rounded up to a power of two, 1024 .. 2^24);
/// throws std::invalid_argument outside that range. TORCHSPEED_PROFILE_RING=N sets it at load.
TORCHSPEED_API void set_ring_capacity(size_t events);

/// Events overwritten before they were read (by a snapshot, a step() or an export), summed over
/// all rings, plus the rings of exited threads that were let go (at most 64 are kept).
TORCHSPEED_API uint64_t dropped_events() noexcept;

/// What one thread's ring holds now.
struct ThreadEvents {
  uint64_t os_tid = 0;
  std::string thread_name;
  std::vector<Event> events;  // oldest first; only whole events (a torn one is counted dropped)
};
/// A consistent copy of every ring (threads still running keep recording meanwhile).
TORCHSPEED_API std::vector<ThreadEvents> snapshot();
/// Forgets every recorded event and the dropped count (rings stay allocated).
TORCHSPEED_API void clear() noexcept;

// ---- the step breakdown -------------------------------------------------------------------------

/// One training step: its span and the nanoseconds of each phase (indexed by Phase; they sum to
/// end_ns - begin_ns).
struct StepRecord {
  int64_t begin_ns = 0;
  int64_t end_ns = 0;
  int64_t phase_ns[kNumPhases] = {};
  int64_t samples = 0;  // batch size when known, else 0
};

/// The breakdown of [begin, end) (ticks) from one thread's events: each instant goes to the
/// innermost phase range covering it, the rest to Other. Events need not be sorted; ranges that
/// stick out of the span are clipped; improperly nested ones are handled (the later-begun wins).
TORCHSPEED_API StepRecord breakdown(const std::vector<Event>& events, uint64_t begin, uint64_t end);

/// The always-on step profiler: call step() at the end of every training step, on the thread that
/// runs it. Each step() takes that thread's new events, breaks the step down and keeps the record
/// in a bounded history (the newest `history_steps`).
class TORCHSPEED_API StepProfiler {
 public:
  explicit StepProfiler(size_t history_steps = 16384);
  /// Ends the current step (the first step() only starts one, unless start() was called) and
  /// returns its record. `samples` is the step's batch size (0 = unknown).
  StepRecord step(int64_t samples = 0);
  /// Starts timing a step now without recording one (step() then ends it).
  void start();
  /// Adds a record measured elsewhere (the Python profiler's CUDA-event timeline).
  void add(const StepRecord& record);

  size_t steps() const noexcept { return steps_; }  // recorded since construction
  size_t steps_dropped() const noexcept;            // older than the history keeps
  std::vector<StepRecord> history() const;          // oldest first
  /// The end-of-run table: median and p90 per phase and its share of all step time.
  std::string summary_table() const;

 private:
  std::vector<StepRecord> ring_;
  size_t capacity_;
  size_t steps_ = 0;
  bool started_ = false;
  uint64_t step_begin_ = 0;
  const void* ring_owner_ = nullptr;  // the ring step() last read (its thread's)
  uint64_t cursor_ = 0;               // that ring's events already taken
  std::vector<Event> events_;         // reused by every step(): no allocation per step
};

/// Writes every ring (and the steps of `profiler`, if given) as Chrome trace event JSON: "X"
/// events in microseconds (ns precision), thread names as "M" events, the dropped count under
/// "otherData". Perfetto and chrome://tracing open it. Throws std::runtime_error if `path` cannot
/// be written.
/// `thread_names` (os tid -> name) overrides the names the OS gave the threads (Python threads
/// are all "python" to the OS).
TORCHSPEED_API void write_chrome_trace(
    const std::string& path, const StepProfiler* profiler = nullptr,
    const std::vector<std::pair<uint64_t, std::string>>& thread_names = {});

// ---- inline clock -------------------------------------------------------------------------------

TORCHSPEED_API uint64_t steady_ticks() noexcept;

inline uint64_t ticks() noexcept {
#if defined(__x86_64__) || defined(_M_X64)
  if (detail::g_tsc) return __rdtsc();
#endif
  return steady_ticks();
}

}  // namespace torchspeed::profile
