// Types shared by the CPU kernel layer and its callers: storage types, dtypes, the per-ISA table.
//
// Plain data only (no inline code), so this header can be included by the ISA units and by
// torch-aware code alike without the ODR trap described in vec.h.
#pragma once

#include <cstddef>
#include <cstdint>

#include "kernels/common/optim_types.h"

namespace torchspeed::kernels::cpu {

/// 16-bit storage types, layout-compatible with c10::BFloat16 and c10::Half.
struct bf16 {
  uint16_t bits;
};
struct fp16 {
  uint16_t bits;
};

using kernels::DType;
using kernels::OptimHyper;
using kernels::OptimTensor;
using kernels::StepScalars;

/// The instruction sets a kernel is compiled for, slowest first.
/// kAvx512Vnni and kAmx run the avx512 unit's kernels except the int8 Linear's (VNNI / AMX-INT8).
enum class Isa : int { kScalar = 0, kAvx2 = 1, kAvx512 = 2, kAvx512Vnni = 3, kAmx = 4 };

/// Result of one grad_stats chunk: the sum of squares (after unscaling) and whether any element
/// was inf or NaN before unscaling.
struct GradStatsPartial {
  double sumsq;
  bool nonfinite;
};

/// grad_stats over one contiguous range. `inv_scale` null: read only; else multiply in place.
using GradStatsFn = void (*)(DType dtype, void* data, int64_t n, const float* inv_scale,
                             GradStatsPartial* out);

// ---- Optimizers ---------------------------------------------------------------------------------

/// An update over one contiguous range of one parameter (OptimTensor with numel = the range's
/// length; `step` is not read); LAMB phase 1 also returns the squared norms it needs.
using OptimFn = void (*)(const OptimTensor& chunk, const OptimHyper& h, const StepScalars& s,
                         double* param_sumsq, double* update_sumsq);

// ---- Data: the image resampler (resample.h) -----------------------------------------------------

/// Fraction bits of the resampler's fixed-point weights (Pillow's PRECISION_BITS).
constexpr int kResamplePrecisionBits = 32 - 8 - 2;

/// Horizontal pass over one RGB row; see resample_horizontal_row.
using ResampleHorizontalFn = void (*)(const uint8_t* row, int src_w, const int* bounds,
                                      const int* kk, int ksize, int x0, int x1, uint8_t* out);
/// Vertical pass for one output row; see resample_vertical_row.
using ResampleVerticalFn = void (*)(const uint8_t* rows, size_t stride, int first, int count,
                                    const int* k, size_t n, uint8_t* out);

// ---- Dist: the reducer's bucket pass (dist_bucket.h) --------------------------------------------

/// out = in * scale over `n` contiguous elements, converting fp32/bf16/fp16 into fp32/bf16/fp16 (or
/// fp64 into fp64); `in` may equal `out`. False for a dtype pair it does not implement.
using ScaleCastFn = bool (*)(DType in_dtype, const void* in, DType out_dtype, void* out,
                             double scale, int64_t n);

// ---- Quant: int8 affine quantize / dequantize (quant.h) -----------------------------------------

/// q = clamp(round_even(x * inv_scale) + zero_point, -128, 127) over `n` contiguous elements of
/// fp32/bf16/fp16 `x`; false for another dtype.
using QuantizeInt8Fn = bool (*)(DType in_dtype, const void* x, int8_t* q, int64_t n,
                                float inv_scale, float zero_point);
/// out = (q - zero_point) * scale over `n` contiguous elements, in fp32.
using DequantizeInt8Fn = void (*)(const int8_t* q, float* out, int64_t n, float scale,
                                  float zero_point);
/// Fake quantize `n` contiguous elements of fp32/bf16/fp16 `x` into `y` (same dtype):
/// v = round_even(x * inv_scale) + zero_point, y = (clamp(v, quant_min, quant_max) - zero_point) *
/// scale, mask = (quant_min <= v <= quant_max) as bytes 0/1; false for another dtype.
using FakeQuantizeFn = bool (*)(DType dtype, const void* x, void* y, uint8_t* mask, int64_t n,
                                float scale, float inv_scale, float zero_point, float quant_min,
                                float quant_max);
/// out = grad * mask (mask bytes 0 / 1 as float 0 / 1) over `n` contiguous fp32/bf16/fp16
/// elements, in grad's dtype: fake_quantize's backward; false for another dtype.
using FakeQuantizeBackwardFn = bool (*)(DType dtype, const void* grad, const uint8_t* mask,
                                        void* out, int64_t n);

// ---- Quant: the int8 Linear (quant_int8_gemm.h)
// -------------------------------------------------------

/// The int8 GEMM's kernel paths; a CpuKernelTable names the one it runs (its int8_linear.path).
enum class Int8Path : int32_t { kScalar = 0, kAvx2 = 1, kAvx512Vnni = 2, kAmx = 3, kAvx512 = 4 };

/// The packed weight's layout, shared by every path: N padded to panels of kInt8PanelN output
/// channels, K padded to kInt8KAlign (zeros); panel p holds, for each group g of 4 consecutive k,
/// the 4 bytes w[16p + j, 4g .. 4g + 3] of its channels j = 0..15 (64 bytes per group: one
/// vpdpbusd operand, 16 groups = one AMX B tile). Before the panels: int32 comp[n_pad] =
/// 128 * sum_k w[n, k] (what the u8 x s8 paths subtract).
constexpr int64_t kInt8PanelN = 16;
constexpr int64_t kInt8KAlign = 64;

/// What the op layer stores before the packed panels (64 bytes), checked by every GEMM call.
struct Int8PackedHeader {
  uint32_t magic;  // kInt8PackedMagic
  int32_t version;
  int32_t path;  // Int8Path the buffer was packed for
  int32_t reserved;
  int64_t n, k, n_pad, k_pad;
  int64_t unused[2];
};
constexpr uint32_t kInt8PackedMagic = 0x38495354u;  // "TSI8"
constexpr int32_t kInt8PackedVersion = 1;

/// One int8 Linear call: acc[m, n] = sum_k a[m, k] * w[n, k] in exact int32, then
/// out[m, n] = act(float(acc) * (a_scale[m] * w_scale[n]) + bias[n]) in fp32 (no FMA), act = ReLU
/// (x < 0 ? 0 : x, NaN kept) when `relu`, stored as out_dtype (fp32/bf16/fp16, rounded once).
struct Int8GemmArgs {
  const int8_t* a;  // [m, lda] quantize_rows' output (lda >= k_pad, a multiple of 64)
  int64_t lda;
  const float* a_scale;  // [m]
  const void* packed;    // the panels' body (comp, then panels), after the header
  const float* w_scale;  // [n]
  const float* bias;     // [n] or null
  bool relu;
  DType out_dtype;
  void* out;  // [m, ldo]
  int64_t ldo;
  int64_t m, n, k, n_pad, k_pad;
};

/// Per-row dynamic quantization of x [rows, cols] (fp32/bf16/fp16, contiguous): scale[r] =
/// absmax / 127 (1 when absmax == 0, NaN for a row holding inf/NaN), q = clamp(round_even(x *
/// (1 / scale)), -127, 127) into rows of stride ldq (>= cols, a multiple of 64), zero-filled
/// beyond cols (q of a non-finite row: 0); the avx512_vnni and amx paths store q xor 0x80 (their
/// u8 operand q + 128). False for another dtype.
using QuantizeRowsInt8Fn = bool (*)(DType in_dtype, const void* x, int64_t rows, int64_t cols,
                                    int8_t* q, int64_t ldq, float* scale);
/// Packs w [n, k] (int8 in [-127, 127], contiguous) into the body after the header.
using Int8PackWeightFn = void (*)(const int8_t* w, int64_t n, int64_t k, int64_t n_pad,
                                  int64_t k_pad, void* body);
/// Computes the output rows [m0, m1) x columns [n0, n1) (n0 a multiple of kInt8PanelN).
using Int8GemmFn = void (*)(const Int8GemmArgs& args, int64_t m0, int64_t m1, int64_t n0,
                            int64_t n1);

/// One path's int8 Linear kernels.
struct Int8LinearKernels {
  Int8Path path;
  const char* name;  // "scalar", "avx2", "avx512", "avx512_vnni", "amx"
  QuantizeRowsInt8Fn quantize_rows;
  Int8PackWeightFn pack_weight;
  Int8GemmFn gemm;
};

// ---- Prune: bit-packed masks (prune.h; bit j of byte b = element 8b + j) -----------------------

/// Packs n {0,1} bytes (nonzero = 1) into ceil(n / 8) bytes.
using PackMaskFn = void (*)(const uint8_t* bools, uint8_t* bits, int64_t n);
/// Unpacks ceil(n / 8) bytes into n {0,1} bytes.
using UnpackMaskFn = void (*)(const uint8_t* bits, uint8_t* bools, int64_t n);
/// w[i] = 0 where bit i is 0, over n elements of elem_size (2, 4 or 8) bytes, in place.
using ApplyMaskFn = void (*)(void* w, int elem_size, const uint8_t* bits, int64_t n);
/// N:M mask of `groups` groups of m elements (keep the n largest |w| of each).
using NmMaskFn = void (*)(const void* w, int elem_size, int64_t groups, int n, int m,
                          uint8_t* bits);
/// How many of n elements have the magnitude key `threshold` (see prune.h).
using CountKeyFn = int64_t (*)(const void* w, int elem_size, int64_t n, uint64_t threshold);
/// Keeps key > threshold and the first `ties_kept` elements with key == threshold.
using ThresholdMaskFn = void (*)(const void* w, int elem_size, int64_t n, uint64_t threshold,
                                 int64_t ties_kept, uint8_t* bits);

// ---- The table ----------------------------------------------------------------------------------

/// int8 optimizer moments (kernels/cpu/lowbit_state.h): n float32 values to codes (int8 when
/// is_signed, the first moment's map; else uint8, the second's) and one absmax per block of
/// `block` elements (the range starts on a block), and back.
using LowbitEncodeFn = void (*)(const float* x, int64_t n, int64_t block, bool is_signed,
                                void* codes, float* absmax);
using LowbitDecodeFn = void (*)(const void* codes, bool is_signed, const float* absmax, int64_t n,
                                int64_t block, float* out);

/// The optimizer area's kernels (torchspeed.optim, torchspeed.ops.grad_stats).
struct OptimKernels {
  GradStatsFn grad_stats;
  OptimFn adam;
  OptimFn sgd;
  OptimFn lion;
  OptimFn lamb_phase1;  // updates the moments, returns ||param||^2 and ||update||^2
  OptimFn lamb_phase2;  // recomputes the update from the new moments, applies step_size * it
  LowbitEncodeFn lowbit_encode;
  LowbitDecodeFn lowbit_decode;
};

/// The data area's kernels (torchspeed.data's image transforms).
struct DataKernels {
  ResampleHorizontalFn resample_horizontal;
  ResampleVerticalFn resample_vertical;
};

/// The dist area's kernels (torchspeed.dist's reducer, torchspeed.ops.scale_cast_).
struct DistKernels {
  ScaleCastFn scale_cast;
};

/// The quant area's kernels (torchspeed.quant).
struct QuantKernels {
  QuantizeInt8Fn quantize_int8;
  DequantizeInt8Fn dequantize_int8;
  FakeQuantizeFn fake_quantize;
  FakeQuantizeBackwardFn fake_quantize_backward;
  Int8LinearKernels int8_linear;
};

/// The prune area's kernels (torchspeed.prune).
struct PruneKernels {
  PackMaskFn pack_mask;
  UnpackMaskFn unpack_mask;
  ApplyMaskFn apply_mask;
  NmMaskFn nm_mask;
  CountKeyFn count_key;
  ThresholdMaskFn threshold_mask;
};

/// Every CPU kernel of one ISA, grouped per area. One instance per ISA unit; see dispatch.h for
/// the choice (TORCHSPEED_CPU_ISA applies to all of them).
struct CpuKernelTable {
  Isa isa;
  const char* name;
  OptimKernels optim;
  DataKernels data;
  DistKernels dist;
  QuantKernels quant;
  PruneKernels prune;
};

}  // namespace torchspeed::kernels::cpu
