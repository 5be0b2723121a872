// Catch2 tests of decode (JPEG/PNG), Pillow-style resampling, draws and the stored output layout.
#include <cmath>
#include <map>
#include <string>

#include "catch_shim.h"
#include "data/image.h"
#include "data/sampling.h"
#include "data_test_utils.h"

using namespace torchspeed::data;
using namespace torchspeed::data::testing;

namespace {

// Floating-point reference of Pillow's bilinear resample (same taps, no fixed point): the
// fixed-point implementation must agree within 1.
std::vector<double> reference_resample(const std::vector<uint8_t>& src, int sw, int sh,
                                       const double box[4], int dw, int dh) {
  auto weights = [](int in_size, double in0, double in1, int out_size) {
    std::vector<std::map<int, double>> w(static_cast<size_t>(out_size));
    const double scale = (in1 - in0) / out_size;
    const double fs = std::max(scale, 1.0);
    for (int o = 0; o < out_size; ++o) {
      const double center = in0 + (o + 0.5) * scale;
      double total = 0;
      const int lo = std::max(0, static_cast<int>(center - fs + 0.5));
      const int hi = std::min(in_size, static_cast<int>(center + fs + 0.5));
      for (int i = lo; i < hi; ++i) {
        const double t = std::fabs((i - center + 0.5) / fs);
        const double v = t < 1 ? 1 - t : 0;
        w[static_cast<size_t>(o)][i] = v;
        total += v;
      }
      for (auto& kv : w[static_cast<size_t>(o)]) kv.second /= total;
    }
    return w;
  };
  const auto wx = weights(sw, box[0], box[2], dw);
  const auto wy = weights(sh, box[1], box[3], dh);
  std::vector<double> out(static_cast<size_t>(dw) * dh * 3);
  for (int y = 0; y < dh; ++y) {
    for (int x = 0; x < dw; ++x) {
      for (int c = 0; c < 3; ++c) {
        double s = 0;
        for (const auto& ky : wy[static_cast<size_t>(y)]) {
          double row = 0;
          for (const auto& kx : wx[static_cast<size_t>(x)]) {
            row += kx.second * src[(static_cast<size_t>(ky.first) * sw + kx.first) * 3 + c];
          }
          // Pillow rounds the horizontal pass to uint8 before the vertical pass.
          row = std::min(255.0, std::max(0.0, std::floor(row + 0.5)));
          s += ky.second * row;
        }
        out[(static_cast<size_t>(y) * dw + x) * 3 + c] = s;
      }
    }
  }
  return out;
}

}  // namespace

TEST_CASE("PNG decode is lossless (RGB and RGBA drops alpha)", "[data][image]") {
  const int w = 37, h = 23;
  const auto px = textured_rgb(w, h, 5);
  const std::string png = encode_png(px, w, h);
  REQUIRE(detect_image_format(bytes(png), png.size()) == ImageFormat::kPng);
  int pw = 0, ph = 0;
  probe_image(bytes(png), png.size(), &pw, &ph);
  CHECK(pw == w);
  CHECK(ph == h);
  RgbImage img;
  decode_image(bytes(png), png.size(), 1, &img);
  CHECK(img.width == w);
  CHECK(img.height == h);
  CHECK(img.pixels == px);

  std::vector<uint8_t> rgba(static_cast<size_t>(w) * h * 4);
  for (size_t i = 0; i < static_cast<size_t>(w) * h; ++i) {
    for (int c = 0; c < 3; ++c) rgba[4 * i + c] = px[3 * i + c];
    rgba[4 * i + 3] = static_cast<uint8_t>(i * 7);
  }
  const std::string png4 = encode_png(rgba, w, h, true);
  decode_image(bytes(png4), png4.size(), 1, &img);
  CHECK(img.pixels == px);
}

