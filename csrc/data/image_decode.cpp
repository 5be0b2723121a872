// Torch-free image decode: JPEG (libjpeg-turbo; libjpeg for region decodes and CMYK/YCCK) and PNG
// (libpng), converted to RGB as Pillow converts, with decompression-bomb limits. The resample and
// the transforms are image_resample.cpp and image_transform.cpp.
#include <png.h>

#include <algorithm>
#include <chrono>
#include <climits>
#include <cmath>
#include <csetjmp>
#include <cstdio>
#include <cstring>
#include <stdexcept>

#include "core/clock.h"
#include "data/image.h"
#include "data/image_internal.h"
#include "data/rng.h"
#include "kernels/cpu/dispatch.h"

#if TORCHSPEED_WITH_JPEG && TORCHSPEED_WITH_LIBJPEG
#include <jpeglib.h>
#elif TORCHSPEED_WITH_JPEG
#include <turbojpeg.h>
#endif

namespace torchspeed::data {
namespace detail {

[[noreturn]] void decode_error(const std::string& what) {
  throw std::runtime_error("torchspeed.data.decode: " + what);
}

#if !TORCHSPEED_WITH_JPEG
constexpr const char* kJpegNotBuilt =
    "JPEG decode is not in this build (configured with TORCHSPEED_WITH_JPEG=OFF); install "
    "libjpeg-turbo (Debian: libturbojpeg0-dev libjpeg62-turbo-dev) and rebuild with "
    "TORCHSPEED_WITH_JPEG=ON";
#endif

// Whatever max_pixels says, sizes stay far from overflowing size_t arithmetic (and int sides).
constexpr int64_t kMaxSide = int64_t{1} << 24;
constexpr int64_t kHardMaxPixels = int64_t{1} << 40;

void check_pixels(const char* fmt, int64_t w, int64_t h, int64_t max_pixels) {
  const std::string dims = std::to_string(w) + "x" + std::to_string(h);
  if (w <= 0 || h <= 0) decode_error(std::string("corrupt ") + fmt + ": empty image size " + dims);
  if (w > kMaxSide || h > kMaxSide || w * h > kHardMaxPixels) {
    decode_error(std::string(fmt) + " image size " + dims +
                 " is beyond what torchspeed decodes (2^24 per side, 2^40 pixels)");
  }
  if (max_pixels > 0 && w * h > max_pixels) {
    decode_error(std::string(fmt) + " image size " + dims + " (" + std::to_string(w * h) +
                 " pixels) exceeds max_image_pixels=" + std::to_string(max_pixels) +
                 " (a decompression bomb?); raise max_image_pixels to decode it");
  }
}

// Output rows are added as they are decoded, so memory follows the data actually present, not
// the size a header claims: the first allocation is what the data could plausibly fill (64 bytes
// per input byte, at least 1 MiB), then it doubles, capped at the declared size.
class RowGrower {
 public:
  RowGrower(std::vector<uint8_t>* buf, size_t stride, size_t total_rows, size_t input_bytes)
      : buf_(buf), stride_(stride), total_(total_rows) {
    const size_t budget = std::max<size_t>(size_t{1} << 20, input_bytes * 64);
    alloc_ = std::min(total_, std::max<size_t>(1, budget / std::max<size_t>(stride_, 1)));
    buf_->resize(alloc_ * stride_);
  }
  // Pointer to row r (< total_rows), growing the buffer when needed.
  uint8_t* row(size_t r) {
    if (r >= alloc_) {
      alloc_ = std::min(total_, std::max(r + 1, alloc_ * 2));
      buf_->resize(alloc_ * stride_);
    }
    return buf_->data() + r * stride_;
  }
  void finish(size_t rows) { buf_->resize(rows * stride_); }

