// Umbrella header of the prune area (built with TORCHSPEED_WITH_PRUNE; find_package(torchspeed
// COMPONENTS prune)): bit-packed pruning masks (pack_mask, unpack_mask, apply_mask_, nm_mask,
// magnitude_mask). The fused optimizers (<torchspeed/optim.h>) read the same packed masks.
//
//   #include <torchspeed/prune.h>
//   at::Tensor bits = torchspeed::nm_mask(w, 2, 4);              // 2:4 along the last dim
//   torchspeed::apply_mask_(w, bits);                            // w is zero where a bit is 0
#pragma once

#include "torchspeed/ops/prune.h"
#include "torchspeed/torchspeed.h"