#if TORCHSPEED_WITH_JPEG
TEST_CASE("JPEG decode matches the source within JPEG error; scaled decode sizes",
          "[data][image]") {
  const int w = 500, h = 375;
  const auto px = textured_rgb(w, h, 9);
  const std::string jpg = encode_jpeg(px, w, h, 100, TJSAMP_444);
  RgbImage img;
  decode_image(bytes(jpg), jpg.size(), 1, &img);
  REQUIRE(img.width == w);
  REQUIRE(img.height == h);
  double sum = 0;
  int maxd = 0;
  for (size_t i = 0; i < px.size(); ++i) {
    const int d = std::abs(int{img.pixels[i]} - int{px[i]});
    sum += d;
    maxd = std::max(maxd, d);
  }
  CHECK(sum / px.size() < 1.5);  // q100 4:4:4: mean error about 0.5
  CHECK(maxd <= 12);
  for (int f : {2, 4, 8}) {
    decode_image(bytes(jpg), jpg.size(), f, &img);
    CHECK(img.width == (w + f - 1) / f);
    CHECK(img.height == (h + f - 1) / f);
  }
}

TEST_CASE("corrupt and truncated JPEGs throw", "[data][image]") {
  const auto px = textured_rgb(64, 48, 1);
  const std::string jpg = encode_jpeg(px, 64, 48, 90);
  RgbImage img;
  const std::string truncated = jpg.substr(0, jpg.size() / 2);
  CHECK_THROWS_WITH(decode_image(bytes(truncated), truncated.size(), 1, &img),
                    Catch::Contains("corrupt JPEG"));
  std::string garbage = jpg.substr(0, 4) + std::string(200, '\x55');
  CHECK_THROWS(decode_image(bytes(garbage), garbage.size(), 1, &img));
  const std::string not_image = "hello world";
  CHECK_THROWS_WITH(decode_image(bytes(not_image), not_image.size(), 1, &img),
                    Catch::Contains("unknown image format"));
}
#endif

TEST_CASE("bilinear resample agrees with a floating-point reference of Pillow's filter",
          "[data][image]") {
  const int sw = 61, sh = 47;
  const auto px = textured_rgb(sw, sh, 3);
  struct Case {
    double box[4];
    int dw, dh;
  };
  const Case cases[] = {{{0, 0, 61, 47}, 20, 15},
                        {{0, 0, 61, 47}, 61, 47},
                        {{0, 0, 61, 47}, 90, 70},
                        {{3, 5, 40, 30}, 24, 24},
                        {{0.5, 1.25, 60.75, 46.5}, 17, 33}};
  for (const auto& cs : cases) {
    const float box[4] = {static_cast<float>(cs.box[0]), static_cast<float>(cs.box[1]),
                          static_cast<float>(cs.box[2]), static_cast<float>(cs.box[3])};
    std::vector<uint8_t> out(static_cast<size_t>(cs.dw) * cs.dh * 3);
    resample_bilinear(px.data(), sw, sh, box, cs.dw, cs.dh, 0, 0, cs.dw, cs.dh, out.data());
    const auto ref = reference_resample(px, sw, sh, cs.box, cs.dw, cs.dh);
    double maxd = 0;
    for (size_t i = 0; i < out.size(); ++i) maxd = std::max(maxd, std::fabs(out[i] - ref[i]));
    INFO("case " << cs.dw << "x" << cs.dh);
    // Fixed-point weights can move a uint8 intermediate by 1, plus the final rounding: <= 1.5.
    CHECK(maxd <= 1.5);
    // A window computes exactly the same pixels as the full output.
    const int wx = cs.dw / 3, wy = cs.dh / 4, ww = cs.dw / 2, wh = cs.dh / 2;
    std::vector<uint8_t> win(static_cast<size_t>(ww) * wh * 3);
    resample_bilinear(px.data(), sw, sh, box, cs.dw, cs.dh, wx, wy, ww, wh, win.data());
    bool same = true;
    for (int y = 0; y < wh; ++y) {
      for (int x = 0; x < ww * 3; ++x) {
        same &= win[static_cast<size_t>(y) * ww * 3 + x] ==
                out[static_cast<size_t>(y + wy) * cs.dw * 3 + static_cast<size_t>(wx) * 3 + x];
      }
    }
    CHECK(same);
  }
  // Same size, zero box: identity.
  std::vector<uint8_t> same(px.size());
  const float full[4] = {0, 0, static_cast<float>(sw), static_cast<float>(sh)};
  resample_bilinear(px.data(), sw, sh, full, sw, sh, 0, 0, sw, sh, same.data());
  CHECK(same == px);
}

