// One side of the resampler A/B (bench/ab_resampler.sh): compiled once against the current tree
// and once against an older one, each inside its own namespace (-Dtorchspeed=<side>), and called
// through these plain C entry points.
#include <cstddef>
#include <cstdint>
#include <vector>

#include AB_IMAGE_HEADER

#ifndef AB_SIDE
#error "AB_SIDE must name the side (ab_old or ab_new)"
#endif
#define AB_CAT2(a, b) a##b
#define AB_CAT(a, b) AB_CAT2(a, b)

extern "C" void AB_CAT(AB_SIDE, _resample)(const uint8_t* src, int src_w, int src_h, int dst_w,
                                           int dst_h, uint8_t* out) {
  const float box[4] = {0.f, 0.f, static_cast<float>(src_w), static_cast<float>(src_h)};
  torchspeed::data::resample_bilinear(src, src_w, src_h, box, dst_w, dst_h, 0, 0, dst_w, dst_h,
                                      out);
}

extern "C" void AB_CAT(AB_SIDE, _process)(const uint8_t* jpeg, size_t size, int out_side,
                                          uint64_t index, uint8_t* out) {
  torchspeed::data::ImageTransformOptions o;
  o.mode = torchspeed::data::CropMode::kRandomResizedCrop;
  o.width = o.height = out_side;
  o.flip_prob = 0.5;
  torchspeed::data::process_image(jpeg, size, o, /*seed=*/1, /*epoch=*/0, index, out, nullptr);
}
