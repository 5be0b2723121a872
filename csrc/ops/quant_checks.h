// The validators of the quant area's ops (quantize_int8, dequantize_int8, fake_quantize, the int8
// Linear), shared by their CPU, CUDA and Meta kernels, and the layout they derive: x as [rows,
// cols], scale's granularity.
#pragma once

#include <ATen/ATen.h>

#include <cmath>
#include <vector>

#include "ops/checks.h"
#include "torchspeed/ops/quant.h"

namespace torchspeed::ops {

/// x viewed as [rows, cols]; `groups` scales per row (0 = one scale for the whole tensor).
/// Symbolic (SymInt) so that FakeTensor and dynamic shapes validate too; `concrete()` for kernels.
struct QuantLayout {
  int64_t rows = 1;
  int64_t cols = 1;
  int64_t groups = 0;
  int64_t group_size() const { return groups ? cols / groups : rows * cols; }
};
struct SymQuantLayout {
  c10::SymInt rows, cols, groups;
  QuantLayout concrete() const {
    return {rows.expect_int(), cols.expect_int(), groups.expect_int()};
  }
};

/// Checks the data tensor, scale and zero_point of a quant op (shapes, dtypes, devices, layouts);
/// returns the layout. Their values are checked by check_quant_values, on the host only.
inline SymQuantLayout check_quant_args(const char* op, const char* data_name,
                                       const at::Tensor& data, const at::Tensor& scale,
                                       const std::optional<at::Tensor>& zero_point) {
  TORCH_CHECK(data.defined(), "torchspeed.", op, ": ", data_name, " must be a tensor, got None");
  TORCH_CHECK(data.layout() == at::kStrided, "torchspeed.", op, ": ", data_name,
              " must be a dense (strided) tensor, got layout ", data.layout());
  TORCH_CHECK(data.dim() >= 1, "torchspeed.", op, ": ", data_name,
              " must have at least one dimension, got a 0-dim tensor");
  TORCH_CHECK(data.is_contiguous(), "torchspeed.", op, ": ", data_name,
              " must be contiguous, got strides ", data.sym_strides());
  TORCH_CHECK(
      scale.defined() && scale.layout() == at::kStrided && scale.scalar_type() == at::kFloat,
      "torchspeed.", op, ": scale must be a dense float32 tensor, got ",
      scale.defined() ? c10::toString(scale.scalar_type()) : "None");
  TORCH_CHECK(scale.device() == data.device(), "torchspeed.", op, ": scale must be on ",
              data.device(), " like ", data_name, ", got ", scale.device());
  SymQuantLayout l;
  l.cols = data.sym_size(-1);
  l.rows = l.cols == 0 ? c10::SymInt(0) : data.sym_numel() / l.cols;
  if (scale.sym_numel() == 1) {
    l.groups = 0;
  } else if (scale.dim() == 1) {
    TORCH_CHECK(scale.sym_size(0) == l.rows, "torchspeed.", op, ": a per-channel scale must have ",
                l.rows, " elements (one per row of ", data_name, " viewed as [", l.rows, ", ",
                l.cols, "]), got ", scale.sym_size(0));
    l.groups = 1;
  } else {
    TORCH_CHECK(scale.dim() == 2 && scale.sym_size(0) == l.rows && scale.sym_size(1) > 0 &&
                    l.cols % scale.sym_size(1) == 0,
                "torchspeed.", op, ": scale must have one element, shape [", l.rows, "] or shape [",
                l.rows, ", groups] with groups dividing ", l.cols, ", got shape ",
                scale.sym_sizes());
    l.groups = scale.sym_size(1);
  }
  TORCH_CHECK(scale.is_contiguous(), "torchspeed.", op, ": scale must be contiguous");
  if (zero_point) {
    const at::Tensor& zp = *zero_point;
    TORCH_CHECK(zp.layout() == at::kStrided && zp.scalar_type() == at::kInt && zp.is_contiguous(),
                "torchspeed.", op, ": zero_point must be a contiguous int32 tensor or None, got ",
                zp.scalar_type());
    TORCH_CHECK(zp.sym_sizes() == scale.sym_sizes(), "torchspeed.", op,
                ": zero_point must have scale's shape ", scale.sym_sizes(), ", got ",
                zp.sym_sizes());
    TORCH_CHECK(zp.device() == data.device(), "torchspeed.", op, ": zero_point must be on ",
                data.device(), ", got ", zp.device());
  }
  return l;
}

/// The values the CPU kernels read: every scale finite and > 0, every zero point in [-128, 127].
/// (On CUDA they stay on the device: reading them would synchronise.)
inline void check_quant_values(const char* op, const at::Tensor& scale,
                               const std::optional<at::Tensor>& zero_point) {
  const float* s = scale.data_ptr<float>();
  for (int64_t i = 0; i < scale.numel(); ++i) {
    TORCH_CHECK(std::isfinite(s[i]) && s[i] > 0, "torchspeed.", op, ": scale[", i,
                "] must be finite and > 0, got ", s[i]);
  }
  if (zero_point) {
    const int32_t* z = zero_point->data_ptr<int32_t>();
    for (int64_t i = 0; i < zero_point->numel(); ++i) {
      TORCH_CHECK(z[i] >= -128 && z[i] <= 127, "torchspeed.", op, ": zero_point[", i,
                  "] must be in [-128, 127], got ", z[i]);
    }
  }
}

inline SymQuantLayout validate(const QuantizeInt8Args& a) {
  if (a.x.defined()) {
    const auto t = a.x.scalar_type();
    TORCH_CHECK(t == at::kFloat || t == at::kBFloat16 || t == at::kHalf, "torchspeed.",
                QuantizeInt8Args::kName, ": x must be float32, bfloat16 or float16, got ", t);
  }
  return check_quant_args(QuantizeInt8Args::kName, "x", a.x, a.scale, a.zero_point);
}

inline SymQuantLayout validate(const DequantizeInt8Args& a) {
  if (a.q.defined()) {
    TORCH_CHECK(a.q.scalar_type() == at::kChar, "torchspeed.", DequantizeInt8Args::kName,
                ": q must be int8, got ", a.q.scalar_type());
  }
  return check_quant_args(DequantizeInt8Args::kName, "q", a.q, a.scale, a.zero_point);
}

// ---- The int8 Linear
// -----------------------------------------------------------------------------

/// Largest K the int8 GEMM accepts: 131072 * 127 * 127 < 2^31, so its int32 sums stay exact.
constexpr int64_t kInt8LinearMaxK = int64_t{1} << 17;

/// Bytes of a packed int8 weight (every CPU path's layout, kernels/cpu/types.h): a 64-byte header,
/// int32 comp[N_pad], panels N_pad x K_pad (N, K rounded up to 16 and 64).
inline c10::SymInt int8_packed_bytes(const c10::SymInt& n, const c10::SymInt& k) {
  const c10::SymInt n_pad = (n + 15) / 16 * 16;
  const c10::SymInt k_pad = (k + 63) / 64 * 64;
  return n_pad * k_pad + n_pad * 4 + 64;
}

inline void validate(const Int8PackWeightArgs& a) {
  const char* op = Int8PackWeightArgs::kName;
  TORCH_CHECK(a.w.defined() && a.w.layout() == at::kStrided && a.w.scalar_type() == at::kChar,
              "torchspeed.", op, ": w must be a dense int8 tensor, got ",
              a.w.defined() ? c10::toString(a.w.scalar_type()) : "None");
  TORCH_CHECK(a.w.dim() == 2, "torchspeed.", op, ": w must be [N, K] (2-D), got shape ",
              a.w.sym_sizes());
  TORCH_CHECK(a.w.sym_size(0) >= 1 && a.w.sym_size(1) >= 1 && a.w.sym_size(1) <= kInt8LinearMaxK,
              "torchspeed.", op, ": w must have N >= 1 and 1 <= K <= ", kInt8LinearMaxK,
              ", got shape ", a.w.sym_sizes());
  TORCH_CHECK(a.w.is_contiguous(), "torchspeed.", op, ": w must be contiguous, got strides ",
              a.w.sym_strides());
}

/// The int8 Linear's shape: x as [m, k], n output channels; `packed`: packed_w is the CPU buffer
/// (uint8), else the plain int8 [n, k] weight (CUDA).
struct SymInt8LinearShape {
  c10::SymInt m, n, k;
  bool packed;
};

inline SymInt8LinearShape validate(const Int8LinearArgs& a) {
  const char* op = Int8LinearArgs::kName;
  TORCH_CHECK(a.x.defined() && a.x.layout() == at::kStrided, "torchspeed.", op,
              ": x must be a dense tensor");
  const auto t = a.x.scalar_type();
  TORCH_CHECK(t == at::kFloat || t == at::kBFloat16 || t == at::kHalf, "torchspeed.", op,
              ": x must be float32, bfloat16 or float16, got ", t);
  TORCH_CHECK(a.x.dim() >= 1, "torchspeed.", op, ": x must be [..., K], got a 0-dim tensor");
  TORCH_CHECK(a.x.is_contiguous(), "torchspeed.", op, ": x must be contiguous, got strides ",
              a.x.sym_strides());
  SymInt8LinearShape s;
  s.k = a.x.sym_size(-1);
  TORCH_CHECK(s.k >= 1 && s.k <= kInt8LinearMaxK, "torchspeed.", op,
              ": x's last dim (K) must be in [1, ", kInt8LinearMaxK, "], got ", s.k);
  s.m = a.x.sym_numel() / s.k;
  TORCH_CHECK(a.w_scale.defined() && a.w_scale.layout() == at::kStrided &&
                  a.w_scale.scalar_type() == at::kFloat && a.w_scale.dim() == 1 &&
                  a.w_scale.is_contiguous() && a.w_scale.sym_size(0) >= 1,
              "torchspeed.", op, ": w_scale must be a contiguous float32 [N] tensor (N >= 1), got ",
              a.w_scale.defined() ? c10::toString(a.w_scale.scalar_type()) : "None", " of shape ",
              a.w_scale.defined() ? a.w_scale.sym_sizes() : c10::SymIntArrayRef{});
  s.n = a.w_scale.sym_size(0);
  TORCH_CHECK(a.w_scale.device() == a.x.device(), "torchspeed.", op, ": w_scale must be on ",
              a.x.device(), " like x, got ", a.w_scale.device());
  const at::Tensor& w = a.packed_w;
  TORCH_CHECK(w.defined() && w.layout() == at::kStrided && w.device() == a.x.device(),
              "torchspeed.", op, ": packed_w must be a dense tensor on ", a.x.device(), " like x");
  if (w.scalar_type() == at::kByte) {
    const c10::SymInt bytes = int8_packed_bytes(s.n, s.k);
    TORCH_CHECK(w.dim() == 1 && w.is_contiguous() && w.sym_numel() == bytes, "torchspeed.", op,
                ": packed_w must be int8_pack_weight's result for N = ", s.n,
                " (w_scale) and K = ", s.k, " (x's last dim): ", bytes,
                " contiguous bytes, got shape ", w.sym_sizes());
    s.packed = true;
  } else {
    TORCH_CHECK(w.scalar_type() == at::kChar && w.dim() == 2 && w.is_contiguous() &&
                    w.sym_size(0) == s.n && w.sym_size(1) == s.k,
                "torchspeed.", op,
                ": packed_w must be int8_pack_weight's uint8 buffer, or (CUDA) the contiguous int8 "
                "[N, K] weight with N = ",
                s.n, " (w_scale), K = ", s.k, " (x's last dim), got ", w.scalar_type(),
                " of shape ", w.sym_sizes());
    s.packed = false;
  }
  if (a.bias) {
    const at::Tensor& b = *a.bias;
    TORCH_CHECK(b.layout() == at::kStrided && b.scalar_type() == at::kFloat && b.dim() == 1 &&
                    b.is_contiguous() && b.sym_size(0) == s.n,
                "torchspeed.", op, ": bias must be a contiguous float32 [", s.n,
                "] tensor or None, got ", b.scalar_type(), " of shape ", b.sym_sizes());
    TORCH_CHECK(b.device() == a.x.device(), "torchspeed.", op, ": bias must be on ", a.x.device(),
                ", got ", b.device());
  }
  return s;
}

/// Output shape of int8_linear: x's shape with the last dim N.
inline std::vector<c10::SymInt> int8_linear_out_shape(const at::Tensor& x, const c10::SymInt& n) {
  std::vector<c10::SymInt> shape(x.sym_sizes().begin(), x.sym_sizes().end());
  shape.back() = n;
  return shape;
}

/// fake_quantize's bound on |quant_min|, |quant_max|: every integer the formula forms (v, the
/// clamp, v - zero_point) is then exact in fp32, so the result equals torch's int64/double one.
inline constexpr int64_t kFakeQuantRangeLimit = int64_t{1} << 22;

inline SymQuantLayout validate(const FakeQuantizeArgs& a) {
  const char* op = FakeQuantizeArgs::kName;
  if (a.x.defined()) {
    const auto t = a.x.scalar_type();
    TORCH_CHECK(t == at::kFloat || t == at::kBFloat16 || t == at::kHalf, "torchspeed.", op,
                ": x must be float32, bfloat16 or float16, got ", t);
  }
  TORCH_CHECK(a.quant_min >= -kFakeQuantRangeLimit && a.quant_max <= kFakeQuantRangeLimit &&
                  a.quant_min <= a.quant_max,
              "torchspeed.", op, ": quant_min <= quant_max must hold within [-2^22, 2^22], got [",
              a.quant_min, ", ", a.quant_max, "]");
  return check_quant_args(op, "x", a.x, a.scale, a.zero_point);
}

inline void validate(const FakeQuantizeBackwardArgs& a) {
  const char* op = FakeQuantizeBackwardArgs::kName;
  TORCH_CHECK(a.grad.defined() && a.grad.layout() == at::kStrided, "torchspeed.", op,
              ": grad must be a dense tensor");
  const auto t = a.grad.scalar_type();
  TORCH_CHECK(t == at::kFloat || t == at::kBFloat16 || t == at::kHalf, "torchspeed.", op,
              ": grad must be float32, bfloat16 or float16, got ", t);
  TORCH_CHECK(a.grad.is_contiguous(), "torchspeed.", op, ": grad must be contiguous");
  TORCH_CHECK(a.mask.defined() && a.mask.layout() == at::kStrided &&
                  a.mask.scalar_type() == at::kBool && a.mask.is_contiguous(),
              "torchspeed.", op, ": mask must be a contiguous bool tensor, got ",
              a.mask.defined() ? c10::toString(a.mask.scalar_type()) : "None");
  TORCH_CHECK(a.mask.sym_sizes() == a.grad.sym_sizes(), "torchspeed.", op,
              ": mask must have grad's shape ", a.grad.sym_sizes(), ", got ", a.mask.sym_sizes());
  TORCH_CHECK(a.mask.device() == a.grad.device(), "torchspeed.", op, ": mask must be on ",
              a.grad.device(), " like grad, got ", a.mask.device());
}

/// fake_quantize's values, read on the host (CPU only): every scale finite and > 0, every zero
/// point within [quant_min, quant_max].
inline void check_fake_quant_values(const FakeQuantizeArgs& a) {
  const char* op = FakeQuantizeArgs::kName;
  const float* s = a.scale.data_ptr<float>();
  for (int64_t i = 0; i < a.scale.numel(); ++i) {
    TORCH_CHECK(std::isfinite(s[i]) && s[i] > 0, "torchspeed.", op, ": scale[", i,
                "] must be finite and > 0, got ", s[i]);
  }
  if (a.zero_point) {
    const int32_t* z = a.zero_point->data_ptr<int32_t>();
    for (int64_t i = 0; i < a.zero_point->numel(); ++i) {
      TORCH_CHECK(z[i] >= a.quant_min && z[i] <= a.quant_max, "torchspeed.", op, ": zero_point[", i,
                  "] must be in [quant_min, quant_max] = [", a.quant_min, ", ", a.quant_max,
                  "], got ", z[i]);
    }
  }
}

}  // namespace torchspeed::ops