TEST_CASE("RandomResizedCrop draws: deterministic, in bounds, within scale and ratio",
          "[data][image]") {
  ImageTransformOptions o;
  o.flip_prob = 0.5;
  int flips = 0;
  for (uint64_t i = 0; i < 4000; ++i) {
    const ImageDraw a = draw_image_params(o, 500, 375, true, 42, 3, i);
    const ImageDraw b = draw_image_params(o, 500, 375, true, 42, 3, i);
    REQUIRE(a.crop_top == b.crop_top);
    REQUIRE(a.crop_left == b.crop_left);
    REQUIRE(a.crop_width == b.crop_width);
    REQUIRE(a.flip == b.flip);
    REQUIRE(a.crop_left >= 0);
    REQUIRE(a.crop_top >= 0);
    REQUIRE(a.crop_left + a.crop_width <= 500);
    REQUIRE(a.crop_top + a.crop_height <= 375);
    const double frac = double(a.crop_width) * a.crop_height / (500.0 * 375.0);
    REQUIRE(frac >= 0.07);
    const double ratio = double(a.crop_width) / a.crop_height;
    REQUIRE(ratio >= 0.70);
    REQUIRE(ratio <= 1.40);
    // Decode scaling only when the crop keeps at least the output size.
    if (a.scale_denom > 1) {
      REQUIRE(a.crop_width >= 224 * a.scale_denom);
      REQUIRE(a.crop_height >= 224 * a.scale_denom);
    }
    flips += a.flip;
  }
  CHECK(flips > 1800);
  CHECK(flips < 2200);
  const ImageDraw e0 = draw_image_params(o, 500, 375, true, 42, 0, 7);
  const ImageDraw e1 = draw_image_params(o, 500, 375, true, 42, 1, 7);
  CHECK((e0.crop_left != e1.crop_left || e0.crop_top != e1.crop_top ||
         e0.crop_width != e1.crop_width));
}

TEST_CASE("Resize+CenterCrop sizes follow torchvision", "[data][image]") {
  ImageTransformOptions o;
  o.mode = CropMode::kResizeCenterCrop;
  o.resize_size = 256;
  const ImageDraw d = draw_image_params(o, 500, 375, false, 0, 0, 0);
  CHECK(d.resize_height == 256);
  CHECK(d.resize_width == 341);  // int(256 * 500 / 375)
  const ImageDraw t = draw_image_params(o, 300, 600, false, 0, 0, 0);
  CHECK(t.resize_width == 256);
  CHECK(t.resize_height == 512);
}

TEST_CASE("output store: flip, CHW/HWC, float normalize", "[data][image]") {
  const int w = 8, h = 6;
  const auto px = textured_rgb(w, h, 11);
  const std::string png = encode_png(px, w, h);
  ImageTransformOptions o;
  o.mode = CropMode::kNone;
  o.width = w;
  o.height = h;
  o.flip_prob = 1.0;
  std::vector<uint8_t> chw(image_output_bytes(o));
  process_image(bytes(png), png.size(), o, 1, 0, 0, chw.data());
  o.channels_last = true;
  std::vector<uint8_t> hwc(image_output_bytes(o));
  process_image(bytes(png), png.size(), o, 1, 0, 0, hwc.data());
  o.normalize = true;
  o.channels_last = false;
  std::vector<float> fl(image_output_bytes(o) / 4);
  process_image(bytes(png), png.size(), o, 1, 0, 0, fl.data());
  bool ok = true;
  for (int y = 0; y < h; ++y) {
    for (int x = 0; x < w; ++x) {
      for (int c = 0; c < 3; ++c) {
        const uint8_t v = px[(static_cast<size_t>(y) * w + (w - 1 - x)) * 3 + c];
        ok &= chw[(static_cast<size_t>(c) * h + y) * w + x] == v;
        ok &= hwc[(static_cast<size_t>(y) * w + x) * 3 + c] == v;
        const float expect = (static_cast<float>(v) / 255.0f - o.mean[c]) / o.std[c];
        ok &= fl[(static_cast<size_t>(c) * h + y) * w + x] == expect;
      }
    }
  }
  CHECK(ok);
  ImageTransformOptions wrong = o;
  wrong.width = 9;
  std::vector<float> buf(image_output_bytes(wrong) / 4);
  CHECK_THROWS_WITH(process_image(bytes(png), png.size(), wrong, 1, 0, 0, buf.data()),
                    Catch::Contains("expected 6x9"));
}

