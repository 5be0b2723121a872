// What the three parts of the image pipeline share (image_decode.cpp, image_resample.cpp,
// image_transform.cpp); the public interface is data/image.h.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "data/image.h"

#ifndef TORCHSPEED_WITH_JPEG
#define TORCHSPEED_WITH_JPEG 0
#endif
#ifndef TORCHSPEED_WITH_LIBJPEG
#define TORCHSPEED_WITH_LIBJPEG 0
#endif

namespace torchspeed::data::detail {

/// Throws std::runtime_error("torchspeed.data.decode: " + what).
[[noreturn]] void decode_error(const std::string& what);

/// What a (region) JPEG decode produced.
struct RegionResult {
  int x_offset = 0, y_offset = 0;  // position of pixels[0] in the scaled image
  int width = 0, height = 0;
};
#if TORCHSPEED_WITH_JPEG
/// Decodes at least [x0, x1) x [y0, y1) of the 1/scale_denom image (everything when `whole`) into
/// `out` (packed RGB of res->width x res->height whose origin in the scaled image is
/// (x_offset, y_offset)). Without libjpeg (TurboJPEG only) the whole image is decoded.
void decode_jpeg(const uint8_t* data, size_t size, int scale_denom, bool whole, int x0, int y0,
                 int x1, int y1, int64_t max_pixels, std::vector<uint8_t>* out, RegionResult* res);
#endif

/// Pillow-compatible bilinear resample of the float `box` of a packed RGB image with row stride
/// `src_stride` to dst_w x dst_h, writing only the window [win_x, win_x + win_w) x [win_y, ...).
void resample_strided(const uint8_t* src, int src_w, int src_h, size_t src_stride,
                      const float box[4], int dst_w, int dst_h, int win_x, int win_y, int win_w,
                      int win_h, uint8_t* out, std::vector<uint8_t>* scratch);

}  // namespace torchspeed::data::detail
