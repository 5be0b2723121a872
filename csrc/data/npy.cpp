// Torch-free .npy header parser; strict, bounds-checked and overflow-checked (fuzzed).
#include "data/npy.h"

#include <cstdint>
#include <cstring>
#include <stdexcept>

namespace torchspeed::data {
namespace {

[[noreturn]] void bad(const std::string& where, const std::string& what) {
  throw std::invalid_argument("torchspeed.data.npy: '" + where + "': " + what);
}

// Returns the text right after "'name':" (skipping spaces), or npos.
size_t find_value(const std::string& h, const std::string& name) {
  const std::string pat = "'" + name + "'";
  size_t p = h.find(pat);
  if (p == std::string::npos) return p;
  p += pat.size();
  while (p < h.size() && h[p] == ' ') ++p;
  if (p >= h.size() || h[p] != ':') return std::string::npos;
  ++p;
  while (p < h.size() && h[p] == ' ') ++p;
  return p;
}

}  // namespace

const char* npy_type_name(NpyType t) {
  switch (t) {
    case NpyType::kBool:
      return "bool";
    case NpyType::kUInt8:
      return "uint8";
    case NpyType::kInt8:
      return "int8";
    case NpyType::kInt16:
      return "int16";
    case NpyType::kInt32:
      return "int32";
    case NpyType::kInt64:
      return "int64";
    case NpyType::kUInt16:
      return "uint16";
    case NpyType::kFloat16:
      return "float16";
    case NpyType::kFloat32:
      return "float32";
    case NpyType::kFloat64:
      return "float64";
  }
  return "?";
}

NpyArray parse_npy(const uint8_t* data, size_t size, const std::string& where) {
  return parse_npy_header(data, size, size, where);
}

NpyArray parse_npy_header(const uint8_t* data, size_t available, uint64_t file_size,
                          const std::string& where) {
  static const uint8_t kMagic[6] = {0x93, 'N', 'U', 'M', 'P', 'Y'};
  if (available > file_size) bad(where, "more bytes available than the file has");
  const size_t size = available;
  if (size < 10 || std::memcmp(data, kMagic, 6) != 0) bad(where, "not a .npy file (bad magic)");
  const int major = data[6];
  size_t hlen = 0, hstart = 0;
  if (major == 1) {
    hlen = data[8] | (static_cast<size_t>(data[9]) << 8);
    hstart = 10;
  } else if (major == 2 || major == 3) {
    if (size < 12) bad(where, "truncated header");
    hlen = data[8] | (static_cast<size_t>(data[9]) << 8) | (static_cast<size_t>(data[10]) << 16) |
           (static_cast<size_t>(data[11]) << 24);
    hstart = 12;
  } else {
    bad(where, "unsupported format version " + std::to_string(major));
  }
  if (hlen > size - hstart) {
    if (available < file_size)
      bad(where, "header of " + std::to_string(hlen) + " bytes is too large");
    bad(where, "truncated header");
  }
  const std::string h(reinterpret_cast<const char*>(data + hstart), hlen);

  NpyArray a;
  size_t p = find_value(h, "descr");
  if (p == std::string::npos || p >= h.size() || h[p] != '\'') bad(where, "header has no 'descr'");
  const size_t end = h.find('\'', p + 1);
  if (end == std::string::npos) bad(where, "unterminated 'descr'");
  const std::string descr = h.substr(p + 1, end - p - 1);
  std::string d = descr;
  if (!d.empty() && (d[0] == '<' || d[0] == '|' || d[0] == '=')) {
    d = d.substr(1);
  } else if (!d.empty() && d[0] == '>') {
    if (d != ">u1" && d != ">i1" && d != ">b1") bad(where, "big-endian dtype '" + descr + "'");
    d = d.substr(1);
  }
  struct T {
    const char* s;
    NpyType t;
    size_t size;
  };
  static const T kTypes[] = {{"b1", NpyType::kBool, 1},    {"u1", NpyType::kUInt8, 1},
                             {"i1", NpyType::kInt8, 1},    {"i2", NpyType::kInt16, 2},
                             {"i4", NpyType::kInt32, 4},   {"i8", NpyType::kInt64, 8},
                             {"u2", NpyType::kUInt16, 2},  {"f2", NpyType::kFloat16, 2},
                             {"f4", NpyType::kFloat32, 4}, {"f8", NpyType::kFloat64, 8}};
  bool known = false;
  for (const auto& t : kTypes) {
    if (d == t.s) {
      a.type = t.t;
      a.itemsize = t.size;
      known = true;
    }
  }
  if (!known) bad(where, "unsupported dtype '" + descr + "'");

  p = find_value(h, "fortran_order");
  if (p == std::string::npos) bad(where, "header has no 'fortran_order'");
  if (h.compare(p, 4, "True") == 0) bad(where, "fortran_order arrays are not supported");
  if (h.compare(p, 5, "False") != 0) bad(where, "bad 'fortran_order'");

  p = find_value(h, "shape");
  if (p == std::string::npos || p >= h.size() || h[p] != '(') bad(where, "header has no 'shape'");
  const size_t close = h.find(')', p);
  if (close == std::string::npos) bad(where, "unterminated 'shape'");
  size_t i = p + 1;
  // Bytes of the non-zero dimensions. A zero anywhere makes the array empty, so the other
  // dimensions may then need more bytes than the file has (numpy writes (100, 0) as a header only);
  // they are still kept below 2^63 so that no product of the shape overflows.
  unsigned __int128 bytes = a.itemsize;
  bool has_zero_dim = false;
  while (i < close) {
    while (i < close && (h[i] == ' ' || h[i] == ',')) ++i;
    if (i >= close) break;
    if (h[i] < '0' || h[i] > '9') bad(where, "bad 'shape'");
    int64_t v = 0;
    while (i < close && h[i] >= '0' && h[i] <= '9') {
      if (v > (int64_t{1} << 48)) bad(where, "dimension too large");
      v = v * 10 + (h[i] - '0');
      ++i;
    }
    a.shape.push_back(v);
    if (v == 0) has_zero_dim = true;
    if (v != 0) bytes *= static_cast<uint64_t>(v);
    if (bytes > static_cast<uint64_t>(INT64_MAX)) {
      bad(where, "data is truncated (shape needs more than 2^63 bytes)");
    }
    if (a.shape.size() > 32) bad(where, "too many dimensions");
  }
  if (has_zero_dim) bytes = 0;
  a.data_offset = hstart + hlen;
  a.data_bytes = static_cast<size_t>(bytes);
  if (a.data_bytes > file_size - a.data_offset) {
    bad(where, "data is truncated (needs " + std::to_string(a.data_bytes) + " bytes, file has " +
                   std::to_string(file_size - a.data_offset) + ")");
  }
  return a;
}

}  // namespace torchspeed::data
