// The prune area's ops (mask selection over the packed-mask format of ops/mask.cpp): their schemas
// (a TORCH_LIBRARY_FRAGMENT of the torchspeed library) and their C++ entry points (declared in
// <torchspeed/ops/prune.h>), which call through the dispatcher. Kernels: ops/cpu/prune_cpu.cpp,
// ops/cuda/prune_cuda.cpp, ops/meta/prune_meta.cpp.
#include "torchspeed/ops/prune.h"

#include <torch/library.h>

TORCH_LIBRARY_FRAGMENT(torchspeed, m) {
  // N:M mask of w (contiguous; last dim a multiple of m; 1 <= m <= 256, 0 <= n <= m): in every m
  // consecutive elements of the last dim, the n with the largest |w| are kept. |w| compares
  // exactly (NaN above inf, -0 == +0); equal magnitudes rank the lower index first.
  m.def("nm_mask(Tensor w, int n=2, int m=4) -> Tensor");
  // Mask pruning exactly `amount` (0 <= amount <= numel) elements of w: the smallest |w|; among
  // equal magnitudes at the threshold, the higher memory index is pruned first. Deterministic.
  m.def("magnitude_mask(Tensor w, int amount) -> Tensor");
}

namespace torchspeed {

at::Tensor nm_mask(const at::Tensor& w, int64_t n, int64_t m) {
  return op_args::call(NmMaskArgs{w, n, m});
}

at::Tensor magnitude_mask(const at::Tensor& w, int64_t amount) {
  return op_args::call(MagnitudeMaskArgs{w, amount});
}

}  // namespace torchspeed
