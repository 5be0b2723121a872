// Umbrella header of the quant area (built with TORCHSPEED_WITH_QUANT; find_package(torchspeed
// COMPONENTS quant)): the int8 ops (quantize_int8, dequantize_int8, fake_quantize,
// int8_pack_weight, int8_linear, cpu_int8_path) and the C++ module torchspeed::quant::Int8Linear.
//
//   #include <torchspeed/quant.h>
//   auto scale = w.abs().amax(1).clamp_min(1e-8) / 127;       // per output channel
//   auto q = torchspeed::quantize_int8(w, scale);             // int8, symmetric
//   auto layer = torchspeed::quant::from_float(linear);       // an Int8Linear
//   torch::NoGradGuard no_grad;
//   auto y = layer->forward(x);
#pragma once

#include "torchspeed/ops/quant.h"
#include "torchspeed/quant/linear.h"
#include "torchspeed/torchspeed.h"
