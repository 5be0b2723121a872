// Torch-free image decode (libjpeg-turbo TurboJPEG API, libpng) and transforms that match
// Pillow/torchvision pixel for pixel given the same draws (see tests/python/test_data_image.py).
#include "image.h"

#include <png.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <stdexcept>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include "rng.h"

#ifndef TORCHSPEED_WITH_JPEG
#define TORCHSPEED_WITH_JPEG 0
#endif
#if TORCHSPEED_WITH_JPEG
#include <turbojpeg.h>
#endif
#ifndef TORCHSPEED_WITH_LIBJPEG
#define TORCHSPEED_WITH_LIBJPEG 0
#endif
#if TORCHSPEED_WITH_JPEG && TORCHSPEED_WITH_LIBJPEG
#include <jpeglib.h>

#include <csetjmp>
#include <cstdio>
#endif

namespace torchspeed {
namespace data {
namespace {

#ifndef TORCHSPEED_DATA_MAX_PIXELS
#define TORCHSPEED_DATA_MAX_PIXELS (int64_t{1} << 28)
#endif
// Decompression-bomb guard (268 Mpx by default; the fuzz build lowers it to keep allocations
// small).
constexpr int64_t kMaxPixels = TORCHSPEED_DATA_MAX_PIXELS;

[[noreturn]] void decode_error(const std::string& what) {
  throw std::runtime_error("torchspeed.data.decode: " + what);
}

#if !TORCHSPEED_WITH_JPEG
constexpr const char* kJpegNotBuilt =
    "JPEG decode is not in this build (configured with TORCHSPEED_WITH_JPEG=OFF); install "
    "libjpeg-turbo (Debian: libturbojpeg0-dev libjpeg62-turbo-dev) and rebuild with "
    "TORCHSPEED_WITH_JPEG=ON";
#endif

using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

#if TORCHSPEED_WITH_JPEG
// One TurboJPEG handle per thread: handles are not thread-safe and are costly to create.
struct TjHandle {
  tjhandle h = tjInitDecompress();
  ~TjHandle() {
    if (h != nullptr) tjDestroy(h);
  }
};
tjhandle thread_tj() {
  thread_local TjHandle handle;
  if (handle.h == nullptr) decode_error("cannot create a TurboJPEG decompressor");
  return handle.h;
}
#endif

void probe_png(const uint8_t* data, size_t size, int* w, int* h) {
  if (size < 24 || std::memcmp(data + 12, "IHDR", 4) != 0) decode_error("corrupt PNG: no IHDR");
  auto be32 = [&](size_t o) {
    return (uint32_t{data[o]} << 24) | (uint32_t{data[o + 1]} << 16) |
           (uint32_t{data[o + 2]} << 8) | uint32_t{data[o + 3]};
  };
  const uint32_t pw = be32(16), ph = be32(20);
  if (pw == 0 || ph == 0 || pw > (1u << 24) || ph > (1u << 24)) {
    decode_error("corrupt PNG: bad size " + std::to_string(pw) + "x" + std::to_string(ph));
  }
  *w = static_cast<int>(pw);
  *h = static_cast<int>(ph);
}

void check_pixels(int w, int h) {
  if (w <= 0 || h <= 0 || int64_t{w} * h > kMaxPixels) {
    decode_error("image size " + std::to_string(w) + "x" + std::to_string(h) +
                 " is empty or larger than the 2^28-pixel limit");
  }
}

// ---- Pillow-compatible bilinear resampling (Pillow's libImaging/Resample.c, 8 bits per channel).
constexpr int kPrecisionBits = 32 - 8 - 2;

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

inline uint8_t clip8(int v) {
  v >>= kPrecisionBits;
  return static_cast<uint8_t>(v < 0 ? 0 : (v > 255 ? 255 : v));
}

// The two passes are compiled for AVX2 and for the baseline ISA (picked at load time by the
// dynamic loader); integer sums are exact, so every variant gives identical pixels.
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__SANITIZE_ADDRESS__) && \
    !defined(__clang__)
#define TORCHSPEED_MULTIVERSION __attribute__((target_clones("avx2", "default")))
#else
#define TORCHSPEED_MULTIVERSION
#endif

// One output pixel of the horizontal pass (scalar reference).
inline void horizontal_pixel(const uint8_t* row, const Coeffs& ch, int xx, uint8_t* o) {
  const int xmin = ch.bounds[static_cast<size_t>(xx) * 2];
  const int xmax = ch.bounds[static_cast<size_t>(xx) * 2 + 1];
  const int* k = &ch.kk[static_cast<size_t>(xx) * ch.ksize];
  int s0 = 1 << (kPrecisionBits - 1), s1 = s0, s2 = s0;
  const uint8_t* p = row + static_cast<size_t>(xmin) * 3;
  for (int x = 0; x < xmax; ++x) {
    s0 += p[3 * x] * k[x];
    s1 += p[3 * x + 1] * k[x];
    s2 += p[3 * x + 2] * k[x];
  }
  o[0] = clip8(s0);
  o[1] = clip8(s1);
  o[2] = clip8(s2);
}

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
// SSE4.1: one 4-byte load per tap feeds all three channels (lane 3 is ignored). Pixels whose last
// tap is the row's last pixel take the scalar path, so no load reads past a row's crop.
__attribute__((target("sse4.1"))) void horizontal_row_sse41(const uint8_t* row, int src_w,
                                                            const Coeffs& ch, int x0, int x1,
                                                            uint8_t* out) {
  const __m128i init = _mm_set1_epi32(1 << (kPrecisionBits - 1));
  for (int xx = x0; xx < x1; ++xx) {
    const int xmin = ch.bounds[static_cast<size_t>(xx) * 2];
    const int xmax = ch.bounds[static_cast<size_t>(xx) * 2 + 1];
    uint8_t* o = out + static_cast<size_t>(xx - x0) * 3;
    if (xmin + xmax >= src_w) {
      horizontal_pixel(row, ch, xx, o);
      continue;
    }
    const int* k = &ch.kk[static_cast<size_t>(xx) * ch.ksize];
    const uint8_t* p = row + static_cast<size_t>(xmin) * 3;
    __m128i acc = init;
    for (int x = 0; x < xmax; ++x) {
      int32_t v;
      std::memcpy(&v, p + 3 * x, 4);
      const __m128i px = _mm_cvtepu8_epi32(_mm_cvtsi32_si128(v));
      acc = _mm_add_epi32(acc, _mm_mullo_epi32(px, _mm_set1_epi32(k[x])));
    }
    acc = _mm_srai_epi32(acc, kPrecisionBits);
    const __m128i b8 = _mm_packus_epi16(_mm_packs_epi32(acc, acc), _mm_setzero_si128());
    const uint32_t rgb = static_cast<uint32_t>(_mm_cvtsi128_si32(b8));
    o[0] = static_cast<uint8_t>(rgb);
    o[1] = static_cast<uint8_t>(rgb >> 8);
    o[2] = static_cast<uint8_t>(rgb >> 16);
  }
}
bool cpu_has_sse41() {
  static const bool has = __builtin_cpu_supports("sse4.1");
  return has;
}
#endif

// One row of the horizontal pass: out[xx] for xx in [x0, x1) from an RGB source row.
void horizontal_row(const uint8_t* row, int src_w, const Coeffs& ch, int x0, int x1, uint8_t* out) {
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
  if (cpu_has_sse41()) {
    horizontal_row_sse41(row, src_w, ch, x0, x1, out);
    return;
  }
#endif
  (void)src_w;
  for (int xx = x0; xx < x1; ++xx)
    horizontal_pixel(row, ch, xx, out + static_cast<size_t>(xx - x0) * 3);
}

// One output row of the vertical pass, accumulated row by row so the inner loop vectorizes.
TORCHSPEED_MULTIVERSION
void vertical_row(const uint8_t* tmp, size_t stride, int ymin, int ymax, const int* k, size_t n,
                  int32_t* acc, uint8_t* out) {
  for (size_t i = 0; i < n; ++i) acc[i] = 1 << (kPrecisionBits - 1);
  for (int y = 0; y < ymax; ++y) {
    const uint8_t* p = tmp + static_cast<size_t>(ymin + y) * stride;
    const int32_t kv = k[y];
    for (size_t i = 0; i < n; ++i) acc[i] += p[i] * kv;
  }
  for (size_t i = 0; i < n; ++i) out[i] = clip8(acc[i]);
}

void resample_strided(const uint8_t* src, int src_w, int src_h, size_t src_stride,
                      const float box[4], int dst_w, int dst_h, int win_x, int win_y, int win_w,
                      int win_h, uint8_t* out, std::vector<uint8_t>* scratch) {
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
      horizontal_row(src + static_cast<size_t>(r) * src_stride, src_w, ch, win_x, win_x + win_w,
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
    thread_local std::vector<int32_t> acc;
    acc.resize(tstride);
    for (int yy = win_y; yy < win_y + win_h; ++yy) {
      vertical_row(tmp, tstride, cv.bounds[static_cast<size_t>(yy) * 2] - r0,
                   cv.bounds[static_cast<size_t>(yy) * 2 + 1],
                   &cv.kk[static_cast<size_t>(yy) * cv.ksize], tstride, acc.data(),
                   out + static_cast<size_t>(yy - win_y) * tstride);
    }
  } else {
    std::memcpy(out, tmp, static_cast<size_t>(win_h) * tstride);
  }
}

#if TORCHSPEED_WITH_JPEG && TORCHSPEED_WITH_LIBJPEG
// Region decode through the libjpeg API of the same libjpeg-turbo: only the rows down to the
// region's bottom are entropy-decoded, rows above it skip IDCT/upsampling/colour conversion
// (jpeg_skip_scanlines) and columns outside it skip IDCT (jpeg_crop_scanline). A margin of
// kRegionMargin pixels keeps the region away from the cropped decode's edges, where fancy
// upsampling lacks its neighbours, so the region's pixels equal a full decode's (tested).
constexpr int kRegionMargin = 16;

struct JpegErr {
  jpeg_error_mgr mgr;
  jmp_buf jump;
  char message[JMSG_LENGTH_MAX];
};

void jpeg_error_exit_cb(j_common_ptr cinfo) {
  auto* err = reinterpret_cast<JpegErr*>(cinfo->err);
  (*cinfo->err->format_message)(cinfo, err->message);
  std::longjmp(err->jump, 1);
}

void jpeg_emit_message_cb(j_common_ptr cinfo, int level) {
  if (level < 0) {  // a warning means corrupt data: fail like TJFLAG_STOPONWARNING
    auto* err = reinterpret_cast<JpegErr*>(cinfo->err);
    (*cinfo->err->format_message)(cinfo, err->message);
    std::longjmp(err->jump, 1);
  }
}

struct RegionResult {
  int x_offset = 0, y_offset = 0;  // position of pixels[0] in the scaled image
  int width = 0, height = 0;
};

// POD-only frame between setjmp and longjmp: `out` is sized before, and nothing with a
// destructor lives in this function.
bool decode_jpeg_region_raw(const uint8_t* data, size_t size, int scale_denom, int x0, int y0,
                            int x1, int y1, std::vector<uint8_t>* out, RegionResult* res,
                            char* message) {
  jpeg_decompress_struct cinfo;
  JpegErr err;
  cinfo.err = jpeg_std_error(&err.mgr);
  err.mgr.error_exit = jpeg_error_exit_cb;
  err.mgr.emit_message = jpeg_emit_message_cb;
  err.message[0] = 0;
  if (setjmp(err.jump)) {
    std::snprintf(message, JMSG_LENGTH_MAX, "%s", err.message);
    jpeg_destroy_decompress(&cinfo);
    return false;
  }
  jpeg_create_decompress(&cinfo);
  jpeg_mem_src(&cinfo, data, static_cast<unsigned long>(size));
  jpeg_read_header(&cinfo, TRUE);
  cinfo.out_color_space = JCS_RGB;
  cinfo.scale_num = 1;
  cinfo.scale_denom = static_cast<unsigned int>(scale_denom);
  cinfo.dct_method = JDCT_ISLOW;
  jpeg_start_decompress(&cinfo);
  const int sw = static_cast<int>(cinfo.output_width), sh = static_cast<int>(cinfo.output_height);
  const int mx0 = std::max(0, x0 - kRegionMargin), mx1 = std::min(sw, x1 + kRegionMargin);
  const int my0 = std::max(0, y0 - kRegionMargin), my1 = std::min(sh, y1 + kRegionMargin);
  JDIMENSION xoff = static_cast<JDIMENSION>(mx0), width = static_cast<JDIMENSION>(mx1 - mx0);
  if (mx0 > 0 || mx1 < sw) jpeg_crop_scanline(&cinfo, &xoff, &width);
  const size_t stride = static_cast<size_t>(cinfo.output_width) * 3;
  const size_t need = stride * static_cast<size_t>(my1 - my0);
  if (need > out->size()) {  // cannot resize here safely (setjmp frame); the caller retries
    res->width = -1;
    res->height = static_cast<int>(need / std::max<size_t>(stride, 1));
    res->x_offset = static_cast<int>(stride);
    jpeg_abort_decompress(&cinfo);
    jpeg_destroy_decompress(&cinfo);
    return true;
  }
  if (my0 > 0) jpeg_skip_scanlines(&cinfo, static_cast<JDIMENSION>(my0));
  uint8_t* base = out->data();
  while (static_cast<int>(cinfo.output_scanline) < my1) {
    JSAMPROW row =
        base + static_cast<size_t>(static_cast<int>(cinfo.output_scanline) - my0) * stride;
    jpeg_read_scanlines(&cinfo, &row, 1);
  }
  res->x_offset = static_cast<int>(xoff);
  res->y_offset = my0;
  res->width = static_cast<int>(cinfo.output_width);
  res->height = my1 - my0;
  jpeg_abort_decompress(&cinfo);  // stop early: the rows below the region are never decoded
  jpeg_destroy_decompress(&cinfo);
  return true;
}

// Decodes at least [x0, x1) x [y0, y1) of the 1/scale_denom image into `out` (packed RGB of
// res->width x res->height whose origin in the scaled image is (x_offset, y_offset)).
void decode_jpeg_region(const uint8_t* data, size_t size, int scale_denom, int x0, int y0, int x1,
                        int y1, std::vector<uint8_t>* out, RegionResult* res) {
  char message[JMSG_LENGTH_MAX] = {0};
  for (int attempt = 0; attempt < 2; ++attempt) {
    if (!decode_jpeg_region_raw(data, size, scale_denom, x0, y0, x1, y1, out, res, message)) {
      decode_error(std::string("corrupt JPEG: ") + message);
    }
    if (res->width >= 0) return;
    out->resize(static_cast<size_t>(res->x_offset) * static_cast<size_t>(res->height));
  }
  decode_error("internal error: region buffer sizing failed");
}
#endif

int choose_scale(bool allowed, int have_w, int have_h, int need_w, int need_h) {
  if (!allowed) return 1;
  for (int f : {8, 4, 2}) {
    if (int64_t{have_w} >= int64_t{need_w} * f && int64_t{have_h} >= int64_t{need_h} * f) return f;
  }
  return 1;
}

}  // namespace

ImageFormat detect_image_format(const uint8_t* data, size_t size) {
  if (size >= 3 && data[0] == 0xFF && data[1] == 0xD8 && data[2] == 0xFF) return ImageFormat::kJpeg;
  static const uint8_t kPng[8] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1A, '\n'};
  if (size >= 8 && std::memcmp(data, kPng, 8) == 0) return ImageFormat::kPng;
  return ImageFormat::kUnknown;
}

