// libFuzzer target: tar member listing and WebDataset grouping on arbitrary bytes.
#include <cstddef>
#include <cstdint>
#include <stdexcept>

#include "tar_reader.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace torchspeed::data;
  try {
    const auto members = list_tar_members(data, size, "fuzz.tar");
    for (const auto& m : members) {
      if (m.offset > size || m.size > size - m.offset) __builtin_trap();  // must lie inside
    }
    const ShardIndex idx = ShardIndex::build(data, size, "fuzz.tar");
    volatile size_t n = idx.samples.size();
    (void)n;
  } catch (const std::runtime_error&) {
  }
  return 0;
}
