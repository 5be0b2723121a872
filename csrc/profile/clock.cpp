// The profiler's clock: the TSC where it is trustworthy (invariant, and the kernel's own clock
// source), calibrated once against steady_clock; steady_clock everywhere else.
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <mutex>
#include <string>

#include "torchspeed/profile/profile.h"

#if defined(__x86_64__) || defined(_M_X64)
#include <cpuid.h>
#endif

namespace torchspeed::profile {
namespace {

uint64_t steady_now_ns() noexcept {
  return static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(
                                   std::chrono::steady_clock::now().time_since_epoch())
                                   .count());
}

// The TSC is used only when the CPU says it runs at a constant rate in every power state
// (CPUID 0x80000007 EDX bit 8) and Linux trusts it as its clock source, which means the kernel
// found it synchronized across CPUs. A VM or CPU where Linux fell back to hpet/kvm-clock for
// cause gets steady_clock: correct first, fast second.
bool tsc_usable() {
#if defined(__x86_64__) || defined(_M_X64)
  if (const char* env = std::getenv("TORCHSPEED_PROFILE_CLOCK")) {
    if (std::strcmp(env, "steady") == 0) return false;
  }
  unsigned a = 0, b = 0, c = 0, d = 0;
  if (!__get_cpuid(0x80000000u, &a, &b, &c, &d) || a < 0x80000007u) return false;
  __get_cpuid(0x80000007u, &a, &b, &c, &d);
  if (!(d & (1u << 8))) return false;
  std::ifstream f("/sys/devices/system/clocksource/clocksource0/current_clocksource");
  std::string source;
  return static_cast<bool>(f >> source) && source == "tsc";
#else
  return false;
#endif
}

struct Calibration {
  uint64_t tick0 = 0;
  int64_t ns0 = 0;
  double ns_per_tick = 1.0;
};

// One pair of (tsc, steady) read as close together as possible: the tsc read is bracketed by two
// steady reads and the pair with the tightest bracket of a few tries is kept.
void paired_read(uint64_t* tick, int64_t* ns) {
  uint64_t best_width = ~0ull;
  for (int i = 0; i < 5; ++i) {
    const uint64_t a = steady_now_ns();
    const uint64_t t = ticks();
    const uint64_t b = steady_now_ns();
    if (b - a < best_width) {
      best_width = b - a;
      *tick = t;
      *ns = static_cast<int64_t>(a + (b - a) / 2);
    }
  }
}

const Calibration& calibration() {
  static const Calibration cal = [] {
    Calibration c;
    if (!detail::g_tsc) return c;  // ticks are steady_clock ns already
    paired_read(&c.tick0, &c.ns0);
    // 2 ms against a ~30 ns read jitter: 15 ppm, i.e. 0.15 us over a 10 ms phase.
    uint64_t t1 = 0;
    int64_t n1 = 0;
    do {
      paired_read(&t1, &n1);
    } while (n1 - c.ns0 < 2'000'000);
    c.ns_per_tick = static_cast<double>(n1 - c.ns0) / static_cast<double>(t1 - c.tick0);
    return c;
  }();
  return cal;
}

}  // namespace

namespace detail {
bool g_tsc = tsc_usable();
}  // namespace detail

namespace {
// Calibrated when the library loads (2 ms), not on the first conversion, which would put those
// 2 ms into whatever was being timed.
[[maybe_unused]] const bool g_calibrated = (calibration(), true);
}  // namespace

uint64_t steady_ticks() noexcept { return steady_now_ns(); }

int64_t ticks_to_ns(uint64_t t) noexcept {
  if (!detail::g_tsc) return static_cast<int64_t>(t);
  const Calibration& c = calibration();
  // Signed difference: a tick read on another CPU just before the calibration pair is fine.
  const auto dt = static_cast<int64_t>(t - c.tick0);
  return c.ns0 + static_cast<int64_t>(static_cast<double>(dt) * c.ns_per_tick);
}

int64_t now_ns() noexcept { return ticks_to_ns(ticks()); }

double ns_per_tick() noexcept { return detail::g_tsc ? calibration().ns_per_tick : 1.0; }

const char* clock_source() noexcept { return detail::g_tsc ? "tsc" : "steady_clock"; }

}  // namespace torchspeed::profile