bool jpeg_supported() { return TORCHSPEED_WITH_JPEG != 0; }

void probe_image(const uint8_t* data, size_t size, int* width, int* height) {
  switch (detect_image_format(data, size)) {
    case ImageFormat::kJpeg: {
#if TORCHSPEED_WITH_JPEG
      int w = 0, h = 0, subsamp = 0, cs = 0;
      if (tjDecompressHeader3(thread_tj(), data, static_cast<unsigned long>(size), &w, &h, &subsamp,
                              &cs) != 0) {
        decode_error(std::string("corrupt JPEG header: ") + tjGetErrorStr2(thread_tj()));
      }
      *width = w;
      *height = h;
      check_pixels(w, h);
      return;
#else
      decode_error(kJpegNotBuilt);
#endif
    }
    case ImageFormat::kPng:
      probe_png(data, size, width, height);
      check_pixels(*width, *height);
      return;
    default:
      decode_error("unknown image format (not JPEG or PNG)");
  }
}

void decode_image(const uint8_t* data, size_t size, int scale_denom, RgbImage* out) {
  const ImageFormat fmt = detect_image_format(data, size);
  if (fmt == ImageFormat::kJpeg) {
#if TORCHSPEED_WITH_JPEG
    int w = 0, h = 0;
    probe_image(data, size, &w, &h);
    if (scale_denom != 1 && scale_denom != 2 && scale_denom != 4 && scale_denom != 8) {
      throw std::invalid_argument("torchspeed.data.decode: scale_denom must be 1, 2, 4 or 8, got " +
                                  std::to_string(scale_denom));
    }
    const tjscalingfactor sf{1, scale_denom};
    const int sw = TJSCALED(w, sf), sh = TJSCALED(h, sf);
    out->width = sw;
    out->height = sh;
    out->pixels.resize(static_cast<size_t>(sw) * sh * 3);
    if (tjDecompress2(thread_tj(), data, static_cast<unsigned long>(size), out->pixels.data(), sw,
                      0, sh, TJPF_RGB, TJFLAG_STOPONWARNING) != 0) {
      decode_error(std::string("corrupt JPEG: ") + tjGetErrorStr2(thread_tj()));
    }
    return;
#else
    (void)scale_denom;
    decode_error(kJpegNotBuilt);
#endif
  }
  if (fmt == ImageFormat::kPng) {
    if (scale_denom != 1) {
      throw std::invalid_argument("torchspeed.data.decode: PNG decode needs scale_denom 1, got " +
                                  std::to_string(scale_denom));
    }
    png_image img;
    std::memset(&img, 0, sizeof(img));
    img.version = PNG_IMAGE_VERSION;
    if (png_image_begin_read_from_memory(&img, data, size) == 0) {
      decode_error(std::string("corrupt PNG: ") + img.message);
    }
    if (img.width == 0 || img.height == 0 || img.width > (1u << 24) || img.height > (1u << 24) ||
        int64_t{img.width} * img.height > kMaxPixels) {
      const std::string dims = std::to_string(img.width) + "x" + std::to_string(img.height);
      png_image_free(&img);
      decode_error("PNG size " + dims + " is empty or larger than the 2^28-pixel limit");
    }
    // Read RGBA and drop alpha, which is what PIL's convert("RGB") does (no compositing).
    img.format = PNG_FORMAT_RGBA;
    std::vector<uint8_t> rgba(PNG_IMAGE_SIZE(img));
    if (png_image_finish_read(&img, nullptr, rgba.data(), 0, nullptr) == 0) {
      std::string msg = img.message;
      png_image_free(&img);
      decode_error("corrupt PNG: " + msg);
    }
    out->width = static_cast<int>(img.width);
    out->height = static_cast<int>(img.height);
    const size_t n = static_cast<size_t>(out->width) * out->height;
    out->pixels.resize(n * 3);
    for (size_t i = 0; i < n; ++i) {
      out->pixels[3 * i] = rgba[4 * i];
      out->pixels[3 * i + 1] = rgba[4 * i + 1];
      out->pixels[3 * i + 2] = rgba[4 * i + 2];
    }
    return;
  }
  decode_error("unknown image format (not JPEG or PNG)");
}

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
}

