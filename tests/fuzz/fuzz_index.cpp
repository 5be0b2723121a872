// libFuzzer target: shard index deserialization; anything accepted must round-trip exactly.
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <string>

#include "data/tar_reader.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace torchspeed::data;
  try {
    const ShardIndex idx = ShardIndex::deserialize(data, size, "fuzz.idx");
    const std::string back = idx.serialize();
    if (back.size() != size || std::memcmp(back.data(), data, size) != 0) __builtin_trap();
  } catch (const std::runtime_error&) {
  }
  return 0;
}
