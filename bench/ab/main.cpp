// The resampler A/B: the same inputs through the old and the new build, interleaved in one
// process, so machine noise hits both alike. Prints one line per case: the minimum and the median
// ns per call of each side, the new/old ratios, and whether the output bytes are identical.
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iterator>
#include <random>
#include <vector>

extern "C" {
void ab_old_resample(const uint8_t*, int, int, int, int, uint8_t*);
void ab_new_resample(const uint8_t*, int, int, int, int, uint8_t*);
void ab_old_process(const uint8_t*, size_t, int, uint64_t, uint8_t*);
void ab_new_process(const uint8_t*, size_t, int, uint64_t, uint8_t*);
}

using Clock = std::chrono::steady_clock;

struct Times {
  double old_min = 1e300, new_min = 1e300;
  std::vector<double> old_all, new_all;
};

double ns_of(Clock::time_point t0) {
  return std::chrono::duration<double, std::nano>(Clock::now() - t0).count();
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// Old and new alternate call by call (which goes first alternates too), so interference from
// other tenants lands on both; the minimum is each side's undisturbed cost.
template <class Old, class New>
Times ab(Old&& old_call, New&& new_call, int pairs) {
  Times t;
  for (int r = 0; r < pairs; ++r) {
    for (int side = 0; side < 2; ++side) {
      const bool old_side = (side == 0) == (r % 2 == 0);
      const auto t0 = Clock::now();
      if (old_side) {
        old_call();
      } else {
        new_call();
      }
      const double ns = ns_of(t0);
      (old_side ? t.old_all : t.new_all).push_back(ns);
    }
  }
  t.old_min = *std::min_element(t.old_all.begin(), t.old_all.end());
  t.new_min = *std::min_element(t.new_all.begin(), t.new_all.end());
  return t;
}

void report(const char* name, const Times& t, bool same) {
  std::printf("%-34s %10.0f %10.0f %7.3f %10.0f %10.0f %7.3f %s\n", name, t.old_min, t.new_min,
              t.new_min / t.old_min, median(t.old_all), median(t.new_all),
              median(t.new_all) / median(t.old_all), same ? "same" : "DIFFER");
}

int main(int argc, char** argv) {
  std::mt19937 gen(7);
  std::printf("%-34s %10s %10s %7s %10s %10s %7s %s\n", "case", "old min", "new min", "ratio",
              "old med", "new med", "ratio", "bytes");
  const int sizes[][4] = {{500, 375, 224, 224}, {500, 375, 112, 112}, {1024, 768, 224, 224},
                          {224, 224, 448, 448}};
  for (const auto& s : sizes) {
    std::vector<uint8_t> src(static_cast<size_t>(s[0]) * s[1] * 3);
    for (auto& v : src) v = static_cast<uint8_t>(gen());
    std::vector<uint8_t> a(static_cast<size_t>(s[2]) * s[3] * 3), b(a.size());
    const Times t = ab([&] { ab_old_resample(src.data(), s[0], s[1], s[2], s[3], a.data()); },
                       [&] { ab_new_resample(src.data(), s[0], s[1], s[2], s[3], b.data()); }, 301);
    char name[64];
    std::snprintf(name, sizeof name, "resample %dx%d -> %dx%d", s[0], s[1], s[2], s[3]);
    report(name, t, a == b);
  }
  for (int i = 1; i < argc; ++i) {  // JPEG files: the whole per-image pipeline
    std::ifstream f(argv[i], std::ios::binary);
    std::vector<uint8_t> jpg((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
    for (int side : {224, 112}) {
      std::vector<uint8_t> a(static_cast<size_t>(side) * side * 3), b(a.size());
      uint64_t k = 0, m = 0;
      bool same = true;
      const Times t = ab([&] { ab_old_process(jpg.data(), jpg.size(), side, k++, a.data()); },
                         [&] {
                           ab_new_process(jpg.data(), jpg.size(), side, m++, b.data());
                           same = same && (k != m || a == b);
                         },
                         151);
      char name[96];
      const char* base = std::strrchr(argv[i], '/');
      std::snprintf(name, sizeof name, "process_image %s %d", base ? base + 1 : argv[i], side);
      report(name, t, same);
    }
  }
  return 0;
}