ImageDraw draw_image_params(const ImageTransformOptions& opt, int width, int height, bool is_jpeg,
                            uint64_t seed, uint64_t epoch, uint64_t index) {
  ImageDraw d;
  d.crop_top = 0;
  d.crop_left = 0;
  d.crop_width = width;
  d.crop_height = height;
  const bool may_scale = is_jpeg && opt.decode_scaling;
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
      d.scale_denom = choose_scale(may_scale, d.crop_width, d.crop_height, opt.width, opt.height);
      break;
    }
    case CropMode::kResizeCenterCrop: {
      // torchvision Resize(int): the shorter side becomes resize_size, the other keeps the ratio.
      const bool w_short = width <= height;
      const int s = w_short ? width : height, l = w_short ? height : width;
      const int new_l = static_cast<int>(static_cast<int64_t>(opt.resize_size) * l / s);
      d.resize_width = w_short ? opt.resize_size : new_l;
      d.resize_height = w_short ? new_l : opt.resize_size;
      d.scale_denom = choose_scale(may_scale, width, height, d.resize_width, d.resize_height);
      break;
    }
    case CropMode::kResize:
      d.resize_width = opt.width;
      d.resize_height = opt.height;
      d.scale_denom = choose_scale(may_scale, width, height, opt.width, opt.height);
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
  probe_image(data, size, &w, &h);
  const ImageFormat fmt = detect_image_format(data, size);
  const ImageDraw d = draw_image_params(opt, w, h, fmt == ImageFormat::kJpeg, seed, epoch, index);
  // Origin of decoded.pixels[0] in the (scaled) image; non-zero after a region decode.
  int org_x = 0, org_y = 0;
