// UTF-8 checks for text that leaves C++ as a Python str or a JSON string: the loader's sample text
// fields (.txt/.json, validated per sample inside its error policy), error messages (escaped, so
// that raising or reading stats() can never fail on bytes taken from a file or a tar member name)
// and the profiler's range names in a trace.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace torchspeed {

// Length of the valid UTF-8 sequence starting at s[0] (1..4), or 0 if the bytes there are not
// one (bad lead byte, bad or missing continuation, overlong form, surrogate, > U+10FFFF).
inline size_t utf8_sequence_length(std::string_view s) {
  const auto b = [&](size_t i) { return static_cast<uint8_t>(s[i]); };
  const auto cont = [&](size_t i) { return i < s.size() && (b(i) & 0xC0) == 0x80; };
  const uint8_t c = b(0);
  if (c < 0x80) return 1;
  if (c >= 0xC2 && c <= 0xDF) return cont(1) ? 2 : 0;
  if (c >= 0xE0 && c <= 0xEF) {
    if (!cont(1) || !cont(2)) return 0;
    if (c == 0xE0 && b(1) < 0xA0) return 0;  // overlong
    if (c == 0xED && b(1) > 0x9F) return 0;  // UTF-16 surrogate
    return 3;
  }
  if (c >= 0xF0 && c <= 0xF4) {
    if (!cont(1) || !cont(2) || !cont(3)) return 0;
    if (c == 0xF0 && b(1) < 0x90) return 0;  // overlong
    if (c == 0xF4 && b(1) > 0x8F) return 0;  // > U+10FFFF
    return 4;
  }
  return 0;
}

// Offset of the first byte that is not valid UTF-8, or s.size() if all of it is.
inline size_t first_invalid_utf8(std::string_view s) {
  size_t i = 0;
  while (i < s.size()) {
    const size_t n = utf8_sequence_length(s.substr(i));
    if (n == 0) return i;
    i += n;
  }
  return i;
}

// `s` with every byte that is not valid UTF-8 written as \xNN (valid text is kept as is).
inline std::string escape_invalid_utf8(std::string_view s) {
  static const char* const kHex = "0123456789abcdef";
  std::string out;
  out.reserve(s.size());
  size_t i = 0;
  while (i < s.size()) {
    const size_t n = utf8_sequence_length(s.substr(i));
    if (n == 0) {
      const auto c = static_cast<uint8_t>(s[i]);
      out += "\\x";
      out += kHex[c >> 4];
      out += kHex[c & 15];
      ++i;
    } else {
      out.append(s.substr(i, n));
      i += n;
    }
  }
  return out;
}

}  // namespace torchspeed
