// The validators of the prune area's ops (nm_mask, magnitude_mask; the mask format's in
// mask_checks.h), shared by their CPU, CUDA and Meta kernels: shapes, dtypes, devices and
// layouts, before anything is written. Symbolic (SymInt) so FakeTensor and dynamic shapes work.
#pragma once

#include <ATen/ATen.h>

#include "ops/checks.h"
#include "ops/mask_checks.h"
#include "torchspeed/ops/prune.h"

namespace torchspeed::ops {

/// Largest m of an N:M mask (the kernels rank within a group of at most this many elements).
constexpr int64_t kMaxNmGroup = 256;

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
