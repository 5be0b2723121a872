// The one clock of the library: monotonic, nanosecond resolution. Stage timings (the loader's
// stats, decode times, the optimizers' step seconds) are all measured with it, so they add up.
#pragma once

#include <chrono>

namespace torchspeed {

using Clock = std::chrono::steady_clock;

/// Seconds from `t0` to now.
inline double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

}  // namespace torchspeed
