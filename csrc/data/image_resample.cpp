// Pillow-compatible bilinear resampling of packed RGB images (Pillow's libImaging/Resample.c,
// 8 bits per channel): coefficients here, the passes in the CPU kernel layer
// (kernels/cpu/resample.h, on the ISA the kernel table picked).
#include <algorithm>
#include <cmath>
#include <cstring>
#include <stdexcept>
#include <vector>

#include "data/image.h"
#include "data/image_internal.h"
#include "kernels/cpu/dispatch.h"

namespace torchspeed::data {
namespace detail {
namespace {

constexpr int kPrecisionBits = kernels::cpu::kResamplePrecisionBits;

double bilinear_filter(double x) {
  if (x < 0.0) x = -x;
  if (x < 1.0) return 1.0 - x;
  return 0.0;
}

struct Coeffs {
  int ksize = 0;
  std::vector<int> bounds;  // (first, count) per output pixel
  std::vector<int> kk;      // ksize fixed-point weights per output pixel
};

Coeffs precompute_coeffs(int in_size, float in0, float in1, int out_size) {
  constexpr double kSupport = 1.0;
  double scale = static_cast<double>(in1 - in0) / out_size;
  double filterscale = scale < 1.0 ? 1.0 : scale;
  const double support = kSupport * filterscale;
  Coeffs c;
  c.ksize = static_cast<int>(std::ceil(support)) * 2 + 1;
  c.bounds.resize(static_cast<size_t>(out_size) * 2);
  c.kk.assign(static_cast<size_t>(out_size) * c.ksize, 0);
  std::vector<double> k(static_cast<size_t>(c.ksize));
  for (int xx = 0; xx < out_size; ++xx) {
    const double center = in0 + (xx + 0.5) * scale;
    double ww = 0.0;
    const double ss = 1.0 / filterscale;
    int xmin = static_cast<int>(center - support + 0.5);
    if (xmin < 0) xmin = 0;
    int xmax = static_cast<int>(center + support + 0.5);
    if (xmax > in_size) xmax = in_size;
    xmax -= xmin;
    if (xmax > c.ksize) xmax = c.ksize;  // cannot happen for valid boxes; keeps writes in bounds
    if (xmax < 0) xmax = 0;
    for (int x = 0; x < xmax; ++x) {
      const double w = bilinear_filter((x + xmin - center + 0.5) * ss);
      k[static_cast<size_t>(x)] = w;
      ww += w;
    }
    int* out = &c.kk[static_cast<size_t>(xx) * c.ksize];
    for (int x = 0; x < xmax; ++x) {
      double v = k[static_cast<size_t>(x)];
      if (ww != 0.0) v /= ww;
      out[x] = v < 0 ? static_cast<int>(-0.5 + v * (1 << kPrecisionBits))
                     : static_cast<int>(0.5 + v * (1 << kPrecisionBits));
    }
    c.bounds[static_cast<size_t>(xx) * 2] = xmin;
    c.bounds[static_cast<size_t>(xx) * 2 + 1] = xmax;
  }
  return c;
}

}  // namespace

void resample_strided(const uint8_t* src, int src_w, int src_h, size_t src_stride,
                      const float box[4], int dst_w, int dst_h, int win_x, int win_y, int win_w,
                      int win_h, uint8_t* out, std::vector<uint8_t>* scratch) {
  // The passes run in the kernel layer, on the ISA the kernel table picked (TORCHSPEED_CPU_ISA).
  const kernels::cpu::DataKernels& kernels = kernels::cpu::cpu_kernels().data;
  const bool need_h = dst_w != src_w || box[0] != 0 || box[2] != dst_w;
  const bool need_v = dst_h != src_h || box[1] != 0 || box[3] != dst_h;
  int r0 = win_y, r1 = win_y + win_h;
  Coeffs cv;
  if (need_v) {
    cv = precompute_coeffs(src_h, box[1], box[3], dst_h);
    r0 = cv.bounds[static_cast<size_t>(win_y) * 2];
    r1 = cv.bounds[static_cast<size_t>(win_y + win_h - 1) * 2] +
         cv.bounds[static_cast<size_t>(win_y + win_h - 1) * 2 + 1];
  }
  // Intermediate rows [r0, r1) of the horizontally resampled image, only the window's columns.
  const size_t tstride = static_cast<size_t>(win_w) * 3;
  scratch->resize(static_cast<size_t>(std::max(r1 - r0, 1)) * tstride);
  uint8_t* tmp = scratch->data();
  if (need_h) {
    const Coeffs ch = precompute_coeffs(src_w, box[0], box[2], dst_w);
    for (int r = r0; r < r1; ++r) {
      kernels.resample_horizontal(src + static_cast<size_t>(r) * src_stride, src_w,
                                  ch.bounds.data(), ch.kk.data(), ch.ksize, win_x, win_x + win_w,
                                  tmp + static_cast<size_t>(r - r0) * tstride);
    }
  } else {
    for (int r = r0; r < r1; ++r) {
      std::memcpy(tmp + static_cast<size_t>(r - r0) * tstride,
                  src + static_cast<size_t>(r) * src_stride + static_cast<size_t>(win_x) * 3,
                  tstride);
    }
  }
  if (need_v) {
    for (int yy = win_y; yy < win_y + win_h; ++yy) {
      kernels.resample_vertical(tmp, tstride, cv.bounds[static_cast<size_t>(yy) * 2] - r0,
                                cv.bounds[static_cast<size_t>(yy) * 2 + 1],
                                &cv.kk[static_cast<size_t>(yy) * cv.ksize], tstride,
                                out + static_cast<size_t>(yy - win_y) * tstride);
    }
  } else {
    std::memcpy(out, tmp, static_cast<size_t>(win_h) * tstride);
  }
}

}  // namespace detail

using detail::resample_strided;

void resample_bilinear(const uint8_t* src, int src_w, int src_h, const float box[4], int dst_w,
                       int dst_h, int win_x, int win_y, int win_w, int win_h, uint8_t* out) {
  if (src_w <= 0 || src_h <= 0 || dst_w <= 0 || dst_h <= 0 || win_x < 0 || win_y < 0 ||
      win_w <= 0 || win_h <= 0 || win_x + win_w > dst_w || win_y + win_h > dst_h ||
      !(box[0] >= 0) || !(box[1] >= 0) || !(box[2] > box[0]) || !(box[3] > box[1]) ||
      !(box[2] <= src_w) || !(box[3] <= src_h)) {
    throw std::invalid_argument("torchspeed.data.resample_bilinear: bad sizes, box or window");
  }
  std::vector<uint8_t> scratch;
  resample_strided(src, src_w, src_h, static_cast<size_t>(src_w) * 3, box, dst_w, dst_h, win_x,
                   win_y, win_w, win_h, out, &scratch);
}

}  // namespace torchspeed::data
