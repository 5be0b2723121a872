// Decodes the image file argv[1] with the torch-free decoder compiled as TORCHSPEED_WITH_JPEG=OFF
// builds it (TORCHSPEED_WITH_JPEG=0); prints the error and exits 3 when decode throws, 0 on
// success.
#include <cstdio>
#include <fstream>
#include <iterator>
#include <stdexcept>
#include <vector>

#include "data/image.h"

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s IMAGE\n", argv[0]);
    return 2;
  }
  std::ifstream f(argv[1], std::ios::binary);
  const std::vector<uint8_t> bytes((std::istreambuf_iterator<char>(f)),
                                   std::istreambuf_iterator<char>());
  std::printf("jpeg_supported=%d\n", torchspeed::data::jpeg_supported() ? 1 : 0);
  try {
    torchspeed::data::RgbImage img;
    torchspeed::data::decode_image(bytes.data(), bytes.size(), 1, &img);
    std::printf("decoded %dx%d\n", img.width, img.height);
  } catch (const std::exception& e) {
    std::printf("error: %s\n", e.what());
    return 3;
  }
  return 0;
}
