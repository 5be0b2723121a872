// torchspeed::quant::Int8Linear (include/torchspeed/quant/linear.h): buffers, the per-channel
// weight quantization (the formula of python/torchspeed/quant/linear.py), the packed-weight cache.
#include "torchspeed/quant/linear.h"

#include <torch/torch.h>

#include <sstream>

#include "torchspeed/ops/quant.h"

namespace torchspeed::quant {

Int8LinearOptions::Int8LinearOptions(int64_t in_features, int64_t out_features)
    : in_features_(in_features), out_features_(out_features) {}

Int8LinearImpl::Int8LinearImpl(const Int8LinearOptions& options_) : options(options_) { reset(); }

void Int8LinearImpl::reset() {
  TORCH_CHECK(options.in_features() >= 1 && options.out_features() >= 1,
              "torchspeed.quant.Int8Linear: in_features and out_features must be >= 1, got ",
              options.in_features(), " and ", options.out_features());
  weight = register_buffer(
      "weight", torch::zeros({options.out_features(), options.in_features()}, torch::kChar));
  weight_scale = register_buffer("weight_scale", torch::ones({options.out_features()}));
  if (options.bias()) bias = register_buffer("bias", torch::zeros({options.out_features()}));
  packed_ = at::Tensor();
  packed_key_.clear();
}

void Int8LinearImpl::set_float_weight(const at::Tensor& w) {
  TORCH_CHECK(
      w.dim() == 2 && w.size(0) == options.out_features() && w.size(1) == options.in_features(),
      "torchspeed.quant.Int8Linear: the float weight must be [", options.out_features(), ", ",
      options.in_features(), "], got ", w.sizes());
  torch::NoGradGuard no_grad;
  const auto wf = w.detach().to(torch::kFloat);
  const auto absmax = wf.abs().amax(1);
  const auto scale = torch::where(absmax == 0, torch::ones_like(absmax), absmax / 127.0);
  const auto q = torch::clamp(torch::round(wf * (1.0 / scale).unsqueeze(1)), -127, 127);
  weight.copy_(q.to(torch::kChar));
  weight_scale.copy_(scale);
}

at::Tensor Int8LinearImpl::forward(const at::Tensor& x) {
  TORCH_CHECK(!(x.requires_grad() && torch::GradMode::is_enabled()),
              "torchspeed.quant.Int8Linear is inference-only (no gradient through the int8 "
              "kernels): run it under torch::NoGradGuard, or detach x");
  at::Tensor w = weight;
  if (weight.device().is_cpu()) {
    std::ostringstream key;
    key << cpu_int8_path() << '/' << weight.data_ptr() << '/' << weight._version();
    if (!packed_.defined() || packed_key_ != key.str()) {
      packed_ = int8_pack_weight(weight.contiguous());
      packed_key_ = key.str();
    }
    w = packed_;
  }
  return int8_linear(x.contiguous(), w, weight_scale,
                     bias.defined() ? std::optional<at::Tensor>(bias) : std::nullopt,
                     options.relu());
}

void Int8LinearImpl::pretty_print(std::ostream& stream) const {
  stream << "torchspeed::quant::Int8Linear(in_features=" << options.in_features()
         << ", out_features=" << options.out_features() << ", bias=" << options.bias()
         << ", relu=" << options.relu()
         << ", int8_path=" << (weight.device().is_cpu() ? cpu_int8_path() : weight.device().str())
         << ")";
}

Int8Linear from_float(const torch::nn::Linear& linear, bool relu) {
  const auto& o = linear->options;
  Int8Linear m(Int8LinearOptions(o.in_features(), o.out_features()).bias(o.bias()).relu(relu));
  m->to(linear->weight.device());
  m->set_float_weight(linear->weight);
  if (o.bias()) {
    torch::NoGradGuard no_grad;
    m->bias.copy_(linear->bias.detach().to(torch::kFloat));
  }
  return m;
}

}  // namespace torchspeed::quant
