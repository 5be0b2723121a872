// Torch-free image pipeline: JPEG (libjpeg-turbo, decode-time scaling) / PNG (libpng) decode,
// PIL-compatible antialiased bilinear resampling, torchvision-style crops, flip, normalize, layout.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "torchspeed/data/options.h"
#include "torchspeed/export.h"

namespace torchspeed::data {

enum class ImageFormat { kUnknown, kJpeg, kPng };
TORCHSPEED_API ImageFormat detect_image_format(const uint8_t* data, size_t size);
TORCHSPEED_API bool
jpeg_supported();  // false when built without libjpeg-turbo (TORCHSPEED_WITH_JPEG=0)

// An 8-bit RGB image, rows packed (stride = 3 * width).
struct RgbImage {
  int width = 0;
  int height = 0;
  std::vector<uint8_t> pixels;
};

// Reads width/height from the header without decoding (the format comes from the bytes, never
// from a file name). Throws std::runtime_error on bad data or when width * height exceeds
// max_pixels (0 = no limit).
TORCHSPEED_API void probe_image(const uint8_t* data, size_t size, int* width, int* height,
                                int64_t max_pixels = kDefaultMaxImagePixels);

// Decodes to RGB like Pillow's Image.open(...).convert("RGB"). `scale_denom` (1, 2, 4 or 8)
// decodes a JPEG at 1/scale_denom size through libjpeg-turbo's scaled IDCT (size =
// ceil(dim / scale_denom)); PNG requires 1.
//  JPEG: grayscale, YCbCr, RGB, and CMYK / YCCK (Adobe inverted convention, as Pillow assumes).
//  PNG: any bit depth and colour type; palette expanded, alpha dropped (no compositing), 16-bit
//  channels keep the high byte, except 16-bit grayscale, which Pillow clips to 255.
// Bombs: images over max_pixels (0 = no limit) are refused from the header; the output grows
// with the rows actually decoded, and PNG IDAT / progressive JPEG data too small to fill the
// declared size is refused before anything big is allocated.
// Corrupt or truncated data (including libjpeg warnings) throws std::runtime_error.
TORCHSPEED_API void decode_image(const uint8_t* data, size_t size, int scale_denom, RgbImage* out,
                                 int64_t max_pixels = kDefaultMaxImagePixels);

// Resamples the region `box` (x0, y0, x1, y1 in source pixels, float like PIL) of an RGB image
// of src_w x src_h to a dst_w x dst_h image with PIL's BILINEAR filter (antialiased when
// shrinking), bit-exact with Pillow's Image.resize(size, BILINEAR, box). Only the output window
// [win_x, win_x + win_w) x [win_y, win_y + win_h) is computed and written to `out` (packed RGB).
TORCHSPEED_API void resample_bilinear(const uint8_t* src, int src_w, int src_h, const float box[4],
                                      int dst_w, int dst_h, int win_x, int win_y, int win_w,
                                      int win_h, uint8_t* out);

// The random (or fixed) choices for one sample, a pure function of (options, image size, seed,
// epoch, index). crop_* are in original-image pixels; scale_denom is the JPEG decode scale chosen
// under opt.decode_scaling.
struct ImageDraw {
  int crop_top = 0, crop_left = 0, crop_height = 0, crop_width = 0;
  bool flip = false;
  int scale_denom = 1;
  int resize_width = 0, resize_height = 0;  // kResize / kResizeCenterCrop: intermediate size
};
TORCHSPEED_API ImageDraw draw_image_params(const ImageTransformOptions& opt, int width, int height,
                                           bool is_jpeg, uint64_t seed, uint64_t epoch,
                                           uint64_t index);

// Per-sample stage timings in seconds (added to by process_image).
struct StageTimes {
  double read = 0, decode = 0, transform = 0, collate = 0;
};

// Bytes of one output sample (3 * height * width * (1 or 4)).
TORCHSPEED_API size_t image_output_bytes(const ImageTransformOptions& opt);

// Full pipeline for one encoded image: probe, draw, decode (scaled), crop/resize, flip, store as
// uint8 or float32 in CHW or HWC into `dst` (image_output_bytes(opt) bytes).
TORCHSPEED_API void process_image(const uint8_t* data, size_t size,
                                  const ImageTransformOptions& opt, uint64_t seed, uint64_t epoch,
                                  uint64_t index, void* dst, StageTimes* times = nullptr);

TORCHSPEED_API void validate_transform_options(
    const ImageTransformOptions& opt);  // throws std::invalid_argument

}  // namespace torchspeed::data
