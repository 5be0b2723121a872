// Umbrella header for torchspeed's fused C++ optimizers (torch::optim-compatible classes):
// Adam, AdamW, SGD, and Lion and LAMB (which torch::optim does not ship).
//
//   #include <torchspeed/optim.h>
//   torchspeed::optim::AdamW opt(model->parameters(), torchspeed::optim::AdamWOptions(1e-3));
#pragma once

#include "torchspeed/optim/adam.h"
#include "torchspeed/optim/hyperparams.h"
#include "torchspeed/optim/lamb.h"
#include "torchspeed/optim/lion.h"
#include "torchspeed/optim/lr_scheduler.h"
#include "torchspeed/optim/sgd.h"
#include "torchspeed/torchspeed.h"