 private:
  std::vector<uint8_t>* buf_;
  size_t stride_, total_, alloc_ = 0;
};

inline uint32_t be16(const uint8_t* p) { return (uint32_t{p[0]} << 8) | p[1]; }
inline uint32_t be32(const uint8_t* p) {
  return (uint32_t{p[0]} << 24) | (uint32_t{p[1]} << 16) | (uint32_t{p[2]} << 8) | p[3];
}

// ---- JPEG

// Walks the marker segments up to the first SOFn without decoding anything (bounds-checked).
void scan_jpeg_sof(const uint8_t* d, size_t n, int* width, int* height) {
  size_t p = 2;  // after SOI
  for (;;) {
    while (p < n && d[p] != 0xFF) ++p;  // junk between markers: libjpeg rejects it at decode
    while (p < n && d[p] == 0xFF) ++p;
    if (p >= n) decode_error("corrupt JPEG header: no SOF marker");
    const uint8_t m = d[p++];
    if (m == 0x01 || m == 0xD8 || (m >= 0xD0 && m <= 0xD7)) continue;  // no length field
    if (m == 0xD9 || m == 0xDA) decode_error("corrupt JPEG header: no SOF marker before the scan");
    if (p + 2 > n) decode_error("corrupt JPEG header: truncated marker segment");
    const size_t len = be16(d + p);
    if (len < 2 || len > n - p) decode_error("corrupt JPEG header: truncated marker segment");
    if (m >= 0xC0 && m <= 0xCF && m != 0xC4 && m != 0xC8 && m != 0xCC) {
      if (len < 8) decode_error("corrupt JPEG header: short SOF segment");
      *height = static_cast<int>(be16(d + p + 3));
      *width = static_cast<int>(be16(d + p + 5));
      return;
    }
    p += len;
  }
}

// Pillow's CMYK -> RGB: channel = (255 - K) * (1 - C / 255), rounded, with ink values read
// inverted as Adobe writes them (Pillow assumes this convention for every CMYK/YCCK JPEG).
inline int mul_div255(int a, int b) {
  const int t = a * b + 128;
  return (t + (t >> 8)) >> 8;
}
void cmyk_inverted_to_rgb(const uint8_t* in, uint8_t* out, size_t n) {
  for (size_t i = 0; i < n; ++i, in += 4, out += 3) {
    const int nk = in[3];  // 255 - K with K = 255 - stored
    for (int c = 0; c < 3; ++c) out[c] = static_cast<uint8_t>(nk - mul_div255(255 - in[c], nk));
  }
}

#if TORCHSPEED_WITH_JPEG && TORCHSPEED_WITH_LIBJPEG
// Region decode: only the rows down to the region's bottom are entropy-decoded, rows above it
// skip IDCT/upsampling/colour conversion (jpeg_skip_scanlines) and columns outside it skip IDCT
// (jpeg_crop_scanline). A margin of kRegionMargin pixels keeps the region away from the cropped
// decode's edges, where fancy upsampling lacks its neighbours, so the region's pixels equal a
// full decode's (tested).
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

// Runs `f` (libjpeg calls only, no objects with destructors) and turns a libjpeg error into a
// false return. The setjmp lives in this frame, which outlives every frame longjmp skips.
template <typename F>
bool jpeg_guarded(JpegErr* err, F&& f) {
  if (setjmp(err->jump)) return false;
  f();
  return true;
}

class JpegDecoder {
 public:
  JpegDecoder() {
    cinfo.err = jpeg_std_error(&err_.mgr);
    err_.mgr.error_exit = jpeg_error_exit_cb;
    err_.mgr.emit_message = jpeg_emit_message_cb;
    err_.message[0] = 0;
    run([&] { jpeg_create_decompress(&cinfo); });
    created_ = true;
  }
  ~JpegDecoder() {
    if (created_) jpeg_destroy_decompress(&cinfo);
  }
  JpegDecoder(const JpegDecoder&) = delete;
  JpegDecoder& operator=(const JpegDecoder&) = delete;
  template <typename F>
  void run(F&& f) {
    if (!jpeg_guarded(&err_, f)) decode_error(std::string("corrupt JPEG: ") + err_.message);
  }
  jpeg_decompress_struct cinfo;

