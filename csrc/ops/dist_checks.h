// The validator of the dist area's op (scale_cast_), shared by its CPU, CUDA and Meta kernels.
#pragma once

#include <ATen/ATen.h>
#include <ATen/MemoryOverlap.h>

#include <cmath>

#include "ops/checks.h"
#include "torchspeed/ops/dist.h"

namespace torchspeed::ops {

/// True for the dtype pairs scale_cast_ converts: fp64 -> fp64, or any of fp32/bf16/fp16 into any.
inline bool scale_cast_pair_ok(at::ScalarType out, at::ScalarType src) {
  auto narrow_or_f32 = [](at::ScalarType t) {
    return t == at::kFloat || t == at::kBFloat16 || t == at::kHalf;
  };
  return (out == at::kDouble && src == at::kDouble) || (narrow_or_f32(out) && narrow_or_f32(src));
}

inline void validate(const ScaleCastArgs& a) {
  const char* op = ScaleCastArgs::kName;
  for (const auto* arg : {&a.out, &a.src}) {
    const char* name = arg == &a.out ? "out" : "src";
    TORCH_CHECK(arg->defined(), "torchspeed.", op, ": ", name, " must be a tensor, got None");
    TORCH_CHECK(arg->layout() == at::kStrided, "torchspeed.", op, ": ", name,
                " must be a dense (strided) tensor, got layout ", arg->layout());
    TORCH_CHECK(is_kernel_float(arg->scalar_type()), "torchspeed.", op, ": ", name,
                " must be float32, float64, bfloat16 or float16, got ", arg->scalar_type());
    TORCH_CHECK(arg->is_contiguous(), "torchspeed.", op, ": ", name,
                " must be contiguous (a flat bucket), got strides ", arg->sym_strides());
  }
  TORCH_CHECK(scale_cast_pair_ok(a.out.scalar_type(), a.src.scalar_type()), "torchspeed.", op,
              ": out and src must be float64 -> float64 or float32/bfloat16/float16 into "
              "float32/bfloat16/float16, got ",
              a.src.scalar_type(), " -> ", a.out.scalar_type());
  TORCH_CHECK(a.out.device() == a.src.device(), "torchspeed.", op, ": out must be on ",
              a.src.device(), " like src, got ", a.out.device());
  TORCH_CHECK(a.out.sym_numel() == a.src.sym_numel(), "torchspeed.", op,
              ": out must have as many elements as src (", a.src.sym_numel(), "), got ",
              a.out.sym_numel());
  TORCH_CHECK(std::isfinite(a.scale), "torchspeed.", op, ": scale must be finite, got ", a.scale);
  if (a.out.device().type() != at::kMeta) {
    TORCH_CHECK(at::has_internal_overlap(a.out) != at::MemOverlap::Yes, "torchspeed.", op,
                ": out must not overlap itself (an expanded tensor)");
    // In place (the same memory, element for element) is allowed; any other overlap is not.
    const bool same = a.out.is_same(a.src) || (a.out.data_ptr() == a.src.data_ptr() &&
                                               a.out.scalar_type() == a.src.scalar_type());
    TORCH_CHECK(same || at::get_overlap_status(a.out, a.src) == at::MemOverlapStatus::No,
                "torchspeed.", op, ": out must be src itself or not overlap it");
  }
}

}  // namespace torchspeed::ops
