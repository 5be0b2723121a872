// The packed-mask ops (built with the optimizer area, whose fused steps read the format): their
// schemas (a TORCH_LIBRARY_FRAGMENT of the torchspeed library), their C++ entry points (declared in
// <torchspeed/ops/mask.h>), which call through the dispatcher, and apply_mask_'s Autograd kernel.
// Kernels: ops/cpu/mask_cpu.cpp, ops/cuda/mask_cuda.cpp, ops/meta/mask_meta.cpp.
#include "torchspeed/ops/mask.h"

#include <ATen/core/LegacyTypeDispatch.h>
#include <c10/core/GradMode.h>
#include <torch/library.h>

TORCH_LIBRARY_FRAGMENT(torchspeed, m) {
  // A packed mask is uint8 [ceil(numel / 8)]: bit j (least significant first) of byte b is element
  // 8b + j of the tensor in memory order; 1 keeps, 0 prunes. numpy.packbits(bitorder="little").
  //
  // mask (bool, dense) packed in its memory order.
  m.def("pack_mask(Tensor mask) -> Tensor");
  // The inverse: a contiguous bool tensor of `shape`; packed must have ceil(numel(shape) / 8)
  // bytes.
  m.def("unpack_mask(Tensor packed, int[] shape) -> Tensor");
  // In place, w (float32/64, bfloat16, float16, dense) = 0 where the bit is 0 (+0.0); kept elements
  // are not rewritten bit for bit. The validator runs before anything is written.
  m.def("apply_mask_(Tensor(a!) w, Tensor packed) -> ()");
}

namespace torchspeed {

at::Tensor pack_mask(const at::Tensor& mask) { return op_args::call(PackMaskArgs{mask}); }

at::Tensor unpack_mask(const at::Tensor& packed, at::IntArrayRef shape) {
  return op_args::call(UnpackMaskArgs{packed, shape});
}

void apply_mask_(const at::Tensor& w, const at::Tensor& packed) {
  op_args::call(ApplyMaskArgs{w, packed});
}

}  // namespace torchspeed

namespace {

// apply_mask_'s Autograd kernel. The op has no derivative; like torch's in-place ops it refuses a
// tensor that requires grad (a leaf: "used in an in-place operation"; a non-leaf: its gradient
// would silently ignore the mask) while grad mode is on, and bumps w's version counter, so a
// backward through a graph that saved w raises "modified by an inplace operation".
void apply_mask_autograd(const at::Tensor& w, const at::Tensor& packed) {
  if (c10::GradMode::is_enabled() && w.requires_grad()) {
    TORCH_CHECK(!w.is_leaf(),
                "torchspeed.apply_mask_: w is a leaf Variable that requires grad and cannot be "
                "used in an in-place operation; call it under torch.no_grad() or on w.detach()");
    TORCH_CHECK(false,
                "torchspeed.apply_mask_: w requires grad and apply_mask_ has no derivative; call "
                "it under torch.no_grad() or on w.detach()");
  }
  {
    at::AutoDispatchBelowADInplaceOrView guard;
    torchspeed::apply_mask_(w, packed);
  }
  w.unsafeGetTensorImpl()->bump_version();
}

}  // namespace

TORCH_LIBRARY_IMPL(torchspeed, Autograd, m) { m.impl("apply_mask_", apply_mask_autograd); }