 private:
  JpegErr err_;
  bool created_ = false;
};

// Decodes at least [x0, x1) x [y0, y1) of the 1/scale_denom image (everything when `whole`)
// into `out` (packed RGB of res->width x res->height whose origin in the scaled image is
// (x_offset, y_offset)).
void decode_jpeg(const uint8_t* data, size_t size, int scale_denom, bool whole, int x0, int y0,
                 int x1, int y1, int64_t max_pixels, std::vector<uint8_t>* out, RegionResult* res) {
  JpegDecoder dec;
  jpeg_decompress_struct& ci = dec.cinfo;
  dec.run([&] {
    jpeg_mem_src(&ci, data, static_cast<unsigned long>(size));
    jpeg_read_header(&ci, TRUE);
  });
  check_pixels("JPEG", ci.image_width, ci.image_height, max_pixels);
  const bool cmyk = ci.jpeg_color_space == JCS_CMYK || ci.jpeg_color_space == JCS_YCCK;
  if (!cmyk && ci.num_components != 1 && ci.num_components != 3) {
    decode_error("JPEG with " + std::to_string(ci.num_components) +
                 " components is not supported (grayscale, YCbCr/RGB, CMYK or YCCK)");
  }
  if (jpeg_has_multiple_scans(&ci) && !ci.arith_code) {
    // A multi-scan (progressive) JPEG gets its whole coefficient buffer before the first row.
    // Every block costs at least one bit in its component's first DC scan, so fewer bits than
    // the smallest component has blocks cannot be a complete image: refuse before allocating.
    uint64_t min_blocks = UINT64_MAX;
    for (int c = 0; c < ci.num_components; ++c) {
      const jpeg_component_info& comp = ci.comp_info[c];
      min_blocks =
          std::min(min_blocks, uint64_t{comp.width_in_blocks} * uint64_t{comp.height_in_blocks});
    }
    if (uint64_t{size} * 8 < min_blocks) {
      decode_error("progressive JPEG data (" + std::to_string(size) +
                   " bytes) is too small for its declared size " + std::to_string(ci.image_width) +
                   "x" + std::to_string(ci.image_height) +
                   " (truncated file or decompression bomb)");
    }
  }
  ci.out_color_space = cmyk ? JCS_CMYK : JCS_RGB;
  ci.scale_num = 1;
  ci.scale_denom = static_cast<unsigned int>(scale_denom);
  ci.dct_method = JDCT_ISLOW;
  dec.run([&] { jpeg_start_decompress(&ci); });
  const int sw = static_cast<int>(ci.output_width), sh = static_cast<int>(ci.output_height);
  int mx0 = 0, mx1 = sw, my0 = 0, my1 = sh;
  if (!whole) {
    mx0 = std::max(0, x0 - kRegionMargin);
    mx1 = std::min(sw, x1 + kRegionMargin);
    my0 = std::max(0, y0 - kRegionMargin);
    my1 = std::min(sh, y1 + kRegionMargin);
  }
  JDIMENSION xoff = static_cast<JDIMENSION>(mx0), width = static_cast<JDIMENSION>(mx1 - mx0);
  if (mx0 > 0 || mx1 < sw) dec.run([&] { jpeg_crop_scanline(&ci, &xoff, &width); });
  const size_t out_w = ci.output_width;  // after jpeg_crop_scanline: the cropped width
  const size_t stride = out_w * 3;
  const size_t rows = static_cast<size_t>(my1 - my0);
  if (my0 > 0) dec.run([&] { jpeg_skip_scanlines(&ci, static_cast<JDIMENSION>(my0)); });
  std::vector<uint8_t> ink_row(cmyk ? out_w * 4 : 0);
  RowGrower grow(out, stride, rows, size);
  while (static_cast<int>(ci.output_scanline) < my1) {
    const size_t r = ci.output_scanline - static_cast<size_t>(my0);
    uint8_t* dst = grow.row(r);
    JSAMPROW row = cmyk ? ink_row.data() : dst;
    JDIMENSION got = 0;
    dec.run([&] { got = jpeg_read_scanlines(&ci, &row, 1); });
    if (got != 1) decode_error("corrupt JPEG: no more scanlines");
    if (cmyk) cmyk_inverted_to_rgb(ink_row.data(), dst, out_w);
  }
  if (whole) {
    dec.run([&] { jpeg_finish_decompress(&ci); });  // reads to EOI: a cut file fails here too
  } else {
    jpeg_abort_decompress(&ci);  // stop early: the rows below the region are never decoded
  }
  grow.finish(rows);
  res->x_offset = static_cast<int>(xoff);
  res->y_offset = my0;
  res->width = static_cast<int>(out_w);
  res->height = static_cast<int>(rows);
}

#elif TORCHSPEED_WITH_JPEG
// TurboJPEG-only build (no libjpeg API): whole-image decode into a buffer of the declared size,
// so the declared size is first bounded by what the data could fill: a Huffman-coded JPEG spends
// at least 1 bit per 8x8 block (2 in a baseline scan), so at most 512 pixels per input byte; the
// check allows 4x that (arithmetic coding, where no such bound holds, is vanishingly rare).
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

void decode_jpeg(const uint8_t* data, size_t size, int scale_denom, bool, int, int, int, int,
                 int64_t max_pixels, std::vector<uint8_t>* out, RegionResult* res) {
  int w = 0, h = 0, subsamp = 0, cs = 0;
  if (tjDecompressHeader3(thread_tj(), data, static_cast<unsigned long>(size), &w, &h, &subsamp,
                          &cs) != 0) {
    decode_error(std::string("corrupt JPEG header: ") + tjGetErrorStr2(thread_tj()));
  }
  check_pixels("JPEG", w, h, max_pixels);
  if (uint64_t{size} * 2048 + 65536 < uint64_t(w) * uint64_t(h)) {
    decode_error("JPEG data (" + std::to_string(size) +
                 " bytes) is too small for its declared size " + std::to_string(w) + "x" +
                 std::to_string(h) + " (truncated file or decompression bomb)");
  }
  const tjscalingfactor sf{1, scale_denom};
  const int sw = TJSCALED(w, sf), sh = TJSCALED(h, sf);
  const bool cmyk = cs == TJCS_CMYK || cs == TJCS_YCCK;
  std::vector<uint8_t> ink(cmyk ? static_cast<size_t>(sw) * sh * 4 : 0);
  out->resize(static_cast<size_t>(sw) * sh * 3);
  if (tjDecompress2(thread_tj(), data, static_cast<unsigned long>(size),
                    cmyk ? ink.data() : out->data(), sw, 0, sh, cmyk ? TJPF_CMYK : TJPF_RGB,
                    TJFLAG_STOPONWARNING) != 0) {
    decode_error(std::string("corrupt JPEG: ") + tjGetErrorStr2(thread_tj()));
  }
  if (cmyk) cmyk_inverted_to_rgb(ink.data(), out->data(), static_cast<size_t>(sw) * sh);
  res->x_offset = res->y_offset = 0;
  res->width = sw;
  res->height = sh;
}
#endif

// ---- PNG

// Deflate encodes at most 258 bytes per 2 bits (1032:1), so IDAT data this many times smaller
// than the declared pixels cannot be a complete image.
constexpr uint64_t kDeflateMaxRatio = 1032;

struct PngHeader {
  uint32_t width = 0, height = 0;
  int bit_depth = 0, color_type = 0;
  uint64_t idat_bytes = 0;  // IDAT payload present in the data (a cut file counts what is there)
};

// Reads IHDR and sums the IDAT chunk lengths by walking the chunk list (no decompression).
PngHeader scan_png(const uint8_t* d, size_t n) {
  if (n < 33 || be32(d + 8) != 13 || std::memcmp(d + 12, "IHDR", 4) != 0) {
    decode_error("corrupt PNG: no IHDR");
  }
  PngHeader h;
  h.width = be32(d + 16);
  h.height = be32(d + 20);
  h.bit_depth = d[24];
  h.color_type = d[25];
  size_t p = 33;
  while (n - p >= 8) {
    const uint64_t len = be32(d + p);
    const bool idat = std::memcmp(d + p + 4, "IDAT", 4) == 0;
    if (std::memcmp(d + p + 4, "IEND", 4) == 0) break;
    const uint64_t avail = n - p - 8;
    if (idat) h.idat_bytes += std::min(len, avail);
    if (len + 4 > avail) break;
    p += 8 + static_cast<size_t>(len) + 4;
  }
  return h;
}

int png_channels(int color_type) {
  switch (color_type) {
    case PNG_COLOR_TYPE_GRAY:
    case PNG_COLOR_TYPE_PALETTE:
      return 1;
    case PNG_COLOR_TYPE_GRAY_ALPHA:
      return 2;
    case PNG_COLOR_TYPE_RGB:
      return 3;
    case PNG_COLOR_TYPE_RGB_ALPHA:
      return 4;
    default:
      return 0;
  }
}

struct PngSource {
  const uint8_t* data;
  size_t size, pos;
  char message[200];
};

void png_error_cb(png_structp png, png_const_charp msg) {
  auto* src = static_cast<PngSource*>(png_get_error_ptr(png));
  std::snprintf(src->message, sizeof(src->message), "%s", msg);
  png_longjmp(png, 1);
}
void png_warning_cb(png_structp, png_const_charp) {}  // ancillary-chunk trouble: Pillow ignores it
void png_read_cb(png_structp png, png_bytep dst, png_size_t len) {
  auto* src = static_cast<PngSource*>(png_get_io_ptr(png));
  if (len > src->size - src->pos) png_error(png, "truncated PNG data");
  std::memcpy(dst, src->data + src->pos, len);
  src->pos += len;
}

template <typename F>
bool png_guarded(png_structp png, F&& f) {
  if (setjmp(png_jmpbuf(png))) return false;
  f();
  return true;
}

class PngDecoder {
 public:
  PngDecoder(const uint8_t* data, size_t size) : src_{data, size, 0, {0}} {
    png = png_create_read_struct(PNG_LIBPNG_VER_STRING, &src_, png_error_cb, png_warning_cb);
    if (png != nullptr) info = png_create_info_struct(png);
    if (png == nullptr || info == nullptr) {
      png_destroy_read_struct(&png, &info, nullptr);
      decode_error("cannot create a PNG decoder");
    }
    png_set_read_fn(png, &src_, png_read_cb);
  }
  ~PngDecoder() { png_destroy_read_struct(&png, &info, nullptr); }
  PngDecoder(const PngDecoder&) = delete;
  PngDecoder& operator=(const PngDecoder&) = delete;
  template <typename F>
  void run(F&& f) {
    if (!png_guarded(png, f)) decode_error(std::string("corrupt PNG: ") + src_.message);
  }
  png_structp png = nullptr;
  png_infop info = nullptr;