TEST_CASE("epoch order: seeded permutation, distributed pad and drop", "[data][sampling]") {
  const auto a = epoch_indices(103, true, 7, 0, 0, 1, false);
  const auto b = epoch_indices(103, true, 7, 0, 0, 1, false);
  const auto c = epoch_indices(103, true, 7, 1, 0, 1, false);
  CHECK(a == b);
  CHECK(a != c);
  auto sorted = a;
  std::sort(sorted.begin(), sorted.end());
  for (int64_t i = 0; i < 103; ++i) REQUIRE(sorted[static_cast<size_t>(i)] == i);
  CHECK(epoch_indices(5, false, 7, 0, 0, 1, false) == std::vector<int64_t>{0, 1, 2, 3, 4});

  // Pad: 4 ranks x 26 = 104 = all 103 samples + the first one again.
  std::vector<int64_t> all;
  for (int r = 0; r < 4; ++r) {
    const auto part = epoch_indices(103, true, 7, 0, r, 4, false);
    CHECK(part.size() == 26);
    all.insert(all.end(), part.begin(), part.end());
  }
  std::sort(all.begin(), all.end());
  CHECK(std::unique(all.begin(), all.end()) - all.begin() == 103);
  // Drop: 4 x 25 distinct samples.
  std::vector<int64_t> dropped;
  for (int r = 0; r < 4; ++r) {
    const auto part = epoch_indices(103, true, 7, 0, r, 4, true);
    CHECK(part.size() == 25);
    dropped.insert(dropped.end(), part.begin(), part.end());
  }
  std::sort(dropped.begin(), dropped.end());
  CHECK(std::unique(dropped.begin(), dropped.end()) - dropped.begin() == 100);
  CHECK_THROWS(epoch_indices(10, false, 0, 0, 4, 4, false));
  CHECK(batch_count(10, 3, false) == 4);
  CHECK(batch_count(10, 3, true) == 3);
}

namespace {
std::string be32s(uint32_t v) {
  return std::string{static_cast<char>(v >> 24), static_cast<char>(v >> 16),
                     static_cast<char>(v >> 8), static_cast<char>(v)};
}
// A PNG whose IHDR declares w x h RGB but whose IDAT holds only `idat` (CRCs are not checked
// before the size checks under test).
std::string png_with_ihdr(uint32_t w, uint32_t h, const std::string& idat) {
  std::string ihdr = be32s(w) + be32s(h) + std::string("\x08\x02\x00\x00\x00", 5);
  auto chunk = [](const std::string& type, const std::string& body) {
    return be32s(static_cast<uint32_t>(body.size())) + type + body + be32s(0);
  };
  return std::string("\x89PNG\r\n\x1a\n", 8) + chunk("IHDR", ihdr) + chunk("IDAT", idat) +
         chunk("IEND", "");
}
}  // namespace

