// CPU implementation of the packed-mask ops (pack_mask, unpack_mask, apply_mask_): validates, then
// runs the ISA kernels (kernels/cpu/prune.h) over ranges that start on a mask byte, in one parallel
// region.
#include <ATen/ATen.h>
#include <torch/library.h>

#include "ops/cpu/mask_ranges.h"
#include "ops/mask_checks.h"

namespace torchspeed::ops {
namespace {

at::Tensor pack_mask_cpu(const PackMaskArgs& a) {
  validate(a);
  const auto& k = mask_kernels(PackMaskArgs::kName);
  const int64_t n = a.mask.numel();
  at::Tensor out = at::empty({packed_mask_bytes(n)}, a.mask.options().dtype(at::kByte));
  const auto* in = reinterpret_cast<const uint8_t*>(a.mask.const_data_ptr<bool>());
  uint8_t* o = out.data_ptr<uint8_t>();
  for_each_range(n, kChunkElements,
                 [&](int64_t b, int64_t len) { k.pack_mask(in + b, o + b / 8, len); });
  return out;
}

at::Tensor unpack_mask_cpu(const UnpackMaskArgs& a) {
  const int64_t n = validate(a).expect_int();
  const auto& k = mask_kernels(UnpackMaskArgs::kName);
  at::Tensor out = at::empty(a.shape, a.packed.options().dtype(at::kBool));
  const uint8_t* in = a.packed.const_data_ptr<uint8_t>();
  auto* o = reinterpret_cast<uint8_t*>(out.data_ptr<bool>());
  for_each_range(n, kChunkElements,
                 [&](int64_t b, int64_t len) { k.unpack_mask(in + b / 8, o + b, len); });
  return out;
}

void apply_mask_cpu(const ApplyMaskArgs& a) {
  validate(a);
  const auto& k = mask_kernels(ApplyMaskArgs::kName);
  const int es = static_cast<int>(a.w.element_size());
  char* w = static_cast<char*>(a.w.data_ptr());
  const uint8_t* bits = a.packed.const_data_ptr<uint8_t>();
  for_each_range(a.w.numel(), kChunkElements,
                 [&](int64_t b, int64_t len) { k.apply_mask(w + b * es, es, bits + b / 8, len); });
}

}  // namespace

TORCH_LIBRARY_IMPL(torchspeed, CPU, m) {
  TORCHSPEED_OP_IMPL(m, PackMaskArgs, pack_mask_cpu);
  TORCHSPEED_OP_IMPL(m, UnpackMaskArgs, unpack_mask_cpu);
  TORCHSPEED_OP_IMPL(m, ApplyMaskArgs, apply_mask_cpu);
}

}  // namespace torchspeed::ops
