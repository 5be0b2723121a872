// Counter-based per-sample random numbers: streams keyed by (seed, epoch, sample index, purpose).
#pragma once

#include <cstdint>

namespace torchspeed::data {

inline uint64_t splitmix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

// Purposes keep independent draws independent (the crop's retry count never shifts the flip draw).
enum class RngPurpose : uint64_t { kCrop = 1, kFlip = 2, kShuffle = 3 };

// A small generator whose whole state comes from hashing the key; the same key gives the same
// numbers on any thread, in any order, for any worker count.
class SampleRng {
 public:
  SampleRng(uint64_t seed, uint64_t epoch, uint64_t index, RngPurpose purpose)
      : state_(splitmix64(splitmix64(splitmix64(splitmix64(seed) ^ epoch) ^ index) ^
                          static_cast<uint64_t>(purpose))) {}

  uint64_t next_u64() {
    state_ += 0x9E3779B97F4A7C15ull;
    uint64_t z = state_;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  // Uniform in [0, 1) with 53 random bits.
  double uniform() { return static_cast<double>(next_u64() >> 11) * (1.0 / 9007199254740992.0); }
  double uniform(double lo, double hi) { return lo + (hi - lo) * uniform(); }
  // Uniform integer in [0, n) for n > 0 (multiply-high reduction).
  uint64_t below(uint64_t n) {
    return static_cast<uint64_t>((static_cast<unsigned __int128>(next_u64()) * n) >> 64);
  }

 private:
  uint64_t state_;
};

}  // namespace torchspeed::data