 private:
  PngSource src_;
};

// One decoded row (after libpng's palette/bit-depth transforms) to packed RGB.
void png_row_to_rgb(const uint8_t* in, int channels, bool gray16, size_t w, uint8_t* out) {
  if (gray16) {  // Pillow's I;16 -> RGB clips to 255 instead of scaling
    for (size_t x = 0; x < w; ++x) {
      const uint32_t v = be16(in + 2 * x);
      out[3 * x] = out[3 * x + 1] = out[3 * x + 2] = static_cast<uint8_t>(v > 255 ? 255 : v);
    }
    return;
  }
  for (size_t x = 0; x < w; ++x) {
    const uint8_t* p = in + x * static_cast<size_t>(channels);
    if (channels <= 2) {
      out[3 * x] = out[3 * x + 1] = out[3 * x + 2] = p[0];
    } else {
      out[3 * x] = p[0];
      out[3 * x + 1] = p[1];
      out[3 * x + 2] = p[2];
    }
  }
}

void decode_png(const uint8_t* data, size_t size, int64_t max_pixels, RgbImage* out) {
  const PngHeader hdr = scan_png(data, size);
  check_pixels("PNG", hdr.width, hdr.height, max_pixels);
  const int channels = png_channels(hdr.color_type);
  if (channels == 0 || (hdr.bit_depth != 1 && hdr.bit_depth != 2 && hdr.bit_depth != 4 &&
                        hdr.bit_depth != 8 && hdr.bit_depth != 16)) {
    decode_error("corrupt PNG: bad colour type " + std::to_string(hdr.color_type) +
                 " / bit depth " + std::to_string(hdr.bit_depth));
  }
  const uint64_t row_bits = uint64_t{hdr.width} * static_cast<uint64_t>(channels * hdr.bit_depth);
  const uint64_t raw_bytes = (row_bits + 7) / 8 * hdr.height;
  if (hdr.idat_bytes * kDeflateMaxRatio + 4096 < raw_bytes) {
    decode_error("PNG data (" + std::to_string(hdr.idat_bytes) +
                 " bytes of IDAT) is too small for its declared size " + std::to_string(hdr.width) +
                 "x" + std::to_string(hdr.height) + " (truncated file or decompression bomb)");
  }
  PngDecoder dec(data, size);
  png_structp png = dec.png;
  png_infop info = dec.info;
  const bool gray16 = hdr.bit_depth == 16 && hdr.color_type == PNG_COLOR_TYPE_GRAY;
  int passes = 1;
  dec.run([&] {
    png_set_user_limits(png, static_cast<png_uint_32>(kMaxSide),
                        static_cast<png_uint_32>(kMaxSide));
    png_read_info(png, info);
    const int ct = static_cast<int>(png_get_color_type(png, info));
    const int bd = static_cast<int>(png_get_bit_depth(png, info));
    if (ct == PNG_COLOR_TYPE_PALETTE) png_set_palette_to_rgb(png);
    if (ct == PNG_COLOR_TYPE_GRAY && bd < 8) png_set_expand_gray_1_2_4_to_8(png);
    if (bd == 16 && !gray16) png_set_strip_16(png);  // Pillow's ;16B raw modes keep the high byte
    passes = png_set_interlace_handling(png);
    png_read_update_info(png, info);
  });
  const size_t w = png_get_image_width(png, info), h = png_get_image_height(png, info);
  if (w != hdr.width || h != hdr.height) decode_error("corrupt PNG: inconsistent IHDR");
  const int out_channels = png_get_channels(png, info);
  const size_t rowbytes = png_get_rowbytes(png, info);
  if (rowbytes < w * static_cast<size_t>(out_channels) * (gray16 ? 2 : 1)) {
    decode_error("corrupt PNG: unexpected row layout");
  }
  const size_t stride = w * 3;
  out->width = static_cast<int>(w);
  out->height = static_cast<int>(h);
  if (passes == 1) {
    std::vector<uint8_t> row(rowbytes);
    RowGrower grow(&out->pixels, stride, h, size);
    for (size_t y = 0; y < h; ++y) {
      uint8_t* dst = grow.row(y);
      png_bytep rp = row.data();
      dec.run([&] { png_read_row(png, rp, nullptr); });
      png_row_to_rgb(row.data(), out_channels, gray16, w, dst);
    }
    grow.finish(h);
    return;
  }
  // Interlaced: every pass touches the whole image, so it is decoded at once; the IDAT bound
  // above keeps this allocation within what the data could fill.
  std::vector<uint8_t> all(rowbytes * h);
  std::vector<png_bytep> rows(h);
  for (size_t y = 0; y < h; ++y) rows[y] = all.data() + y * rowbytes;
  png_bytepp rp = rows.data();
  dec.run([&] { png_read_image(png, rp); });
  out->pixels.resize(stride * h);
  for (size_t y = 0; y < h; ++y) {
    png_row_to_rgb(rows[y], out_channels, gray16, w, out->pixels.data() + y * stride);
  }
}

}  // namespace detail

using namespace detail;

ImageFormat detect_image_format(const uint8_t* data, size_t size) {
  if (size >= 3 && data[0] == 0xFF && data[1] == 0xD8 && data[2] == 0xFF) return ImageFormat::kJpeg;
  static const uint8_t kPng[8] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1A, '\n'};
  if (size >= 8 && std::memcmp(data, kPng, 8) == 0) return ImageFormat::kPng;
  return ImageFormat::kUnknown;
}

