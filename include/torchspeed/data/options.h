// Torch-free option and statistics structs of the torchspeed data loader (shared by core and
// Loader).
#pragma once

#include <array>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <utility>

#include "torchspeed/export.h"

namespace torchspeed::data {

// How an image field is turned into a fixed-size output.
//  kRandomResizedCrop: torchvision RandomResizedCrop(size=(height, width), scale, ratio).
//  kResizeCenterCrop:  Resize(resize_size) of the shorter side, then CenterCrop((height, width)).
//  kResize:            Resize to exactly (height, width).
//  kNone:              the decoded image must already be (height, width).
enum class CropMode { kNone, kResize, kResizeCenterCrop, kRandomResizedCrop };

// JPEG decode-time downscaling (libjpeg-turbo's 1/2, 1/4, 1/8 scaled IDCT). The scaled IDCT is a
// different low-pass than the antialiased bilinear resample a full decode gets, so it only
// stays faithful while the final resample still shrinks a lot.
//  kOff:      always decode at full size (pixels equal Pillow/torchvision given the same draws).
//  kAccurate: scale only while the decoded crop stays >= 4x the output on both axes; within 1
//             level mean absolute difference per image of a full decode even on noise textures.
//  kFast:     scale whenever the decoded crop stays >= the output (up to ~7 levels mean, 50 max
//             on textured images; pixels then follow PIL's Image.draft instead of a full decode).
enum class DecodeScaling { kOff, kAccurate, kFast };

// The names Python uses for these ("random_resized_crop", "resize_center_crop", "resize", "none";
// "accurate", "fast", "off"), and back: an unknown name throws std::invalid_argument listing the
// valid ones.
TORCHSPEED_API const char* crop_mode_name(CropMode mode);
TORCHSPEED_API CropMode parse_crop_mode(const std::string& name);
TORCHSPEED_API const char* decode_scaling_name(DecodeScaling scaling);
TORCHSPEED_API DecodeScaling parse_decode_scaling(const std::string& name);

// Thrown by long-running calls (indexing a shard, waiting for a batch) when their `should_stop`
// hook returns true, e.g. on Ctrl-C.
class TORCHSPEED_API Cancelled : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// Pillow's error threshold (2 * PIL.Image.MAX_IMAGE_PIXELS): larger images are decompression
// bombs unless the limit is raised.
constexpr int64_t kDefaultMaxImagePixels = 178956970;

struct ImageTransformOptions {
  CropMode mode = CropMode::kRandomResizedCrop;
  int height = 224;
  int width = 224;
  int resize_size = 256;  // only for kResizeCenterCrop (shorter side)
  std::pair<double, double> scale{0.08, 1.0};
  std::pair<double, double> ratio{3.0 / 4.0, 4.0 / 3.0};
  double flip_prob = 0.0;  // horizontal flip probability
  DecodeScaling decode_scaling = DecodeScaling::kAccurate;
  // Images with more pixels are refused before anything is allocated; 0 = no limit.
  int64_t max_image_pixels = kDefaultMaxImagePixels;
  bool to_float = false;   // float32 in [0, 1] (then normalized if normalize) instead of uint8
  bool normalize = false;  // (x - mean) / std, implies to_float
  std::array<float, 3> mean{0.485f, 0.456f, 0.406f};
  std::array<float, 3> std{0.229f, 0.224f, 0.225f};
  bool channels_last = false;  // HWC per sample (NHWC batch) instead of CHW
};

// Counters of a Loader; all times are summed over worker threads in seconds.
struct LoaderStats {
  int64_t batches = 0;            // batches handed to the consumer
  int64_t samples = 0;            // samples handed to the consumer
  int64_t skipped = 0;            // samples skipped with on_error="skip"
  double elapsed_s = 0;           // wall time since the current epoch started
  double samples_per_s = 0;       // samples delivered in the current epoch / elapsed_s
  double read_s = 0;              // fetching bytes (tar member, npy rows)
  double decode_s = 0;            // JPEG/PNG/npy decode
  double transform_s = 0;         // crop, resize, flip, normalize
  double collate_s = 0;           // writing rows into the batch slot (gathers, label writes)
  double copy_s = 0;              // device copies issued by the consumer
  double consumer_wait_s = 0;     // time next() blocked waiting for a batch
  double mean_ready_batches = 0;  // average number of finished batches waiting at each next()
  int64_t ready_batches = 0;      // finished batches waiting right now
  int64_t slots = 0;              // batch slots in the ring
  std::string last_error;         // last skipped sample's error message
};

}  // namespace torchspeed::data
