// C++ entry points for torchspeed's tensor ops; each calls through the PyTorch dispatcher, so the
// CPU, CUDA or Meta implementation is chosen by the tensors' device. One header per area:
//   <torchspeed/ops/optim.h>  grad_stats, grad_stats_unscale_, adam_step_, sgd_step_, lion_step_,
//                             lamb_step_ (and their argument structs)
//
//   std::vector<at::Tensor> grads = ...;
//   auto stats = torchspeed::grad_stats(grads, /*per_tensor=*/true);
//   if (stats.found_inf.item<float>() == 0) clip(stats.total_norm);
#pragma once

#include "torchspeed/ops/optim.h"