bool jpeg_supported() { return TORCHSPEED_WITH_JPEG != 0; }

void probe_image(const uint8_t* data, size_t size, int* width, int* height, int64_t max_pixels) {
  switch (detect_image_format(data, size)) {
    case ImageFormat::kJpeg:
#if TORCHSPEED_WITH_JPEG
      scan_jpeg_sof(data, size, width, height);
      check_pixels("JPEG", *width, *height, max_pixels);
      return;
#else
      decode_error(kJpegNotBuilt);
#endif
    case ImageFormat::kPng: {
      const PngHeader h = scan_png(data, size);
      check_pixels("PNG", h.width, h.height, max_pixels);
      *width = static_cast<int>(h.width);
      *height = static_cast<int>(h.height);
      return;
    }
    default:
      decode_error("unknown image format (not JPEG or PNG)");
  }
}

void decode_image(const uint8_t* data, size_t size, int scale_denom, RgbImage* out,
                  int64_t max_pixels) {
  const ImageFormat fmt = detect_image_format(data, size);
  if (fmt == ImageFormat::kJpeg) {
    if (scale_denom != 1 && scale_denom != 2 && scale_denom != 4 && scale_denom != 8) {
      throw std::invalid_argument("torchspeed.data.decode: scale_denom must be 1, 2, 4 or 8, got " +
                                  std::to_string(scale_denom));
    }
#if TORCHSPEED_WITH_JPEG
    RegionResult rr;
    decode_jpeg(data, size, scale_denom, true, 0, 0, 0, 0, max_pixels, &out->pixels, &rr);
    out->width = rr.width;
    out->height = rr.height;
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
    decode_png(data, size, max_pixels, out);
    return;
  }
  decode_error("unknown image format (not JPEG or PNG)");
}

}  // namespace torchspeed::data
