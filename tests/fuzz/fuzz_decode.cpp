// libFuzzer target: the image decode + transform entry (JPEG/PNG) and the .npy header parser.
#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <vector>

#include "data/image.h"
#include "data/npy.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace torchspeed::data;
  if (size < 1) return 0;
  ImageTransformOptions opt;
  opt.height = 24;
  opt.width = 32;
  opt.flip_prob = 0.5;
  // The first byte picks the crop mode and output type, so all paths get exercised.
  const uint8_t sel = data[0];
  opt.mode = static_cast<CropMode>(sel & 3);
  opt.resize_size = 32;
  opt.to_float = (sel & 4) != 0;
  opt.channels_last = (sel & 8) != 0;
  opt.decode_scaling = (sel & 16) != 0 ? DecodeScaling::kFast : DecodeScaling::kAccurate;
  // Small pixel limit: keeps allocations well under libFuzzer's RSS limit (bombs are refused).
  opt.max_image_pixels = int64_t{1} << 22;
  std::vector<uint8_t> out(image_output_bytes(opt));
  try {
    process_image(data + 1, size - 1, opt, sel, 1, 2, out.data());
  } catch (const std::runtime_error&) {
  } catch (const std::invalid_argument&) {
  }
  try {
    const NpyArray a = parse_npy(data, size, "fuzz.npy");
    if (a.data_offset > size || a.data_bytes > size - a.data_offset) __builtin_trap();
  } catch (const std::invalid_argument&) {
  }
  return 0;
}
