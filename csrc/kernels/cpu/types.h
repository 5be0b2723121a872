// Types shared by the CPU kernel layer and its callers: storage types, dtypes, the per-ISA table.
//
// Plain data only (no inline code), so this header can be included by the ISA units and by
// torch-aware code alike without the ODR trap described in vec.h.
#pragma once

#include <cstddef>
#include <cstdint>

namespace torchspeed::kernels::cpu {

/// 16-bit storage types, layout-compatible with c10::BFloat16 and c10::Half.
struct bf16 {
  uint16_t bits;
};
struct fp16 {
  uint16_t bits;
};

/// Element types a kernel can be asked to run on.
enum class DType : int { kFloat = 0, kDouble = 1, kBFloat16 = 2, kHalf = 3 };

/// The instruction sets a kernel is compiled for, slowest first.
enum class Isa : int { kScalar = 0, kAvx2 = 1, kAvx512 = 2 };

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

/// One contiguous range of one parameter and its state. Null pointers mean "absent".
/// `param` is updated in its own dtype; when `master` is set, the update happens on the fp32
/// master and the rounded value is written to `param`.
struct OptimChunk {
  void* param;
  DType param_dtype;
  float* master;
  const void* grad;
  DType grad_dtype;
  float* state0;      // Adam/LAMB: exp_avg; SGD: momentum_buffer; Lion: exp_avg
  float* state1;      // Adam/LAMB: exp_avg_sq
  float* state2;      // Adam: max_exp_avg_sq (amsgrad)
  const float* mask;  // pruning mask: updates (and the param) are zeroed where mask == 0
  float* ema;         // EMA copy of the (master) param, updated after the step
  int64_t n;
};

/// Per-tensor scalars of one step. Derived values (1 - beta1, lr / bias_correction1, ...) are
/// computed once on the host in double and rounded to float, as torch.optim's for-loop path does
/// with Python floats, so both round the same way.
struct OptimScalars {
  float lr;
  float weight_decay;
  float beta1;
  float beta2;
  float one_minus_beta1;
  float one_minus_beta2;
  float eps;
  float step_size;              // Adam: lr / (1 - beta1^step); LAMB: lr * trust_ratio
  float bias_correction1;       // 1 - beta1^step (LAMB)
  float bias_correction2;       // 1 - beta2^step (LAMB)
  float bias_correction2_sqrt;  // sqrt(1 - beta2^step) (Adam)
  float param_decay;            // 1 - lr * weight_decay (decoupled decay, Lion)
  float grad_scale;             // grads are multiplied by this: AMP 1/scale times clip coefficient
  float momentum;               // SGD
  float one_minus_dampening;    // SGD
  float ema_decay;              // EMA: ema += (1 - decay) * (param - ema)
  float one_minus_ema_decay;
  bool decoupled_weight_decay;  // AdamW (true) vs Adam L2 (false)
  bool amsgrad;
  bool maximize;
  bool nesterov;
  bool first_step;  // SGD: the momentum buffer is initialised from the grad
};

/// An update over one chunk; LAMB phase 1 also returns the squared norms it needs.
using OptimFn = void (*)(const OptimChunk& chunk, const OptimScalars& s, double* param_sumsq,
                         double* update_sumsq);

// ---- Data: the image resampler (resample.h) -----------------------------------------------------

/// Fraction bits of the resampler's fixed-point weights (Pillow's PRECISION_BITS).
constexpr int kResamplePrecisionBits = 32 - 8 - 2;

/// Horizontal pass over one RGB row; see resample_horizontal_row.
using ResampleHorizontalFn = void (*)(const uint8_t* row, int src_w, const int* bounds,
                                      const int* kk, int ksize, int x0, int x1, uint8_t* out);
/// Vertical pass for one output row; see resample_vertical_row.
using ResampleVerticalFn = void (*)(const uint8_t* rows, size_t stride, int first, int count,
                                    const int* k, size_t n, uint8_t* out);

// ---- The table ----------------------------------------------------------------------------------

/// The optimizer area's kernels (torchspeed.optim, torchspeed.ops.grad_stats).
struct OptimKernels {
  GradStatsFn grad_stats;
  OptimFn adam;
  OptimFn sgd;
  OptimFn lion;
  OptimFn lamb_phase1;  // updates the moments, returns ||param||^2 and ||update||^2
  OptimFn lamb_phase2;  // recomputes the update from the new moments, applies step_size * it
};

/// The data area's kernels (torchspeed.data's image transforms).
struct DataKernels {
  ResampleHorizontalFn resample_horizontal;
  ResampleVerticalFn resample_vertical;
};

/// Every CPU kernel of one ISA, grouped per area. One instance per ISA unit; see dispatch.h for
/// the choice (TORCHSPEED_CPU_ISA applies to all of them).
struct CpuKernelTable {
  Isa isa;
  const char* name;
  OptimKernels optim;
  DataKernels data;
};

}  // namespace torchspeed::kernels::cpu
