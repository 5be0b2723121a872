// Host-side API of the torch-free CUDA kernel layer: plain structs of raw device pointers and the
// launch functions the op glue (csrc/ops/cuda) calls. Includable by a host C++ compiler.
//
//   kernels::cuda::GradStatsTensor t{ptr, numel, kernels::cuda::DType::kFloat};
//   cudaError_t e = kernels::cuda::grad_stats(&t, 1, nullptr, workspace, total, nullptr,
//                                             found_inf, stream);
//
// Every function only enqueues work on `stream` (kernels and cudaMemsetAsync): nothing waits for
// the device, nothing copies from or to the host, so it is safe under
// torch.cuda.set_sync_debug_mode("error") and inside CUDA graph capture. Errors are the launch
// errors (cudaGetLastError after each launch); the caller turns them into exceptions.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "kernels/common/optim_types.h"

namespace torchspeed::kernels::cuda {

using kernels::DType;
using kernels::OptimAlgo;
using kernels::OptimHyper;
using kernels::OptimTensor;
using kernels::StateFormat;

// ---- grad_stats ---------------------------------------------------------------------------------

/// One contiguous tensor of a grad_stats call. Its position in the array is its index in the
/// per-tensor outputs. numel == 0 is allowed (skipped).
struct GradStatsTensor {
  void* data;
  int64_t numel;
  DType dtype;
};

/// Sum of squares per tensor and a non-finite flag in one pass (and, when inv_scale is set, an
/// in-place multiply by *inv_scale in the same pass; the flag looks at the values before it).
///   workspace         `count` doubles of device memory (zeroed here)
///   total_norm        1 float: sqrt of the sum over all tensors
///   per_tensor_norms  `count` floats or null
///   found_inf         1 float: set to 0 here, then 1.0 by any block that saw inf/NaN
cudaError_t grad_stats(const GradStatsTensor* tensors, int64_t count, const float* inv_scale,
                       double* workspace, float* total_norm, float* per_tensor_norms,
                       float* found_inf, cudaStream_t stream);

// ---- fused optimizer steps ----------------------------------------------------------------------

/// The one-element float32 device tensors a step reads on the device, or null.
struct DeviceScalars {
  const float* lr;          // overrides OptimHyper::lr
  const float* grad_scale;  // grads are multiplied by float(1.0 / double(*grad_scale))
  const float* found_inf;   // != 0: nothing is written, steps are not incremented
  const float* clip_coef;   // grads are also multiplied by it
};

/// One fused step over all `count` params of a group (OptimTensor: the whole tensors, contiguous or
/// laid out like their params, with `step` set for Adam, Lion and LAMB): increments the steps on
/// the device (unless *found_inf != 0), then runs the update: one launch per 24 tensors / 320
/// chunks of 64K elements (4 blocks per chunk) and per (param dtype, grad dtype) pair present. LAMB
/// runs phase 1 (moments and norms) over all tensors, then phase 2 (trust-ratio update);
/// `lamb_workspace` is 2 * count doubles of device memory (zeroed here), null for the other
/// algorithms. Adam, Lion and SGD (with momentum) with hyper.state_format kBFloat16 / kInt8
/// (adam_lowbit_step_, lion_lowbit_step_, sgd_lowbit_step_) read and write the low-bit moments
/// (exp_avg_lp, Adam's exp_avg_sq_lp and, for int8, the absmaxes; sr_index 0) instead of exp_avg /
/// exp_avg_sq: bf16 rounded stochastically with the CPU's hash, int8 one quantization block per
/// group of threads, Lion's and SGD's codes rounded stochastically (optim_lowbit.cu); the same bits
/// as the CPU kernels. LAMB has no low-bit step (cudaErrorInvalidValue). `lamb_phase` 1 runs
/// LAMB's phase 1 only (steps counted, moments updated, the sums left in lamb_workspace), 2 its
/// phase 2 only (steps not counted again; the sums read from lamb_workspace), 0 both.
cudaError_t optim_step(OptimAlgo algo, const OptimTensor* tensors, int64_t count,
                       const OptimHyper& hyper, const DeviceScalars& scalars,
                       double* lamb_workspace, cudaStream_t stream, int lamb_phase = 0);

namespace detail {
/// optim_step's update for Adam, Lion or SGD with low-bit moments (optim_lowbit.cu), once the
/// steps are incremented.
cudaError_t lowbit_update(OptimAlgo algo, const OptimTensor* tensors, int64_t count,
                          const OptimHyper& hyper, const DeviceScalars& scalars,
                          cudaStream_t stream);
}  // namespace detail

// ---- dist: the reducer's bucket pass ------------------------------------------------------------

/// out = in * scale over `n` contiguous elements, fp32/bf16/fp16 into fp32/bf16/fp16 (or fp64 into
/// fp64), rounded once; `in` may equal `out`. cudaErrorInvalidValue for another dtype pair.
cudaError_t scale_cast(DType in_dtype, const void* in, DType out_dtype, void* out, double scale,
                       int64_t n, cudaStream_t stream);

// ---- quant: int8 affine quantize / dequantize ---------------------------------------------------

/// The layout of a quant call: x as [rows, cols]; `groups` scales per row, 0 = one for all.
struct QuantLayout {
  int64_t rows;
  int64_t cols;
  int64_t groups;
};

/// q = clamp(round_half_even(x * (1 / scale[s])) + zero_point[s], -128, 127) for fp32/bf16/fp16 x
/// (zero_point may be null: 0), s the element's scale index under `layout`.
cudaError_t quantize_int8(DType in_dtype, const void* x, int8_t* q, QuantLayout layout,
                          const float* scale, const int32_t* zero_point, cudaStream_t stream);
/// out = (q - zero_point[s]) * scale[s], float32.
cudaError_t dequantize_int8(const int8_t* q, float* out, QuantLayout layout, const float* scale,
                            const int32_t* zero_point, cudaStream_t stream);

/// Fake quantization (quant_fake_quant.cu), fp32/bf16/fp16 x into y of the same dtype, in fp32:
///   v = round_half_even(x * (1 / scale[s])) + zero_point[s] (zero_point may be null: 0)
///   y = (clamp(v, quant_min, quant_max) - zero_point[s]) * scale[s], mask = quant_min <= v <=
///   quant_max
/// (mask: bytes 0/1, a bool tensor's storage). The CPU kernels' and torch's numbers bit for bit.
cudaError_t fake_quantize(DType dtype, const void* x, void* y, uint8_t* mask, QuantLayout layout,
                          const float* scale, const int32_t* zero_point, float quant_min,
                          float quant_max, cudaStream_t stream);
/// out = grad * mask (mask bytes 0 / 1 as 0.0 / 1.0), n elements of fp32/bf16/fp16 grad.
cudaError_t fake_quantize_backward(DType dtype, const void* grad, const uint8_t* mask, void* out,
                                   int64_t n, cudaStream_t stream);

// ---- quant: the int8 Linear (dynamic per-row activations, per-channel int8 weights) -------------
// The CPU kernels (kernels/cpu/quant_int8_gemm.h) compute the same numbers bit for bit: the row
// scale, the rounding, the exact int32 accumulation and the fp32 epilogue below, in this order,
// with no fused multiply-add (__fmul_rn / __fadd_rn on the device).

/// Per-row symmetric dynamic quantization of x viewed as [rows, cols] (fp32/bf16/fp16, contiguous):
///   absmax = max_k |x[m, k]| (in fp32), scale[m] = absmax / 127 (fp32 division), or 1 when
///   absmax == 0; q[m, k] = clamp(round_half_even(x[m, k] * (1 / scale[m])), -127, 127).
/// A row holding inf or NaN gets scale[m] = NaN (its output row is then NaN; q is unspecified).
cudaError_t quantize_rows_int8(DType in_dtype, const void* x, int64_t rows, int64_t cols, int8_t* q,
                               float* scale, cudaStream_t stream);

/// out[m, n] = act(float(acc[m, n]) * (a_scale[m] * w_scale[n]) + bias[n]) with
/// acc[m, n] = sum_k a[m, k] * w[n, k] in exact int32 (a: [M, K] int8, w: [N, K] int8 in
/// [-127, 127], both row-major and contiguous), the epilogue in fp32 without FMA contraction, act =
/// ReLU when `relu`, else identity; bias (fp32, [N]) may be null; out is [M, N] of `out_dtype`
/// (fp32/bf16/fp16, rounded once, to nearest even). Any M, N, K >= 1 (no padding asked of the
/// caller). int8 tensor cores (mma.sync) on sm_80 and later.
cudaError_t int8_linear(const int8_t* a, const float* a_scale, const int8_t* w,
                        const float* w_scale, const float* bias, bool relu, DType out_dtype,
                        void* out, int64_t M, int64_t N, int64_t K, cudaStream_t stream);

// ---- int8 optimizer state (lowbit.cu; maps in kernels/common/lowbit_codes.h) -------------------
/// codes (int8 when is_signed, else uint8) and one absmax per block of `block` elements of x.
cudaError_t lowbit_encode(const float* x, int64_t n, int64_t block, bool is_signed, void* codes,
                          float* absmax, cudaStream_t stream);
/// out = the float32 values of the codes.
cudaError_t lowbit_decode(const void* codes, bool is_signed, const float* absmax, int64_t n,
                          int64_t block, float* out, cudaStream_t stream);

// ---- packed masks (mask.cu; bit j of byte b = element 8b + j, in memory order) ----------------

/// bits[b] = the {0,1} bytes bools[8b .. 8b + 7] (nonzero = 1), ceil(n / 8) bytes.
cudaError_t pack_mask_bits(const uint8_t* bools, uint8_t* bits, int64_t n, cudaStream_t stream);
/// bools[i] = bit i, n elements.
cudaError_t unpack_mask_bits(const uint8_t* bits, uint8_t* bools, int64_t n, cudaStream_t stream);
/// In place: w[i] = 0 where bit i is 0, n elements of elem_size (2, 4 or 8) bytes.
cudaError_t apply_mask_bits(void* w, int elem_size, const uint8_t* bits, int64_t n,
                            cudaStream_t stream);

// ---- prune: mask selection (prune.cu) -----------------------------------------------------------
/// N:M mask of numel elements (numel % m == 0, m <= 256): per group of m, the n largest magnitude
/// keys (|bits| without the sign) kept, an equal key ranking the lower index first.
cudaError_t prune_nm_mask(const void* w, int elem_size, int64_t numel, int n, int m, uint8_t* bits,
                          cudaStream_t stream);

}  // namespace torchspeed::kernels::cuda
