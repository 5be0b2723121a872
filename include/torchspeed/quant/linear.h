// torchspeed::quant::Int8Linear: a torch::nn module with an int8 weight (per output channel,
// symmetric), its float32 scale and a float32 bias as buffers; forward quantizes x per row and
// runs torchspeed::int8_linear (exact int32 sums, fused fp32 epilogue). Inference only.
//
//   torch::nn::Linear lin(torch::nn::LinearOptions(512, 256));
//   auto q = torchspeed::quant::from_float(lin);     // or Int8Linear(Int8LinearOptions(512, 256))
//   torch::NoGradGuard no_grad;
//   auto y = q->forward(x);                          // x float32 / bfloat16 / float16 [..., 512]
//
// On CPU the weight is packed once for the current int8 path (cpu_int8_path()) and the packed
// buffer cached (rebuilt when the weight, its device or the path changes); it is not a buffer, so
// the module's state stays the portable int8 [out, in] weight.
#pragma once

#include <torch/nn/cloneable.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/pimpl.h>

#include <cstdint>
#include <string>

#include "torchspeed/export.h"

namespace torchspeed::quant {

struct TORCHSPEED_API Int8LinearOptions {
  Int8LinearOptions(int64_t in_features, int64_t out_features);
  TORCH_ARG(int64_t, in_features);
  TORCH_ARG(int64_t, out_features);
  TORCH_ARG(bool, bias) = true;
  /// Fuse a ReLU (x < 0 ? 0 : x) into the epilogue.
  TORCH_ARG(bool, relu) = false;
};

class TORCHSPEED_API Int8LinearImpl : public torch::nn::Cloneable<Int8LinearImpl> {
 public:
  explicit Int8LinearImpl(const Int8LinearOptions& options);
  Int8LinearImpl(int64_t in_features, int64_t out_features)
      : Int8LinearImpl(Int8LinearOptions(in_features, out_features)) {}

  void reset() override;
  void pretty_print(std::ostream& stream) const override;
  /// x: [..., in_features], float32 / bfloat16 / float16; the result has x's dtype.
  at::Tensor forward(const at::Tensor& x);
  /// Sets weight / weight_scale from a float weight [out, in] (per-channel symmetric int8).
  void set_float_weight(const at::Tensor& w);

  Int8LinearOptions options;
  at::Tensor weight;        // int8 [out, in]
  at::Tensor weight_scale;  // float32 [out]
  at::Tensor bias;          // float32 [out], undefined without bias

 private:
  at::Tensor packed_;
  std::string packed_key_;
};
TORCH_MODULE(Int8Linear);

/// An Int8Linear quantizing `linear`'s weight per output channel (bias kept in float32).
TORCHSPEED_API Int8Linear from_float(const torch::nn::Linear& linear, bool relu = false);

}  // namespace torchspeed::quant
