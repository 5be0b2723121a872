// The dist area's op: its schema (a TORCH_LIBRARY_FRAGMENT of the torchspeed library) and its C++
// entry point (declared in <torchspeed/ops/dist.h>), which calls through the dispatcher. Kernels:
// ops/cpu/dist_cpu.cpp, ops/cuda/dist_cuda.cpp, ops/meta/dist_meta.cpp.
#include "torchspeed/ops/dist.h"

#include <torch/library.h>

TORCH_LIBRARY_FRAGMENT(torchspeed, m) {
  // out = src * scale, rounded once into out's dtype: the reducer's pass over a gradient bucket
  // (the 1/world_size division fused with the bf16/fp16 compression cast, and the widening back).
  // out and src: contiguous, same numel and device, fp32/bf16/fp16 in any combination or fp64
  // with fp64; out may be src itself (in place), and must not overlap it otherwise.
  m.def("scale_cast_(Tensor(a!) out, Tensor src, float scale=1.0) -> ()");
}

namespace torchspeed {

void scale_cast_(const at::Tensor& out, const at::Tensor& src, double scale) {
  op_args::call(ScaleCastArgs{out, src, scale});
}

}  // namespace torchspeed
