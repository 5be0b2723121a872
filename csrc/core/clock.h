// The one clock of the library: torchspeed::profile's (the TSC calibrated against steady_clock,
// or steady_clock itself), as a std::chrono clock. Stage timings (the loader's stats, decode
// times, the optimizers' step seconds) and the profiler's ranges all read it, so they add up.
// Waits with a deadline keep using std::chrono::steady_clock: they are not measurements.
#pragma once

#include <chrono>
#include <cstdint>

#include "torchspeed/profile/profile.h"

namespace torchspeed {

struct Clock {
  using rep = int64_t;
  using period = std::nano;
  using duration = std::chrono::nanoseconds;
  using time_point = std::chrono::time_point<Clock>;
  static constexpr bool is_steady = true;
  static time_point now() noexcept { return time_point(duration(profile::now_ns())); }
};

/// Seconds from `t0` to now.
inline double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

}  // namespace torchspeed
