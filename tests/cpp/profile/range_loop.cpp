// `profile_range_loop N on|off`: N ranges in a loop, for counting instructions per range with
// callgrind (tests/cpp/profile/callgrind_ranges.sh runs it twice and divides the difference).
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "torchspeed/profile/profile.h"

int main(int argc, char** argv) {
  if (argc != 3) {
    std::fprintf(stderr, "usage: profile_range_loop N on|off\n");
    return 2;
  }
  const long n = std::strtol(argv[1], nullptr, 10);
  torchspeed::profile::set_enabled(std::strcmp(argv[2], "on") == 0);
  { TORCHSPEED_RANGE("warm"); }  // the ring and the name exist before the counted loop
  for (long i = 0; i < n; ++i) {
    TORCHSPEED_RANGE("loop");
  }
  return 0;
}
