// The validators of the prune area's ops (pack_mask, unpack_mask, apply_mask_, nm_mask,
// magnitude_mask), shared by their CPU, CUDA and Meta kernels: shapes, dtypes, devices and
// layouts, before anything is written. Symbolic (SymInt) so FakeTensor and dynamic shapes work.
#pragma once

#include <ATen/ATen.h>

#include "ops/checks.h"
#include "torchspeed/ops/prune.h"

namespace torchspeed::ops {

/// Largest m of an N:M mask (the kernels rank within a group of at most this many elements).
constexpr int64_t kMaxNmGroup = 256;

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

inline void validate(const NmMaskArgs& a) {
  const char* op = NmMaskArgs::kName;
  check_weight(op, a.w);
  TORCH_CHECK(a.m >= 1 && a.m <= kMaxNmGroup, "torchspeed.", op, ": m must be in [1, ", kMaxNmGroup,
              "], got ", a.m);
  TORCH_CHECK(a.n >= 0 && a.n <= a.m, "torchspeed.", op, ": n must be in [0, m = ", a.m, "], got ",
              a.n);
  TORCH_CHECK(a.w.dim() >= 1, "torchspeed.", op,
              ": w must have at least one dimension (groups run along the last), got a 0-dim "
              "tensor");
  TORCH_CHECK(a.w.is_contiguous(), "torchspeed.", op,
              ": w must be contiguous (groups are m consecutive elements of the last dim), got "
              "strides ",
              a.w.sym_strides());
  TORCH_CHECK(a.w.sym_size(-1) % a.m == 0, "torchspeed.", op, ": the last dim of w (",
              a.w.sym_size(-1), ") must be a multiple of m = ", a.m, " (shape ", a.w.sym_sizes(),
              ")");
}

inline void validate(const MagnitudeMaskArgs& a) {
  const char* op = MagnitudeMaskArgs::kName;
  check_weight(op, a.w);
  TORCH_CHECK(a.amount >= 0 && a.w.sym_numel() >= a.amount, "torchspeed.", op,
              ": amount must be in [0, numel = ", a.w.sym_numel(), "], got ", a.amount);
}

/// The integer view whose values, masked to drop the sign, order like |w| (see
/// kernels/cpu/prune.h).
inline at::ScalarType key_dtype(at::ScalarType t) {
  switch (c10::elementSize(t)) {
    case 2:
      return at::kShort;
    case 4:
      return at::kInt;
    default:
      return at::kLong;
  }
}

/// The magnitude keys of w in memory order (int16/32/64, sign bit cleared).
inline at::Tensor magnitude_keys(const at::Tensor& w) {
  const at::Tensor flat = w.as_strided({w.numel()}, {1});  // dense: memory order
  const at::ScalarType kt = key_dtype(w.scalar_type());
  const int64_t sign_off = kt == at::kShort ? 0x7fff
                           : kt == at::kInt ? int64_t{0x7fffffff}
                                            : int64_t{0x7fffffffffffffffLL};
  return flat.view(kt).bitwise_and(sign_off);
}

}  // namespace torchspeed::ops
