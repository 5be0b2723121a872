// C++ entry points for torchspeed's tensor ops; each calls through the PyTorch dispatcher, so the
// CPU, CUDA or Meta implementation is chosen by the tensors' device.
//
//   std::vector<at::Tensor> grads = ...;
//   auto stats = torchspeed::grad_stats(grads, /*per_tensor=*/true);
//   if (stats.found_inf.item<float>() == 0) clip(stats.total_norm);
#pragma once

#include <ATen/ATen.h>

#include "torchspeed/export.h"

namespace torchspeed {

/// What grad_stats returns: float32 tensors on the inputs' device.
struct GradStats {
  at::Tensor total_norm;        ///< 0-dim: the L2 norm of all elements of all tensors
  at::Tensor per_tensor_norms;  ///< [n] when per_tensor, else [0]
  at::Tensor found_inf;         ///< 0-dim: 1.0 if any element was inf or NaN, else 0.0
};

/// One read-only pass over `tensors`: global L2 norm, optional per-tensor norms, non-finite flag.
/// An empty list gives norm 0 and found_inf 0 on the CPU, as torch.nn.utils.clip_grad_norm_([]).
TORCHSPEED_API GradStats grad_stats(at::TensorList tensors, bool per_tensor = false);

/// As grad_stats, after multiplying every tensor in place by `inv_scale` (one-element float32
/// tensor on the tensors' device); non-finite values are detected before unscaling.
TORCHSPEED_API GradStats grad_stats_unscale_(at::TensorList tensors, const at::Tensor& inv_scale,
                                             bool per_tensor = false);

}  // namespace torchspeed
