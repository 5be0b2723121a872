// Fused optimizer step kernels (Adam/AdamW, SGD, Lion, LAMB) as templates over the vector type.
//
// One pass per chunk: load grad (any float storage) and unscale/clip it in registers, load the
// fp32 master (or the param), update the fp32 state, write state, master and rounded param, and
// optionally apply a pruning mask and update an EMA copy. The arithmetic mirrors the order of
// operations of torch.optim's for-loop implementation (explicit fma where its vectorised CPU
// kernels use fmadd; addcmul is fma(value * t1, t2, self) as in torch's CPU kernel), so fp32
// results agree to an ulp or so per step.
#pragma once

#include "kernels/cpu/lowbit_state.h"
#include "kernels/cpu/mask_bits.h"

// The per-element helpers below are inlined into every range function: with the low-bit
// one-moment ranges the unit has enough call sites that GCC's unit-growth limit left store_param
// out of line otherwise (a call per vector in every optimizer's loop). The range functions take
// the tensor, hyperparameters and scalars by value: through references, every float store of the
// loop might alias them, and the compiler reloaded pointers, flags and scalars in every iteration.
#if defined(__GNUC__)
#define TORCHSPEED_ELEMENT_INLINE inline __attribute__((always_inline))
#else
#define TORCHSPEED_ELEMENT_INLINE inline
#endif

