// The per-image transform pipeline: the per-sample draws (crop, flip, decode scale) from (seed,
// epoch, index), the decode (image_decode.cpp), the resample (image_resample.cpp) and the store
// (flip, dtype, layout, normalize), matching torchvision given the same draws.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

#include "core/clock.h"
#include "data/image.h"
#include "data/image_internal.h"
#include "data/rng.h"

namespace torchspeed::data {
namespace {

using detail::decode_error;

int choose_scale(DecodeScaling mode, bool is_jpeg, int have_w, int have_h, int need_w, int need_h) {
  if (!is_jpeg || mode == DecodeScaling::kOff) return 1;
  // kAccurate keeps the decoded crop >= 4x the output, where the scaled IDCT's low-pass is
  // dominated by the final antialiased resample (measured: <= 0.6 levels mean on noise
  // textures at 4x, up to 1 at 3x, 2.5 at 2x).
  const int64_t margin = mode == DecodeScaling::kAccurate ? 4 : 1;
  for (int f : {8, 4, 2}) {
    if (int64_t{have_w} >= int64_t{need_w} * f * margin &&
        int64_t{have_h} >= int64_t{need_h} * f * margin) {
      return f;
    }
  }
  return 1;
}

}  // namespace

void validate_transform_options(const ImageTransformOptions& o) {
  auto bad = [](const std::string& what) {
    throw std::invalid_argument("torchspeed.data.transforms: " + what);
  };
  if (o.height <= 0 || o.width <= 0 || o.height > 65536 || o.width > 65536) {
    bad("output size must be positive, got " + std::to_string(o.height) + "x" +
        std::to_string(o.width));
  }
  if (o.mode == CropMode::kResizeCenterCrop && o.resize_size <= 0) {
    bad("resize_size must be positive, got " + std::to_string(o.resize_size));
  }
  if (!(o.scale.first > 0) || !(o.scale.first <= o.scale.second)) {
    bad("scale must satisfy 0 < min <= max, got (" + std::to_string(o.scale.first) + ", " +
        std::to_string(o.scale.second) + ")");
  }
  if (!(o.ratio.first > 0) || !(o.ratio.first <= o.ratio.second)) {
    bad("ratio must satisfy 0 < min <= max, got (" + std::to_string(o.ratio.first) + ", " +
        std::to_string(o.ratio.second) + ")");
  }
  if (!(o.flip_prob >= 0 && o.flip_prob <= 1)) {
    bad("flip_prob must be in [0, 1], got " + std::to_string(o.flip_prob));
  }
  for (float s : o.std) {
    if (!(s != 0)) bad("std must be non-zero");
  }
  if (o.decode_scaling != DecodeScaling::kOff && o.decode_scaling != DecodeScaling::kAccurate &&
      o.decode_scaling != DecodeScaling::kFast) {
    bad("decode_scaling must be kOff, kAccurate or kFast, got " +
        std::to_string(static_cast<int>(o.decode_scaling)));
  }
  if (o.max_image_pixels < 0) {
    bad("max_image_pixels must be >= 0 (0 = no limit), got " + std::to_string(o.max_image_pixels));
  }
}

ImageDraw draw_image_params(const ImageTransformOptions& opt, int width, int height, bool is_jpeg,
                            uint64_t seed, uint64_t epoch, uint64_t index) {
  ImageDraw d;
  d.crop_top = 0;
  d.crop_left = 0;
  d.crop_width = width;
  d.crop_height = height;
  switch (opt.mode) {
    case CropMode::kRandomResizedCrop: {
      // torchvision.transforms.RandomResizedCrop.get_params with our per-sample generator.
      SampleRng rng(seed, epoch, index, RngPurpose::kCrop);
      const double area = static_cast<double>(width) * height;
      const double log_r0 = std::log(opt.ratio.first), log_r1 = std::log(opt.ratio.second);
      bool found = false;
      for (int attempt = 0; attempt < 10 && !found; ++attempt) {
        const double target_area = area * rng.uniform(opt.scale.first, opt.scale.second);
        const double aspect = std::exp(rng.uniform(log_r0, log_r1));
        const int w = static_cast<int>(std::nearbyint(std::sqrt(target_area * aspect)));
        const int h = static_cast<int>(std::nearbyint(std::sqrt(target_area / aspect)));
        if (0 < w && w <= width && 0 < h && h <= height) {
          d.crop_top = static_cast<int>(rng.below(static_cast<uint64_t>(height - h + 1)));
          d.crop_left = static_cast<int>(rng.below(static_cast<uint64_t>(width - w + 1)));
          d.crop_height = h;
          d.crop_width = w;
          found = true;
        }
      }
      if (!found) {  // fallback: central crop clamped to the ratio range
        const double in_ratio = static_cast<double>(width) / height;
        int w = width, h = height;
        if (in_ratio < opt.ratio.first) {
          w = width;
          h = static_cast<int>(std::nearbyint(w / opt.ratio.first));
        } else if (in_ratio > opt.ratio.second) {
          h = height;
          w = static_cast<int>(std::nearbyint(h * opt.ratio.second));
        }
        d.crop_height = h;
        d.crop_width = w;
        d.crop_top = (height - h) / 2;
        d.crop_left = (width - w) / 2;
      }
      d.scale_denom = choose_scale(opt.decode_scaling, is_jpeg, d.crop_width, d.crop_height,
                                   opt.width, opt.height);
      break;
    }
    case CropMode::kResizeCenterCrop: {
      // torchvision Resize(int): the shorter side becomes resize_size, the other keeps the ratio.
      const bool w_short = width <= height;
      const int s = w_short ? width : height, l = w_short ? height : width;
      const int new_l = static_cast<int>(static_cast<int64_t>(opt.resize_size) * l / s);
      d.resize_width = w_short ? opt.resize_size : new_l;
      d.resize_height = w_short ? new_l : opt.resize_size;
      d.scale_denom =
          choose_scale(opt.decode_scaling, is_jpeg, width, height, d.resize_width, d.resize_height);
      break;
    }
    case CropMode::kResize:
      d.resize_width = opt.width;
      d.resize_height = opt.height;
      d.scale_denom =
          choose_scale(opt.decode_scaling, is_jpeg, width, height, opt.width, opt.height);
      break;
    case CropMode::kNone:
      break;
  }
  if (opt.flip_prob > 0) {
    SampleRng rng(seed, epoch, index, RngPurpose::kFlip);
    d.flip = rng.uniform() < opt.flip_prob;
  }
  return d;
}

size_t image_output_bytes(const ImageTransformOptions& opt) {
  const bool fl = opt.to_float || opt.normalize;
  return static_cast<size_t>(opt.height) * opt.width * 3 * (fl ? 4 : 1);
}

void process_image(const uint8_t* data, size_t size, const ImageTransformOptions& opt,
                   uint64_t seed, uint64_t epoch, uint64_t index, void* dst, StageTimes* times) {
  thread_local RgbImage decoded;
  thread_local std::vector<uint8_t> resized, scratch;
  auto t0 = Clock::now();
  int w = 0, h = 0;
  probe_image(data, size, &w, &h, opt.max_image_pixels);
  const ImageFormat fmt = detect_image_format(data, size);
  const ImageDraw d = draw_image_params(opt, w, h, fmt == ImageFormat::kJpeg, seed, epoch, index);
  // Origin of decoded.pixels[0] in the (scaled) image; non-zero after a region decode.
  int org_x = 0, org_y = 0;
  const int f = d.scale_denom;
  const int full_w = (w + f - 1) / f, full_h = (h + f - 1) / f;
#if TORCHSPEED_WITH_JPEG && TORCHSPEED_WITH_LIBJPEG
  if (fmt == ImageFormat::kJpeg && opt.mode == CropMode::kRandomResizedCrop &&
      int64_t{d.crop_width} * d.crop_height < int64_t{w} * h) {
    const int rx0 = d.crop_left / f, ry0 = d.crop_top / f;
    const int rx1 = std::min(full_w, (d.crop_left + d.crop_width + f - 1) / f + 1);
    const int ry1 = std::min(full_h, (d.crop_top + d.crop_height + f - 1) / f + 1);
    detail::RegionResult rr;
    detail::decode_jpeg(data, size, f, false, rx0, ry0, rx1, ry1, opt.max_image_pixels,
                        &decoded.pixels, &rr);
    if (rr.x_offset > rx0 || rr.y_offset > ry0 || rr.x_offset + rr.width < rx1 ||
        rr.y_offset + rr.height < ry1) {
      decode_error("corrupt JPEG: decoded region does not match the header");
    }
    decoded.width = rr.width;
    decoded.height = rr.height;
    org_x = rr.x_offset;
    org_y = rr.y_offset;
  } else
#endif
  {
    decode_image(data, size, f, &decoded, opt.max_image_pixels);
    if (decoded.width != full_w || decoded.height != full_h) {
      decode_error("corrupt image: decoded size " + std::to_string(decoded.width) + "x" +
                   std::to_string(decoded.height) + " does not match the header");
    }
  }
  if (times) times->decode += seconds_since(t0);
  t0 = Clock::now();

  const int ow = opt.width, oh = opt.height;
  resized.resize(static_cast<size_t>(ow) * oh * 3);
  const int sw = decoded.width, sh = decoded.height;
  const size_t stride = static_cast<size_t>(sw) * 3;
  switch (opt.mode) {
    case CropMode::kRandomResizedCrop: {
      if (f == 1) {
        const float box[4] = {0.f, 0.f, static_cast<float>(d.crop_width),
                              static_cast<float>(d.crop_height)};
        const uint8_t* src = decoded.pixels.data() +
                             static_cast<size_t>(d.crop_top - org_y) * stride +
                             static_cast<size_t>(d.crop_left - org_x) * 3;
        detail::resample_strided(src, d.crop_width, d.crop_height, stride, box, ow, oh, 0, 0, ow,
                                 oh, resized.data(), &scratch);
      } else {
        // The crop in scaled coordinates; crop to the enclosing pixels, resample the float box.
        const double fx0 = static_cast<double>(d.crop_left) / f;
        const double fy0 = static_cast<double>(d.crop_top) / f;
        const double fx1 = static_cast<double>(d.crop_left + d.crop_width) / f;
        const double fy1 = static_cast<double>(d.crop_top + d.crop_height) / f;
        const int ix0 = static_cast<int>(std::floor(fx0)), iy0 = static_cast<int>(std::floor(fy0));
        const int ix1 = std::min(static_cast<int>(std::ceil(fx1)), org_x + sw);
        const int iy1 = std::min(static_cast<int>(std::ceil(fy1)), org_y + sh);
        const float box[4] = {static_cast<float>(fx0 - ix0), static_cast<float>(fy0 - iy0),
                              static_cast<float>(fx1 - ix0), static_cast<float>(fy1 - iy0)};
        const uint8_t* src = decoded.pixels.data() + static_cast<size_t>(iy0 - org_y) * stride +
                             static_cast<size_t>(ix0 - org_x) * 3;
        detail::resample_strided(src, ix1 - ix0, iy1 - iy0, stride, box, ow, oh, 0, 0, ow, oh,
                                 resized.data(), &scratch);
      }
      break;
    }
    case CropMode::kResize: {
      const float box[4] = {0.f, 0.f, static_cast<float>(sw), static_cast<float>(sh)};
      detail::resample_strided(decoded.pixels.data(), sw, sh, stride, box, ow, oh, 0, 0, ow, oh,
                               resized.data(), &scratch);
      break;
    }
    case CropMode::kResizeCenterCrop: {
      const int rw = d.resize_width, rh = d.resize_height;
      if (rw < ow || rh < oh) {
        decode_error("CenterCrop " + std::to_string(oh) + "x" + std::to_string(ow) +
                     " is larger than the resized image " + std::to_string(rh) + "x" +
                     std::to_string(rw));
      }
      const int top = static_cast<int>(std::nearbyint((rh - oh) / 2.0));
      const int left = static_cast<int>(std::nearbyint((rw - ow) / 2.0));
      const float box[4] = {0.f, 0.f, static_cast<float>(sw), static_cast<float>(sh)};
      detail::resample_strided(decoded.pixels.data(), sw, sh, stride, box, rw, rh, left, top, ow,
                               oh, resized.data(), &scratch);
      break;
    }
    case CropMode::kNone:
      if (sw != ow || sh != oh) {
        decode_error("image is " + std::to_string(sh) + "x" + std::to_string(sw) + ", expected " +
                     std::to_string(oh) + "x" + std::to_string(ow) + " (no resize configured)");
      }
      std::memcpy(resized.data(), decoded.pixels.data(), resized.size());
      break;
  }

  // Store: flip, dtype and layout in one pass.
  const uint8_t* px = resized.data();
  const bool fl = opt.to_float || opt.normalize;
  const size_t plane = static_cast<size_t>(ow) * oh;
  float scale[3], shift[3];
  for (int c = 0; c < 3; ++c) {
    scale[c] = opt.normalize ? opt.std[c] : 1.0f;
    shift[c] = opt.normalize ? opt.mean[c] : 0.0f;
  }
  for (int y = 0; y < oh; ++y) {
    for (int x = 0; x < ow; ++x) {
      const int sx = d.flip ? ow - 1 - x : x;
      const uint8_t* p = px + (static_cast<size_t>(y) * ow + sx) * 3;
      const size_t pos = static_cast<size_t>(y) * ow + x;
      for (int c = 0; c < 3; ++c) {
        const size_t di = opt.channels_last ? pos * 3 + c : c * plane + pos;
        if (fl) {
          float v = static_cast<float>(p[c]) / 255.0f;
          if (opt.normalize) v = (v - shift[c]) / scale[c];
          static_cast<float*>(dst)[di] = v;
        } else {
          static_cast<uint8_t*>(dst)[di] = p[c];
        }
      }
    }
  }
  if (times) times->transform += seconds_since(t0);
}

const char* crop_mode_name(CropMode mode) {
  switch (mode) {
    case CropMode::kRandomResizedCrop:
      return "random_resized_crop";
    case CropMode::kResizeCenterCrop:
      return "resize_center_crop";
    case CropMode::kResize:
      return "resize";
    case CropMode::kNone:
      break;
  }
  return "none";
}

CropMode parse_crop_mode(const std::string& name) {
  for (CropMode m : {CropMode::kRandomResizedCrop, CropMode::kResizeCenterCrop, CropMode::kResize,
                     CropMode::kNone}) {
    if (name == crop_mode_name(m)) return m;
  }
  throw std::invalid_argument(
      "torchspeed.data: crop must be 'random_resized_crop', 'resize_center_crop', 'resize' or "
      "'none', got '" +
      name + "'");
}

const char* decode_scaling_name(DecodeScaling scaling) {
  switch (scaling) {
    case DecodeScaling::kAccurate:
      return "accurate";
    case DecodeScaling::kFast:
      return "fast";
    case DecodeScaling::kOff:
      break;
  }
  return "off";
}

DecodeScaling parse_decode_scaling(const std::string& name) {
  for (DecodeScaling d : {DecodeScaling::kAccurate, DecodeScaling::kFast, DecodeScaling::kOff}) {
    if (name == decode_scaling_name(d)) return d;
  }
  throw std::invalid_argument(
      "torchspeed.data: decode_scaling must be True/'accurate', 'fast' or False/'off', got '" +
      name + "'");
}

}  // namespace torchspeed::data