#if TORCHSPEED_WITH_JPEG && TORCHSPEED_WITH_LIBJPEG
  if (fmt == ImageFormat::kJpeg && opt.mode == CropMode::kRandomResizedCrop &&
      int64_t{d.crop_width} * d.crop_height < int64_t{w} * h) {
    const int f = d.scale_denom;
    const int rx0 = d.crop_left / f, ry0 = d.crop_top / f;
    const int rx1 = (d.crop_left + d.crop_width + f - 1) / f;
    const int ry1 = (d.crop_top + d.crop_height + f - 1) / f;
    RegionResult rr;
    decode_jpeg_region(data, size, f, rx0, ry0, rx1 + 1, ry1 + 1, &decoded.pixels, &rr);
    decoded.width = rr.width;
    decoded.height = rr.height;
    org_x = rr.x_offset;
    org_y = rr.y_offset;
  } else
#endif
  {
    decode_image(data, size, d.scale_denom, &decoded);
  }
  if (times) times->decode += seconds_since(t0);
  t0 = Clock::now();

  const int ow = opt.width, oh = opt.height;
  resized.resize(static_cast<size_t>(ow) * oh * 3);
  const int f = d.scale_denom;
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
        resample_strided(src, d.crop_width, d.crop_height, stride, box, ow, oh, 0, 0, ow, oh,
                         resized.data(), &scratch);
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
        resample_strided(src, ix1 - ix0, iy1 - iy0, stride, box, ow, oh, 0, 0, ow, oh,
                         resized.data(), &scratch);
      }
      break;
    }
    case CropMode::kResize: {
      const float box[4] = {0.f, 0.f, static_cast<float>(sw), static_cast<float>(sh)};
      resample_strided(decoded.pixels.data(), sw, sh, stride, box, ow, oh, 0, 0, ow, oh,
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
      resample_strided(decoded.pixels.data(), sw, sh, stride, box, rw, rh, left, top, ow, oh,
                       resized.data(), &scratch);
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

}  // namespace data
}  // namespace torchspeed