TEST_CASE("decompression bombs are refused before allocating", "[data][image]") {
  RgbImage img;
  const std::string bomb = png_with_ihdr(16384, 16384, std::string("\x78\x9c\x63\x60", 4));
  CHECK_THROWS_WITH(decode_image(bytes(bomb), bomb.size(), 1, &img),
                    Catch::Contains("exceeds max_image_pixels=178956970"));
  CHECK_THROWS_WITH(decode_image(bytes(bomb), bomb.size(), 1, &img, 0),
                    Catch::Contains("too small for its declared size"));
  CHECK(img.pixels.capacity() < (size_t{64} << 20));
  int w = 0, h = 0;
  CHECK_THROWS_WITH(probe_image(bytes(bomb), bomb.size(), &w, &h, 1000),
                    Catch::Contains("16384x16384"));
  // The limit is configurable per image.
  const auto px = textured_rgb(40, 30, 2);
  const std::string png = encode_png(px, 40, 30);
  CHECK_THROWS_WITH(decode_image(bytes(png), png.size(), 1, &img, 1199),
                    Catch::Contains("exceeds max_image_pixels=1199"));
  decode_image(bytes(png), png.size(), 1, &img, 1200);
  CHECK(img.pixels == px);
  ImageTransformOptions o;
  o.max_image_pixels = -1;
  CHECK_THROWS_AS(validate_transform_options(o), std::invalid_argument);
#if TORCHSPEED_WITH_JPEG
  std::string jpg = encode_jpeg(textured_rgb(16, 16, 1), 16, 16, 50);
  const size_t sof = jpg.find("\xff\xc0");
  REQUIRE(sof != std::string::npos);
  jpg[sof + 5] = static_cast<char>(16000 >> 8);
  jpg[sof + 6] = static_cast<char>(16000 & 255);
  jpg[sof + 7] = static_cast<char>(16000 >> 8);
  jpg[sof + 8] = static_cast<char>(16000 & 255);
  CHECK_THROWS_WITH(decode_image(bytes(jpg), jpg.size(), 1, &img), Catch::Contains("16000x16000"));
  RgbImage fresh;
  CHECK_THROWS_WITH(decode_image(bytes(jpg), jpg.size(), 1, &fresh, 0),
                    Catch::Contains("corrupt JPEG"));
  CHECK(fresh.pixels.capacity() < (size_t{64} << 20));  // rows grow only as data decodes
#endif
}

#if TORCHSPEED_WITH_JPEG
TEST_CASE("CMYK/YCCK JPEG decodes to RGB with Adobe inverted ink", "[data][image]") {
  const int w = 48, h = 32;
  const auto rgb = textured_rgb(w, h, 4);
  // Stored ink values s: the picture Pillow shows is R = s_k * s_c / 255 (inverted CMYK).
  std::vector<uint8_t> ink(static_cast<size_t>(w) * h * 4);
  for (size_t i = 0; i < static_cast<size_t>(w) * h; ++i) {
    for (int c = 0; c < 3; ++c) ink[4 * i + c] = rgb[3 * i + c];
    ink[4 * i + 3] = static_cast<uint8_t>(200 + i % 56);
  }
  tjhandle t = tjInitCompress();
  unsigned char* buf = nullptr;
  unsigned long len = 0;
  // TurboJPEG writes CMYK input as a YCCK JPEG.
  REQUIRE(tjCompress2(t, ink.data(), w, 0, h, TJPF_CMYK, &buf, &len, TJSAMP_444, 95, 0) == 0);
  const std::string jpg(reinterpret_cast<char*>(buf), len);
  tjFree(buf);
  tjDestroy(t);
  RgbImage img;
  decode_image(bytes(jpg), jpg.size(), 1, &img);
  REQUIRE(img.width == w);
  REQUIRE(img.height == h);
  double sum = 0;
  for (size_t i = 0; i < static_cast<size_t>(w) * h; ++i) {
    for (int c = 0; c < 3; ++c) {
      const double expect = ink[4 * i + 3] * (ink[4 * i + c] / 255.0);
      sum += std::fabs(img.pixels[3 * i + c] - expect);
    }
  }
  // The texture carries +-20 noise, so q95 costs about 3 levels; a wrong conversion costs >40.
  CHECK(sum / (static_cast<double>(w) * h * 3) < 5.0);
}
#endif
