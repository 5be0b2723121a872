// libFuzzer target: tar member listing and WebDataset grouping on arbitrary bytes, in memory and
// through a reader (the pread path), which must agree.
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <string>

#include "data/tar_reader.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace torchspeed::data;
  try {
    const auto members = list_tar_members(data, size, "fuzz.tar");
    for (const auto& m : members) {
      if (m.offset > size || m.size > size - m.offset) __builtin_trap();  // must lie inside
      if (m.offset < 512) __builtin_trap();                               // header precedes data
    }
  } catch (const std::runtime_error&) {
  }
  // Both paths must give the same index, or fail with the same message.
  std::string mem, via_reader;
  try {
    mem = ShardIndex::build(data, size, "fuzz.tar").serialize();
  } catch (const std::runtime_error& e) {
    mem = std::string("error: ") + e.what();
  }
  const ReadAt read = [data, size](uint64_t offset, size_t n, uint8_t* out) {
    if (offset > size || n > size - offset) __builtin_trap();  // reads stay inside
    if (n > 0) std::memcpy(out, data + offset, n);
  };
  try {
    via_reader = ShardIndex::build(size, read, "fuzz.tar").serialize();
  } catch (const std::runtime_error& e) {
    via_reader = std::string("error: ") + e.what();
  }
  if (mem != via_reader) __builtin_trap();
  return 0;
}
