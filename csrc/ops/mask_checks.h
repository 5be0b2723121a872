// The validators of the packed-mask ops (pack_mask, unpack_mask, apply_mask_), shared by their CPU,
// CUDA and Meta kernels and by the prune area's mask selection: shapes, dtypes, devices and
// layouts, before anything is written. Symbolic (SymInt) so FakeTensor and dynamic shapes work.
#pragma once

#include <ATen/ATen.h>

#include "ops/checks.h"
#include "torchspeed/ops/mask.h"

namespace torchspeed::ops {

/// The weight of a mask op: a dense floating tensor (float32, float64, bfloat16, float16) whose
/// elements fill [data_ptr, data_ptr + numel) (contiguous in some memory format): masks index it
/// in memory order.
inline void check_weight(const char* op, const at::Tensor& w) {
  TORCH_CHECK(w.defined(), "torchspeed.", op, ": w must be a tensor, got None");
  TORCH_CHECK(w.layout() == at::kStrided, "torchspeed.", op,
              ": w must be a dense (strided) tensor, got layout ", w.layout());
  const auto t = w.scalar_type();
  TORCH_CHECK(t == at::kFloat || t == at::kDouble || t == at::kBFloat16 || t == at::kHalf,
              "torchspeed.", op, ": w must be float32, float64, bfloat16 or float16, got ", t);
  TORCH_CHECK(w.is_non_overlapping_and_dense(), "torchspeed.", op,
              ": w must be dense and non-overlapping (contiguous in some memory format), got "
              "sizes ",
              w.sym_sizes(), " strides ", w.sym_strides());
}

/// A packed mask for `numel` elements: contiguous uint8 [ceil(numel / 8)] on `device`.
inline void check_packed(const char* op, const at::Tensor& packed, const c10::SymInt& numel,
                         const at::Device& device) {
  TORCH_CHECK(packed.defined() && packed.layout() == at::kStrided, "torchspeed.", op,
              ": packed must be a dense uint8 tensor, got ",
              packed.defined() ? c10::str(packed.layout()) : std::string("None"));
  TORCH_CHECK(packed.scalar_type() == at::kByte, "torchspeed.", op,
              ": packed must be uint8 (a bit-packed mask from torchspeed.prune.pack_mask), got ",
              packed.scalar_type());
  TORCH_CHECK(packed.dim() == 1 && packed.is_contiguous(), "torchspeed.", op,
              ": packed must be a contiguous 1-D tensor, got sizes ", packed.sym_sizes(),
              " strides ", packed.sym_strides());
  const c10::SymInt bytes = (numel + 7) / 8;
  TORCH_CHECK(packed.sym_numel() == bytes, "torchspeed.", op, ": packed must have ceil(", numel,
              " / 8) = ", bytes, " bytes, got ", packed.sym_numel());
  TORCH_CHECK(packed.device() == device, "torchspeed.", op, ": packed must be on ", device,
              ", got ", packed.device());
}

inline void validate(const PackMaskArgs& a) {
  const char* op = PackMaskArgs::kName;
  TORCH_CHECK(a.mask.defined() && a.mask.layout() == at::kStrided, "torchspeed.", op,
              ": mask must be a dense bool tensor");
  TORCH_CHECK(a.mask.scalar_type() == at::kBool, "torchspeed.", op, ": mask must be bool, got ",
              a.mask.scalar_type());
  TORCH_CHECK(a.mask.is_non_overlapping_and_dense(), "torchspeed.", op,
              ": mask must be dense and non-overlapping (it is packed in memory order), got "
              "strides ",
              a.mask.sym_strides());
}

inline c10::SymInt validate(const UnpackMaskArgs& a) {
  const char* op = UnpackMaskArgs::kName;
  c10::SymInt numel = 1;
  for (size_t i = 0; i < a.shape.size(); ++i) {
    TORCH_CHECK(a.shape[i] >= 0, "torchspeed.", op, ": shape[", i, "] must be >= 0, got ",
                a.shape[i]);
    numel *= a.shape[i];
  }
  if (a.packed.defined()) {
    check_packed(op, a.packed, numel, a.packed.device());
  } else {
    TORCH_CHECK(false, "torchspeed.", op, ": packed must be a tensor, got None");
  }
  return numel;
}

inline void validate(const ApplyMaskArgs& a) {
  check_weight(ApplyMaskArgs::kName, a.w);
  check_packed(ApplyMaskArgs::kName, a.packed, a.w.sym_numel(), a.w.device());
}

/// An empty packed mask for t's elements (the Meta kernels' result).
inline at::Tensor empty_packed_like(const at::Tensor& t) {
  return at::empty_symint({(t.sym_numel() + 7) / 8}, t.options().dtype(at::kByte));
}

}  // namespace torchspeed::ops
