// Torch-free .npy header parsing (format versions 1-3) for .npy files and tar fields.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "torchspeed/export.h"

namespace torchspeed::data {

enum class NpyType {
  kBool,
  kUInt8,
  kInt8,
  kInt16,
  kInt32,
  kInt64,
  kUInt16,
  kFloat16,
  kFloat32,
  kFloat64
};

struct NpyArray {
  NpyType type = NpyType::kUInt8;
  size_t itemsize = 1;
  std::vector<int64_t> shape;
  size_t data_offset = 0;  // from the start of the buffer
  size_t data_bytes = 0;   // itemsize * prod(shape)
  int64_t numel() const {
    int64_t n = 1;
    for (auto d : shape) n *= d;
    return n;
  }
};

// Parses and validates a .npy buffer: magic, header dict ('descr', 'fortran_order', 'shape'),
// little-endian or byte-sized dtypes only, C order only, and data that fits in `size`.
// Throws std::invalid_argument naming `where` otherwise.
TORCHSPEED_API NpyArray parse_npy(const uint8_t* data, size_t size, const std::string& where);
// The same from the first `available` bytes of a file of `file_size` bytes (the header must lie in
// them; the data is checked against `file_size`), so a file can be read in pieces, not mapped.
TORCHSPEED_API NpyArray parse_npy_header(const uint8_t* data, size_t available, uint64_t file_size,
                                         const std::string& where);

TORCHSPEED_API const char* npy_type_name(NpyType t);

}  // namespace torchspeed::data