namespace torchspeed::kernels::cpu {
namespace TORCHSPEED_CPU_ISA_NAMESPACE {

/// Calls body(V-tag, i) over [0, n) in steps of V::kWidth, then body(scalar-tag, i) for the tail,
/// so vector body and tail share one definition of the math.
template <class V, class Body>
inline void for_each_lane(int64_t n, Body&& body) {
  using S = typename V::Scalar;
  constexpr int64_t W = V::kWidth;
  int64_t i = 0;
  for (; i + W <= n; i += W) body(V(0.f), i);
  for (; i < n; ++i) body(S(0.f), i);
}

/// Reads the parameter's current fp32 value: the master when there is one.
template <class U, typename P>
TORCHSPEED_ELEMENT_INLINE U load_param(const OptimTensor& c, int64_t i) {
  return c.master ? U::load(c.master + i) : U::load(static_cast<const P*>(c.param) + i);
}

/// Writes the new parameter value: mask, master, rounded param, EMA.
template <class U, typename P>
TORCHSPEED_ELEMENT_INLINE void store_param(const OptimTensor& c, const OptimHyper& h, int64_t i,
                                           U p) {
  if (c.mask) p = keep_bits(c.mask, i, p);
  if (c.master) p.store(c.master + i);
  p.store(static_cast<P*>(c.param) + i);
  if (c.ema) {
    const U e = U::load(c.ema + i);
    fma(U(h.one_minus_ema_decay), p - e, e).store(c.ema + i);
  }
}

/// The gradient as the update sees it: scaled (AMP unscale x clip coefficient) and negated for
/// maximize.
template <class U, typename G>
TORCHSPEED_ELEMENT_INLINE U load_grad(const OptimTensor& c, const OptimHyper& h,
                                      const StepScalars& s, int64_t i) {
  U g = U::load(static_cast<const G*>(c.grad) + i);
  if (s.grad_scale != 1.f) g = g * U(s.grad_scale);
  return h.maximize ? -g : g;
}

template <class V, typename P, typename G>
void adam_range(const OptimTensor c, const OptimHyper h, const StepScalars s) {
  for_each_lane<V>(c.numel, [&](auto tag, int64_t i) {
    using U = decltype(tag);
    U g = load_grad<U, G>(c, h, s, i);
    U p = load_param<U, P>(c, i);
    if (h.weight_decay != 0.f) {
      if (h.decoupled_weight_decay) {
        p = p * U(s.param_decay);  // param.mul_(1 - lr * wd)
      } else {
        g = fma(p, U(h.weight_decay), g);  // grad.add(param, alpha=wd)
      }
    }
    U m = U::load(c.exp_avg + i);
    m = fma(U(h.one_minus_beta1), g - m, m);  // exp_avg.lerp_(grad, 1 - beta1)
    m.store(c.exp_avg + i);
    U v = U::load(c.exp_avg_sq + i) * U(h.beta2_f);  // exp_avg_sq.mul_(beta2)
    v = fma(U(h.one_minus_beta2) * g, g, v);         // .addcmul_(grad, grad, value=1 - beta2)
    v.store(c.exp_avg_sq + i);
    if (h.amsgrad) {
      v = max(U::load(c.max_exp_avg_sq + i), v);
      v.store(c.max_exp_avg_sq + i);
    }
    const U denom = sqrt(v) / U(s.bias_correction2_sqrt) + U(h.eps);
    p = p + U(-s.step_size) * m / denom;  // param.addcdiv_(exp_avg, denom, value=-step_size)
    store_param<U, P>(c, h, i, p);
  });
}

// Adam with low-bit moments (amsgrad is refused by the op): the same math as adam_range on fp32
// moments dequantized from storage, except that the bias correction of the denominator is a
// multiplication by its inverse. The int8 step runs each block in two short loops instead of one
// long one: the moments first (into an L1 buffer), then the param update (square root and
// division) and the codes; short loop bodies let the out-of-order core overlap more iterations of
// the long sqrt/div dependency chain (1.67 -> 1.52 ns/param on one Zen 3 core).

/// The new moments of element i from its fp32 moments (L2 weight decay folded into the grad).
template <class U, typename P, typename G>
TORCHSPEED_ELEMENT_INLINE void adam_lowbit_moments(const OptimTensor& c, const OptimHyper& h,
                                                   const StepScalars& s, int64_t i, U& m, U& v) {
  U g = load_grad<U, G>(c, h, s, i);
  if (h.weight_decay != 0.f && !h.decoupled_weight_decay) {
    g = fma(load_param<U, P>(c, i), U(h.weight_decay), g);
  }
  m = fma(U(h.one_minus_beta1), g - m, m);
  v = fma(U(h.one_minus_beta2) * g, g, v * U(h.beta2_f));
}

/// The param update of element i from its new moments (decoupled weight decay first).
template <class U, typename P>
TORCHSPEED_ELEMENT_INLINE void adam_lowbit_param(const OptimTensor& c, const OptimHyper& h,
                                                 const StepScalars& s,
                                                 float inv_bias_correction2_sqrt, int64_t i, U m,
                                                 U v) {
  U p = load_param<U, P>(c, i);
  if (h.weight_decay != 0.f && h.decoupled_weight_decay) p = p * U(s.param_decay);
  const U denom = fma(sqrt(v), U(inv_bias_correction2_sqrt), U(h.eps));
  p = p + U(-s.step_size) * m / denom;
  store_param<U, P>(c, h, i, p);
}

/// Adam with bf16 moments: load, update, store rounded stochastically (one hash per element), in
/// one loop (measured: the two-loop form of the int8 step does not pay here).
template <class V, typename P, typename G>
void adam_bf16_range(const OptimTensor c, const OptimHyper h, const StepScalars s) {
  const float inv_bc2 = 1.f / s.bias_correction2_sqrt;
  const uint32_t salt = sr_range_salt(c.sr_salt, c.sr_index);
  const auto first = static_cast<uint32_t>(c.sr_index);
  bf16* const m_ptr = static_cast<bf16*>(c.exp_avg_lp);
  bf16* const v_ptr = static_cast<bf16*>(c.exp_avg_sq_lp);
  for_each_lane<V>(c.numel, [&](auto tag, int64_t i) {
    using U = decltype(tag);
    using I = typename U::I32;
    U m = U::load(m_ptr + i);
    U v = U::load(v_ptr + i);
    adam_lowbit_moments<U, P, G>(c, h, s, i, m, v);
    adam_lowbit_param<U, P>(c, h, s, inv_bc2, i, m, v);
    const I noise = sr_noise<U>(first + static_cast<uint32_t>(i), salt);
    store_bf16_stochastic(m, srl(noise, 16), m_ptr + i);
    store_bf16_stochastic(v, noise & I::from_u32(0xFFFFu), v_ptr + i);
  });
}

/// Adam with int8 moments, block by block: dequantize with the old absmax and update the moments
/// (into an L1 buffer, finding the block's new absmaxes), then update the params and write the
/// codes.
template <class V, typename P, typename G>
void adam_int8_range(const OptimTensor c, const OptimHyper h, const StepScalars s) {
  using S = typename V::Scalar;
  const int64_t block = h.state_block;
  const float inv_bc2 = 1.f / s.bias_correction2_sqrt;
  int8_t* const m_codes = static_cast<int8_t*>(c.exp_avg_lp);
  uint8_t* const v_codes = static_cast<uint8_t*>(c.exp_avg_sq_lp);
  alignas(64) float m_new[kMaxStateBlock];
  alignas(64) float v_new[kMaxStateBlock];
  for (int64_t b0 = 0; b0 < c.numel; b0 += block) {
    const int64_t len = c.numel - b0 < block ? c.numel - b0 : block;
    const int64_t k = b0 / block;
    const float m_absmax = c.exp_avg_absmax[k];
    const float v_absmax = c.exp_avg_sq_absmax[k];
    V m_max_v(0.f), v_max_v(0.f);
    S m_max_s(0.f), v_max_s(0.f);
    for_each_lane<V>(len, [&](auto tag, int64_t j) {
      using U = decltype(tag);
      const int64_t i = b0 + j;
      U m = dequant_m<U>(m_codes + i, m_absmax);
      U v = dequant_v<U>(v_codes + i, v_absmax);
      adam_lowbit_moments<U, P, G>(c, h, s, i, m, v);
      m.store(m_new + j);
      v.store(v_new + j);
      if constexpr (U::kWidth == V::kWidth && V::kWidth > 1) {
        m_max_v = max(abs(m), m_max_v);
        v_max_v = max(v, v_max_v);
      } else {
        m_max_s = max(abs(m), m_max_s);
        v_max_s = max(v, v_max_s);
      }
    });
    const float m_amax = block_max(m_max_v, m_max_s);
    const float v_amax = block_max(v_max_v, v_max_s);
    c.exp_avg_absmax[k] = m_amax;
    c.exp_avg_sq_absmax[k] = v_amax;
    const float m_inv = inverse_absmax(m_amax);
    const float v_inv = inverse_absmax(v_amax);
    for_each_lane<V>(len, [&](auto tag, int64_t j) {
      using U = decltype(tag);
      const int64_t i = b0 + j;
      const U m = U::load(m_new + j);
      const U v = U::load(v_new + j);
      adam_lowbit_param<U, P>(c, h, s, inv_bc2, i, m, v);
      quant_m(m, m_inv, m_codes + i);
      quant_v(v, v_inv, v_codes + i);
    });
  }
}

/// int8 state from float32 values (a load, a conversion): per block the absmax (max |x| for the
/// signed map, max x for the unsigned one; NaN skipped), then the codes, with the step's own
/// functions, so a loaded state is exactly what the step would have written.
template <class V>
void lowbit_encode(const float* x, int64_t n, int64_t block, bool is_signed, void* codes,
                   float* absmax) {
  using S = typename V::Scalar;
  for (int64_t b0 = 0; b0 < n; b0 += block) {
    const int64_t len = n - b0 < block ? n - b0 : block;
    V max_v(0.f);
    S max_s(0.f);
    for_each_lane<V>(len, [&](auto tag, int64_t j) {
      using U = decltype(tag);
      const U t = is_signed ? abs(U::load(x + b0 + j)) : U::load(x + b0 + j);
      if constexpr (U::kWidth == V::kWidth && V::kWidth > 1) {
        max_v = max(t, max_v);
      } else {
        max_s = max(t, max_s);
      }
    });
    const float amax = block_max(max_v, max_s);
    absmax[b0 / block] = amax;
    const float inv = inverse_absmax(amax);
    for_each_lane<V>(len, [&](auto tag, int64_t j) {
      using U = decltype(tag);
      const U t = U::load(x + b0 + j);
      if (is_signed) {
        quant_m(t, inv, static_cast<int8_t*>(codes) + b0 + j);
      } else {
        quant_v(t, inv, static_cast<uint8_t*>(codes) + b0 + j);
      }
    });
  }
}

/// float32 values from int8 state, with the step's own dequantization.
template <class V>
void lowbit_decode(const void* codes, bool is_signed, const float* absmax, int64_t n, int64_t block,
                   float* out) {
  for (int64_t b0 = 0; b0 < n; b0 += block) {
    const int64_t len = n - b0 < block ? n - b0 : block;
    const float a = absmax[b0 / block];
    for_each_lane<V>(len, [&](auto tag, int64_t j) {
      using U = decltype(tag);
      const U t = is_signed ? dequant_m<U>(static_cast<const int8_t*>(codes) + b0 + j, a)
                            : dequant_v<U>(static_cast<const uint8_t*>(codes) + b0 + j, a);
      t.store(out + b0 + j);
    });
  }
}

/// SGD's update of element i: writes the param and, with momentum, returns the new buffer from
/// the fp32 buffer `buf` (not read on the first step: the buffer starts as the grad).
template <class U, typename P, typename G>
TORCHSPEED_ELEMENT_INLINE U sgd_update(const OptimTensor& c, const OptimHyper& h,
                                       const StepScalars& s, int64_t i, U buf) {
  U g = load_grad<U, G>(c, h, s, i);
  U p = load_param<U, P>(c, i);
  if (h.weight_decay != 0.f) g = fma(p, U(h.weight_decay), g);
  if (h.momentum != 0.f) {
    buf = h.first_step ? g : fma(g, U(h.one_minus_dampening), buf * U(h.momentum));
    g = h.nesterov ? fma(buf, U(h.momentum), g) : buf;
  }
  p = fma(g, U(-s.lr), p);
  store_param<U, P>(c, h, i, p);
  return buf;
}

template <class V, typename P, typename G>
void sgd_range(const OptimTensor c, const OptimHyper h, const StepScalars s) {
  const bool has_buffer = h.momentum != 0.f;
  for_each_lane<V>(c.numel, [&](auto tag, int64_t i) {
    using U = decltype(tag);
    // One call site, so that the compiler inlines the update into the loop.
    const U buf = has_buffer && !h.first_step ? U::load(c.exp_avg + i) : U(0.f);
    const U new_buf = sgd_update<U, P, G>(c, h, s, i, buf);
    if (has_buffer) new_buf.store(c.exp_avg + i);
  });
}

/// Lion's update of element i from its fp32 moment m: writes the param, returns the new moment.
template <class U, typename P, typename G>
TORCHSPEED_ELEMENT_INLINE U lion_update(const OptimTensor& c, const OptimHyper& h,
                                        const StepScalars& s, int64_t i, U m) {
  const U g = load_grad<U, G>(c, h, s, i);
  U p = load_param<U, P>(c, i);
  if (h.weight_decay != 0.f) p = p * U(s.param_decay);
  const U direction = sign(fma(U(h.one_minus_beta1), g - m, m));  // sign(lerp(m, g, 1 - b1))
  p = fma(direction, U(-s.lr), p);
  store_param<U, P>(c, h, i, p);
  return fma(U(h.one_minus_beta2), g - m, m);  // m = lerp(m, g, 1 - b2)
}

template <class V, typename P, typename G>
void lion_range(const OptimTensor c, const OptimHyper h, const StepScalars s) {
  for_each_lane<V>(c.numel, [&](auto tag, int64_t i) {
    using U = decltype(tag);
    lion_update<U, P, G>(c, h, s, i, U::load(c.exp_avg + i)).store(c.exp_avg + i);
  });
}

// One signed low-bit moment (Lion's exp_avg, SGD's momentum buffer): the same element math as
// the fp32 step on the moment dequantized from storage, written back in the step's format with
// Adam's first-moment machinery (kernels/cpu/lowbit_state.h). `update(m, i)` takes element i's
// fp32 moment (a vector or the scalar tail), writes the param and returns the new moment.

/// bf16 moment: load, update, store rounded stochastically with the high 16 bits of the
/// element's hash (the bits Adam's first moment takes).
template <class V, class Update>
void signed_moment_bf16_range(const OptimTensor& c, Update&& update) {
  const uint32_t salt = sr_range_salt(c.sr_salt, c.sr_index);
  const auto first = static_cast<uint32_t>(c.sr_index);
  bf16* const m_ptr = static_cast<bf16*>(c.exp_avg_lp);
  for_each_lane<V>(c.numel, [&](auto tag, int64_t i) {
    using U = decltype(tag);
    const U m = update(U::load(m_ptr + i), i);
    store_bf16_stochastic(m, srl(sr_noise<U>(first + static_cast<uint32_t>(i), salt), 16),
                          m_ptr + i);
  });
}

/// int8 moment, block by block: dequantize with the old absmax and update (params written, new
/// moments into an L1 buffer, finding the block's new absmax), then write the codes, rounded
/// stochastically (the low 20 bits of the element's hash; see quant_m_stochastic).
template <class V, class Update>
void signed_moment_int8_range(const OptimTensor& c, int64_t block, Update&& update) {
  using S = typename V::Scalar;
  const uint32_t salt = sr_range_salt(c.sr_salt, c.sr_index);
  const auto first = static_cast<uint32_t>(c.sr_index);
  int8_t* const codes = static_cast<int8_t*>(c.exp_avg_lp);
  alignas(64) float m_new[kMaxStateBlock];
  for (int64_t b0 = 0; b0 < c.numel; b0 += block) {
    const int64_t len = c.numel - b0 < block ? c.numel - b0 : block;
    const int64_t k = b0 / block;
    const float absmax = c.exp_avg_absmax[k];
    V max_v(0.f);
    S max_s(0.f);
    for_each_lane<V>(len, [&](auto tag, int64_t j) {
      using U = decltype(tag);
      const U m = update(dequant_m<U>(codes + b0 + j, absmax), b0 + j);
      m.store(m_new + j);
      if constexpr (U::kWidth == V::kWidth && V::kWidth > 1) {
        max_v = max(abs(m), max_v);
      } else {
        max_s = max(abs(m), max_s);
      }
    });
    const float amax = block_max(max_v, max_s);
    c.exp_avg_absmax[k] = amax;
    const float inv = inverse_absmax(amax);
    for_each_lane<V>(len, [&](auto tag, int64_t j) {
      using U = decltype(tag);
      const auto noise = sr_noise<U>(first + static_cast<uint32_t>(b0 + j), salt);
      quant_m_stochastic(U::load(m_new + j), inv, noise & U::I32::from_u32(0xFFFFFu),
                         codes + b0 + j);
    });
  }
}

/// SGD with a bf16 or int8 momentum buffer (h.state_format; momentum != 0, checked by the op).
template <class V, typename P, typename G>
void sgd_lowbit_range(const OptimTensor c, const OptimHyper h, const StepScalars s) {
  auto update = [&](auto buf, int64_t i) {
    return sgd_update<decltype(buf), P, G>(c, h, s, i, buf);
  };
  if (h.state_format == StateFormat::kInt8) {
    signed_moment_int8_range<V>(c, h.state_block, update);
  } else {
    signed_moment_bf16_range<V>(c, update);
  }
}

/// Lion with a bf16 or int8 moment (h.state_format).
template <class V, typename P, typename G>
void lion_lowbit_range(const OptimTensor c, const OptimHyper h, const StepScalars s) {
  auto update = [&](auto m, int64_t i) { return lion_update<decltype(m), P, G>(c, h, s, i, m); };
  if (h.state_format == StateFormat::kInt8) {
    signed_moment_int8_range<V>(c, h.state_block, update);
  } else {
    signed_moment_bf16_range<V>(c, update);
  }
}

/// LAMB's raw update u = m_hat / (sqrt(v_hat) + eps) + wd * p, from the updated moments.
template <class U>
inline U lamb_update(const OptimTensor& c, const OptimHyper& h, const StepScalars& s, int64_t i,
                     U p) {
  const U m_hat = U::load(c.exp_avg + i) / U(s.bias_correction1);
  const U v_hat = U::load(c.exp_avg_sq + i) / U(s.bias_correction2);
  return fma(U(h.weight_decay), p, m_hat / (sqrt(v_hat) + U(h.eps)));
}

template <class V, typename P, typename G>
void lamb_phase1_range(const OptimTensor c, const OptimHyper h, const StepScalars s,
                       double* param_sumsq, double* update_sumsq) {
  V p_acc(0.f), u_acc(0.f);
  typename V::Scalar p_tail(0.f), u_tail(0.f);
  for_each_lane<V>(c.numel, [&](auto tag, int64_t i) {
    using U = decltype(tag);
    const U g = load_grad<U, G>(c, h, s, i);
    const U p = load_param<U, P>(c, i);
    U m = U::load(c.exp_avg + i);
    fma(U(h.one_minus_beta1), g - m, m).store(c.exp_avg + i);
    U v = U::load(c.exp_avg_sq + i) * U(h.beta2_f);
    fma(U(h.one_minus_beta2) * g, g, v).store(c.exp_avg_sq + i);
    const U u = lamb_update<U>(c, h, s, i, p);
    if constexpr (U::kWidth == V::kWidth && V::kWidth > 1) {
      p_acc = fma(p, p, p_acc);
      u_acc = fma(u, u, u_acc);
    } else {
      p_tail = fma(p, p, p_tail);
      u_tail = fma(u, u, u_tail);
    }
  });
  *param_sumsq = p_acc.reduce_add() + p_tail.reduce_add();
  *update_sumsq = u_acc.reduce_add() + u_tail.reduce_add();
}

template <class V, typename P, typename G>
void lamb_phase2_range(const OptimTensor c, const OptimHyper h, const StepScalars s) {
  for_each_lane<V>(c.numel, [&](auto tag, int64_t i) {
    using U = decltype(tag);
    U p = load_param<U, P>(c, i);
    p = fma(lamb_update<U>(c, h, s, i, p), U(-s.step_size), p);
    store_param<U, P>(c, h, i, p);
  });
}

/// Dispatches a range function over the (param, grad) storage types.
template <template <class, typename, typename> class Range, class V, typename... Extra>
void dispatch_storage(const OptimTensor& c, const OptimHyper& h, const StepScalars& s,
                      Extra... extra) {
  auto with_grad = [&](auto param_tag) {
    using P = decltype(param_tag);
    switch (c.grad_dtype) {
      case DType::kBFloat16:
        return Range<V, P, bf16>::run(c, h, s, extra...);
      case DType::kHalf:
        return Range<V, P, fp16>::run(c, h, s, extra...);
      default:
        return Range<V, P, float>::run(c, h, s, extra...);
    }
  };
  switch (c.param_dtype) {
    case DType::kBFloat16:
      return with_grad(bf16{});
    case DType::kHalf:
      return with_grad(fp16{});
    default:
      return with_grad(float{});
  }
}

#define TORCHSPEED_OPTIM_RANGE(NAME, FN)                                                           \
  template <class V, typename P, typename G>                                                       \
  struct NAME {                                                                                    \
    template <typename... A>                                                                       \
    static void run(const OptimTensor& c, const OptimHyper& h, const StepScalars& s, A... extra) { \
      FN<V, P, G>(c, h, s, extra...);                                                              \
    }                                                                                              \
  };
TORCHSPEED_OPTIM_RANGE(AdamRange, adam_range)
TORCHSPEED_OPTIM_RANGE(AdamBf16Range, adam_bf16_range)
TORCHSPEED_OPTIM_RANGE(AdamInt8Range, adam_int8_range)
TORCHSPEED_OPTIM_RANGE(SgdRange, sgd_range)
TORCHSPEED_OPTIM_RANGE(SgdLowbitRange, sgd_lowbit_range)
TORCHSPEED_OPTIM_RANGE(LionRange, lion_range)
TORCHSPEED_OPTIM_RANGE(LionLowbitRange, lion_lowbit_range)
TORCHSPEED_OPTIM_RANGE(LambPhase1Range, lamb_phase1_range)
TORCHSPEED_OPTIM_RANGE(LambPhase2Range, lamb_phase2_range)
#undef TORCHSPEED_OPTIM_RANGE

// The table entries (all share OptimFn's signature; only LAMB phase 1 uses the norm outputs).
template <class V>
void adam_step(const OptimTensor& c, const OptimHyper& h, const StepScalars& s, double*, double*) {
  if (h.state_format == StateFormat::kBFloat16) return dispatch_storage<AdamBf16Range, V>(c, h, s);
  if (h.state_format == StateFormat::kInt8) return dispatch_storage<AdamInt8Range, V>(c, h, s);
  dispatch_storage<AdamRange, V>(c, h, s);
}
template <class V>
void sgd_step(const OptimTensor& c, const OptimHyper& h, const StepScalars& s, double*, double*) {
  if (h.state_format != StateFormat::kFloat) return dispatch_storage<SgdLowbitRange, V>(c, h, s);
  dispatch_storage<SgdRange, V>(c, h, s);
}
template <class V>
void lion_step(const OptimTensor& c, const OptimHyper& h, const StepScalars& s, double*, double*) {
  if (h.state_format != StateFormat::kFloat) return dispatch_storage<LionLowbitRange, V>(c, h, s);
  dispatch_storage<LionRange, V>(c, h, s);
}
template <class V>
void lamb_phase1(const OptimTensor& c, const OptimHyper& h, const StepScalars& s, double* p_sumsq,
                 double* u_sumsq) {
  dispatch_storage<LambPhase1Range, V>(c, h, s, p_sumsq, u_sumsq);
}
template <class V>
void lamb_phase2(const OptimTensor& c, const OptimHyper& h, const StepScalars& s, double*,
                 double*) {
  dispatch_storage<LambPhase2Range, V>(c, h, s);
}

}  // namespace TORCHSPEED_CPU_ISA_NAMESPACE
}  // namespace torchspeed::kernels::cpu
