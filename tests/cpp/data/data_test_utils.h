// Test helpers for the data loader: a tiny tar writer, textured test images, JPEG/PNG encoders.
#pragma once

#include <png.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

#if TORCHSPEED_WITH_JPEG
#include <turbojpeg.h>
#endif

namespace torchspeed {
namespace data {
namespace testing {

// Writes ustar archives in memory; names longer than 100 bytes get a GNU 'L' record.
class TarWriter {
 public:
  void add(const std::string& name, const std::string& body) {
    if (name.size() > 99) {
      header("././@LongLink", name.size() + 1, 'L');
      append_padded(name + std::string(1, '\0'));
    }
    header(name.substr(0, 99), body.size(), '0');
    append_padded(body);
  }
  void add_dir(const std::string& name) { header(name, 0, '5'); }
  std::string finish() {
    out_.append(1024, '\0');
    return out_;
  }

 private:
  void header(const std::string& name, size_t size, char type) {
    char h[512];
    std::memset(h, 0, sizeof(h));
    std::memcpy(h, name.data(), std::min<size_t>(name.size(), 99));
    std::snprintf(h + 100, 8, "%07o", 0644);
    std::snprintf(h + 108, 8, "%07o", 0);
    std::snprintf(h + 116, 8, "%07o", 0);
    std::snprintf(h + 124, 12, "%011llo", static_cast<unsigned long long>(size));
    std::snprintf(h + 136, 12, "%011o", 0);
    h[156] = type;
    std::memcpy(h + 257, "ustar", 5);
    std::memcpy(h + 263, "00", 2);
    std::memset(h + 148, ' ', 8);
    unsigned sum = 0;
    for (unsigned char c : h) sum += c;
    std::snprintf(h + 148, 8, "%06o", sum);
    h[155] = ' ';
    out_.append(h, 512);
  }
  void append_padded(const std::string& s) {
    out_ += s;
    out_.append((512 - s.size() % 512) % 512, '\0');
  }
  std::string out_;
};

// Deterministic textured RGB image (sinusoids + hashed noise), packed HWC.
inline std::vector<uint8_t> textured_rgb(int w, int h, uint32_t seed) {
  std::vector<uint8_t> px(static_cast<size_t>(w) * h * 3);
  uint32_t s = seed * 2654435761u + 1;
  for (int y = 0; y < h; ++y) {
    for (int x = 0; x < w; ++x) {
      for (int c = 0; c < 3; ++c) {
        s ^= s << 13;
        s ^= s >> 17;
        s ^= s << 5;
        const double v = 128 + 60 * std::sin(0.07 * x * (c + 1) + 0.05 * y + seed) +
                         30 * std::cos(0.11 * y * (c + 2)) + static_cast<double>(s % 41) - 20;
        px[(static_cast<size_t>(y) * w + x) * 3 + c] =
            static_cast<uint8_t>(v < 0 ? 0 : (v > 255 ? 255 : v));
      }
    }
  }
  return px;
}

#if TORCHSPEED_WITH_JPEG
inline std::string encode_jpeg(const std::vector<uint8_t>& rgb, int w, int h, int quality,
                               int subsamp = TJSAMP_420) {
  tjhandle t = tjInitCompress();
  unsigned char* buf = nullptr;
  unsigned long len = 0;
  if (tjCompress2(t, rgb.data(), w, 0, h, TJPF_RGB, &buf, &len, subsamp, quality, 0) != 0) {
    tjDestroy(t);
    throw std::runtime_error("tjCompress2 failed");
  }
  std::string out(reinterpret_cast<char*>(buf), len);
  tjFree(buf);
  tjDestroy(t);
  return out;
}
#endif

inline std::string encode_png(const std::vector<uint8_t>& px, int w, int h, bool rgba = false) {
  png_image img;
  std::memset(&img, 0, sizeof(img));
  img.version = PNG_IMAGE_VERSION;
  img.width = static_cast<png_uint_32>(w);
  img.height = static_cast<png_uint_32>(h);
  img.format = rgba ? PNG_FORMAT_RGBA : PNG_FORMAT_RGB;
  png_alloc_size_t size = 0;
  if (!png_image_write_to_memory(&img, nullptr, &size, 0, px.data(), 0, nullptr)) {
    throw std::runtime_error("png size query failed");
  }
  std::string out(size, '\0');
  if (!png_image_write_to_memory(&img, &out[0], &size, 0, px.data(), 0, nullptr)) {
    throw std::runtime_error(std::string("png write failed: ") + img.message);
  }
  out.resize(size);
  return out;
}

inline const uint8_t* bytes(const std::string& s) {
  return reinterpret_cast<const uint8_t*>(s.data());
}

}  // namespace testing
}  // namespace data
}  // namespace torchspeed
