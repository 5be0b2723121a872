// CUDA fused optimizer steps (Adam/AdamW, SGD, Lion, LAMB) over multi-tensor-apply chunks.
//
// The per-element math is a line-by-line mirror of the CPU templates in kernels/cpu/optim.h
// (same operation order, explicit fma exactly where the CPU uses fma, IEEE-rounded fp32 ops
// elsewhere), and the per-tensor scalars are derived from the device step and lr exactly as
// ops/cpu/optim_cpu.cpp derives them on the host (in double, rounded to float), so CPU and CUDA
// agree to an ulp or so per step. found_inf, grad_scale, clip_coef, lr and the steps are read on
// the device: nothing synchronises with the host.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <vector>

#include "kernels/cuda/api.cuh"
#include "kernels/cuda/multi_tensor_apply.cuh"
#include "kernels/cuda/numerics.cuh"

namespace torchspeed::kernels::cuda {
namespace {

// Metadata lists (one pointer per tensor each).
enum List : int { kParam = 0, kGrad, kMaster, kState0, kState1, kState2, kMask, kEma, kStep, kDepth };

using OptimMeta = MtaMeta<kDepth, 24, 320>;

struct OptimParams {
  OptimHyper h;
  double* lamb_sumsq;  // [2 * count]: ||p||^2, ||u||^2 per tensor index (LAMB)
};
static_assert(sizeof(OptimMeta) + sizeof(OptimParams) <= kMaxKernelArgBytes,
              "optimizer kernel arguments exceed the 4 KB parameter limit");

enum class Kernel : int { kAdam, kSgd, kLion, kLambPhase1, kLambPhase2 };

/// Per-block scalars, as OptimScalars on the CPU.
struct BlockScalars {
  float lr;
  float grad_scale;  // AMP 1/scale times the clip coefficient
  float param_decay;
  float step_size;
  float bias_correction1;
  float bias_correction2;
  float bias_correction2_sqrt;
};

/// Thread 0 of a block: derives the scalars from the device lr, scale, clip and step exactly as
/// run_step() in ops/cpu/optim_cpu.cpp does on the host (double math, one rounding to float).
template <Kernel kKernel>
__device__ BlockScalars block_scalars(const OptimParams& prm, const float* step, int32_t index) {
  const OptimHyper& h = prm.h;
  BlockScalars s;
  const double lr = h.lr_tensor ? static_cast<double>(*h.lr_tensor) : h.lr;
  const float scale = h.grad_scale ? *h.grad_scale : 1.f;
  const float inv_scale = static_cast<float>(__ddiv_rn(1.0, static_cast<double>(scale)));
  s.grad_scale = __fmul_rn(inv_scale, h.clip_coef ? *h.clip_coef : 1.f);
  s.lr = static_cast<float>(lr);
  s.param_decay =
      static_cast<float>(__dsub_rn(1.0, __dmul_rn(lr, static_cast<double>(h.weight_decay))));
  s.step_size = 0.f;
  s.bias_correction1 = s.bias_correction2 = s.bias_correction2_sqrt = 1.f;
  if (step != nullptr) {
    const double t = static_cast<double>(*step);  // already incremented by step_increment_kernel
    const double bc1 = __dsub_rn(1.0, ::pow(h.beta1, t));
    const double bc2 = __dsub_rn(1.0, ::pow(h.beta2, t));
    s.bias_correction1 = static_cast<float>(bc1);
    s.bias_correction2 = static_cast<float>(bc2);
    s.bias_correction2_sqrt = static_cast<float>(__dsqrt_rn(bc2));
    s.step_size = static_cast<float>(__ddiv_rn(lr, bc1));
  }
  if constexpr (kKernel == Kernel::kLambPhase2) {
    const double w = __dsqrt_rn(prm.lamb_sumsq[2 * static_cast<int64_t>(index)]);
    const double u = __dsqrt_rn(prm.lamb_sumsq[2 * static_cast<int64_t>(index) + 1]);
    const double trust = (w > 0 && u > 0) ? __ddiv_rn(w, u) : 1.0;
    s.step_size = static_cast<float>(__dmul_rn(lr, trust));
  }
  return s;
}

/// LAMB's raw update from the updated moments (lamb_update in kernels/cpu/optim.h).
__device__ __forceinline__ float lamb_update(const OptimHyper& h, const BlockScalars& s, float m,
                                             float v, float p) {
  const float m_hat = f_div(m, s.bias_correction1);
  const float v_hat = f_div(v, s.bias_correction2);
  return f_fma(h.weight_decay, p, f_div(m_hat, f_add(f_sqrt(v_hat), h.eps)));
}

/// One block = one chunk of one param. P: param storage, G: grad storage.
template <Kernel kKernel, typename P, typename G>
__global__ void __launch_bounds__(kMtaBlockSize)
    optim_kernel(const __grid_constant__ OptimMeta meta, const OptimParams prm) {
  const OptimHyper& h = prm.h;
  // AMP: a step whose grads held inf/NaN writes nothing (uniform across the grid).
  if (h.found_inf != nullptr && *h.found_inf != 0.f) return;

  const int slot = meta.block_tensor[blockIdx.x];
  P* const param = static_cast<P*>(meta.ptr[kParam][slot]);
  const G* const grad = static_cast<const G*>(meta.ptr[kGrad][slot]);
  float* const master = static_cast<float*>(meta.ptr[kMaster][slot]);
  float* const state0 = static_cast<float*>(meta.ptr[kState0][slot]);
  float* const state1 = static_cast<float*>(meta.ptr[kState1][slot]);
  float* const state2 = static_cast<float*>(meta.ptr[kState2][slot]);
  const float* const mask = static_cast<const float*>(meta.ptr[kMask][slot]);
  float* const ema = static_cast<float*>(meta.ptr[kEma][slot]);
  const float* const step = static_cast<const float*>(meta.ptr[kStep][slot]);

  __shared__ BlockScalars shared_scalars;
  if (threadIdx.x == 0) shared_scalars = block_scalars<kKernel>(prm, step, meta.index[slot]);
  __syncthreads();
  const BlockScalars s = shared_scalars;

  const bool aligned = mta_aligned(param) && mta_aligned(grad) && mta_aligned(master) &&
                       mta_aligned(state0) && mta_aligned(state1) && mta_aligned(state2) &&
                       mta_aligned(mask) && mta_aligned(ema);
  float p_acc = 0.f, u_acc = 0.f;  // LAMB phase 1: ||p||^2, ||u||^2 of this thread

  mta_for_each_quad(meta.numel[slot], meta.block_chunk[blockIdx.x], aligned, [&](auto vec,
                                                                                 int64_t i,
                                                                                 int valid) {
    constexpr bool kVec = decltype(vec)::value;
    constexpr int N = kMtaIlp;
    // load_grad: scaled (AMP unscale x clip) and negated for maximize.
    float g[N];
    if constexpr (kKernel != Kernel::kLambPhase2) {
      load_quad<kVec>(grad, i, valid, g);
#pragma unroll
      for (int k = 0; k < N; ++k) {
        if (s.grad_scale != 1.f) g[k] = f_mul(g[k], s.grad_scale);
        if (h.maximize) g[k] = -g[k];
      }
    } else {
      (void)g;  // phase 2 recomputes the update from the moments alone
    }
    // load_param: the master when there is one.
    float p[N];
    if (master) {
      load_quad<kVec>(master, i, valid, p);
    } else {
      load_quad<kVec>(param, i, valid, p);
    }

    if constexpr (kKernel == Kernel::kAdam) {
      float m[N], v[N], vmax[N];
      load_quad<kVec>(state0, i, valid, m);
      load_quad<kVec>(state1, i, valid, v);
      if (h.amsgrad) load_quad<kVec>(state2, i, valid, vmax);
#pragma unroll
      for (int k = 0; k < N; ++k) {
        if (h.weight_decay != 0.f) {
          if (h.decoupled_weight_decay) {
            p[k] = f_mul(p[k], s.param_decay);  // param.mul_(1 - lr * wd)
          } else {
            g[k] = f_fma(p[k], h.weight_decay, g[k]);  // grad.add(param, alpha=wd)
          }
        }
        m[k] = f_fma(h.one_minus_beta1, f_sub(g[k], m[k]), m[k]);  // lerp_(grad, 1 - beta1)
        v[k] = f_fma(f_mul(h.one_minus_beta2, g[k]), g[k], f_mul(v[k], h.beta2_f));
      }
      store_quad<kVec>(state0, i, valid, m);
      store_quad<kVec>(state1, i, valid, v);
      if (h.amsgrad) {
#pragma unroll
        for (int k = 0; k < N; ++k) vmax[k] = v[k] = max_gt(vmax[k], v[k]);
        store_quad<kVec>(state2, i, valid, vmax);
      }
#pragma unroll
      for (int k = 0; k < N; ++k) {
        const float denom = f_add(f_div(f_sqrt(v[k]), s.bias_correction2_sqrt), h.eps);
        p[k] = f_add(p[k], f_div(f_mul(-s.step_size, m[k]), denom));  // addcdiv_(-step_size)
      }
    } else if constexpr (kKernel == Kernel::kSgd) {
      float buf[N];
      if (h.momentum != 0.f && !h.first_step) load_quad<kVec>(state0, i, valid, buf);
#pragma unroll
      for (int k = 0; k < N; ++k) {
        if (h.weight_decay != 0.f) g[k] = f_fma(p[k], h.weight_decay, g[k]);
        if (h.momentum != 0.f) {
          buf[k] = h.first_step ? g[k]  // first step: buffer = clone(grad)
                                : f_fma(g[k], h.one_minus_dampening, f_mul(buf[k], h.momentum));
          g[k] = h.nesterov ? f_fma(buf[k], h.momentum, g[k]) : buf[k];
        }
        p[k] = f_fma(g[k], -s.lr, p[k]);
      }
      if (h.momentum != 0.f) store_quad<kVec>(state0, i, valid, buf);
    } else if constexpr (kKernel == Kernel::kLion) {
      float m[N];
      load_quad<kVec>(state0, i, valid, m);
#pragma unroll
      for (int k = 0; k < N; ++k) {
        if (h.weight_decay != 0.f) p[k] = f_mul(p[k], s.param_decay);
        const float direction = f_sign(f_fma(h.one_minus_beta1, f_sub(g[k], m[k]), m[k]));
        p[k] = f_fma(direction, -s.lr, p[k]);
        m[k] = f_fma(h.one_minus_beta2, f_sub(g[k], m[k]), m[k]);  // m = lerp(m, g, 1 - b2)
      }
      store_quad<kVec>(state0, i, valid, m);
    } else if constexpr (kKernel == Kernel::kLambPhase1) {
      float m[N], v[N];
      load_quad<kVec>(state0, i, valid, m);
      load_quad<kVec>(state1, i, valid, v);
#pragma unroll
      for (int k = 0; k < N; ++k) {
        m[k] = f_fma(h.one_minus_beta1, f_sub(g[k], m[k]), m[k]);
        v[k] = f_fma(f_mul(h.one_minus_beta2, g[k]), g[k], f_mul(v[k], h.beta2_f));
      }
      store_quad<kVec>(state0, i, valid, m);
      store_quad<kVec>(state1, i, valid, v);
#pragma unroll
      for (int k = 0; k < N; ++k) {
        if (k < valid) {
          const float u = lamb_update(h, s, m[k], v[k], p[k]);
          p_acc = f_fma(p[k], p[k], p_acc);
          u_acc = f_fma(u, u, u_acc);
        }
      }
      return;  // phase 1 does not touch the param
    } else {  // kLambPhase2: recompute u from the new moments, apply lr * trust * u
      float m[N], v[N];
      load_quad<kVec>(state0, i, valid, m);
      load_quad<kVec>(state1, i, valid, v);
#pragma unroll
      for (int k = 0; k < N; ++k) {
        p[k] = f_fma(lamb_update(h, s, m[k], v[k], p[k]), -s.step_size, p[k]);
      }
    }

    // store_param: mask, master, rounded param, EMA.
    if (mask) {
      float mk[N];
      load_quad<kVec>(mask, i, valid, mk);
#pragma unroll
      for (int k = 0; k < N; ++k) p[k] = mk[k] != 0.f ? p[k] : 0.f;
    }
    if (master) store_quad<kVec>(master, i, valid, p);
    store_quad<kVec>(param, i, valid, p);
    if (ema) {
      float e[N];
      load_quad<kVec>(ema, i, valid, e);
#pragma unroll
      for (int k = 0; k < N; ++k) e[k] = f_fma(h.one_minus_ema_decay, f_sub(p[k], e[k]), e[k]);
      store_quad<kVec>(ema, i, valid, e);
    }
  });

  if constexpr (kKernel == Kernel::kLambPhase1) {
    const double p_sum = mta_block_sum(static_cast<double>(p_acc));
    const double u_sum = mta_block_sum(static_cast<double>(u_acc));
    if (threadIdx.x == 0) {
      double* out = prm.lamb_sumsq + 2 * static_cast<int64_t>(meta.index[slot]);
      atomicAdd(out, p_sum);
      atomicAdd(out + 1, u_sum);
    }
  }
}

// ---- steps: += 1 unless found_inf, before the update reads them ---------------------------------

constexpr int kMaxStepsPerLaunch = 500;
struct StepMeta {
  float* steps[kMaxStepsPerLaunch];
  const float* found_inf;
  int count;
};
static_assert(sizeof(StepMeta) <= kMaxKernelArgBytes, "step kernel arguments exceed 4 KB");

__global__ void __launch_bounds__(kMtaBlockSize)
    step_increment_kernel(const __grid_constant__ StepMeta meta) {
  const int i = static_cast<int>(blockIdx.x * blockDim.x + threadIdx.x);
  if (i >= meta.count) return;
  if (meta.found_inf != nullptr && *meta.found_inf != 0.f) return;
  *meta.steps[i] += 1.f;
}

cudaError_t launch_step_increment(const OptimTensor* tensors, int64_t count,
                                  const float* found_inf, cudaStream_t stream) {
  StepMeta meta;
  meta.found_inf = found_inf;
  meta.count = 0;
  for (int64_t i = 0; i < count; ++i) {
    if (tensors[i].step == nullptr) continue;
    meta.steps[meta.count++] = tensors[i].step;
    if (meta.count == kMaxStepsPerLaunch || i + 1 == count) {
      step_increment_kernel<<<(meta.count + kMtaBlockSize - 1) / kMtaBlockSize, kMtaBlockSize, 0,
                              stream>>>(meta);
      const cudaError_t err = cudaGetLastError();
      if (err != cudaSuccess) return err;
      meta.count = 0;
    }
  }
  return cudaSuccess;
}

// ---- host: group by (param dtype, grad dtype), launch per metadata batch ------------------------

template <Kernel kKernel, typename P, typename G>
cudaError_t launch_batches(const std::vector<MtaTensor<kDepth>>& list, const OptimParams& prm,
                           cudaStream_t stream) {
  return mta_for_each_launch<OptimMeta>(
      list.data(), list.size(), [&](const OptimMeta& meta, int blocks) {
        optim_kernel<kKernel, P, G><<<blocks, kMtaBlockSize, 0, stream>>>(meta, prm);
        return cudaGetLastError();
      });
}

template <Kernel kKernel, typename P>
cudaError_t dispatch_grad(DType grad_dtype, const std::vector<MtaTensor<kDepth>>& list,
                          const OptimParams& prm, cudaStream_t stream) {
  switch (grad_dtype) {
    case DType::kBFloat16:
      return launch_batches<kKernel, P, __nv_bfloat16>(list, prm, stream);
    case DType::kHalf:
      return launch_batches<kKernel, P, __half>(list, prm, stream);
    case DType::kFloat:
      return launch_batches<kKernel, P, float>(list, prm, stream);
    default:
      return cudaErrorInvalidValue;
  }
}

template <Kernel kKernel>
cudaError_t dispatch(DType param_dtype, DType grad_dtype,
                     const std::vector<MtaTensor<kDepth>>& list, const OptimParams& prm,
                     cudaStream_t stream) {
  switch (param_dtype) {
    case DType::kBFloat16:
      return dispatch_grad<kKernel, __nv_bfloat16>(grad_dtype, list, prm, stream);
    case DType::kHalf:
      return dispatch_grad<kKernel, __half>(grad_dtype, list, prm, stream);
    case DType::kFloat:
      return dispatch_grad<kKernel, float>(grad_dtype, list, prm, stream);
    default:
      return cudaErrorInvalidValue;
  }
}

cudaError_t run_kernel(Kernel kernel, DType param_dtype, DType grad_dtype,
                       const std::vector<MtaTensor<kDepth>>& list, const OptimParams& prm,
                       cudaStream_t stream) {
  switch (kernel) {
    case Kernel::kAdam:
      return dispatch<Kernel::kAdam>(param_dtype, grad_dtype, list, prm, stream);
    case Kernel::kSgd:
      return dispatch<Kernel::kSgd>(param_dtype, grad_dtype, list, prm, stream);
    case Kernel::kLion:
      return dispatch<Kernel::kLion>(param_dtype, grad_dtype, list, prm, stream);
    case Kernel::kLambPhase1:
      return dispatch<Kernel::kLambPhase1>(param_dtype, grad_dtype, list, prm, stream);
    case Kernel::kLambPhase2:
      return dispatch<Kernel::kLambPhase2>(param_dtype, grad_dtype, list, prm, stream);
  }
  return cudaErrorInvalidValue;
}

/// Runs `kernel` over every tensor, one batch of launches per (param dtype, grad dtype) present.
cudaError_t run_all(Kernel kernel, const OptimTensor* tensors, int64_t count,
                    const OptimParams& prm, cudaStream_t stream) {
  constexpr DType kTypes[] = {DType::kFloat, DType::kBFloat16, DType::kHalf};
  std::vector<MtaTensor<kDepth>> list;
  list.reserve(static_cast<size_t>(count));
  for (DType pd : kTypes) {
    for (DType gd : kTypes) {
      list.clear();
      for (int64_t i = 0; i < count; ++i) {
        const OptimTensor& t = tensors[i];
        if (t.param_dtype != pd || t.grad_dtype != gd || t.numel <= 0) continue;
        MtaTensor<kDepth> m;
        m.ptr[kParam] = t.param;
        m.ptr[kGrad] = const_cast<void*>(t.grad);
        m.ptr[kMaster] = t.master;
        m.ptr[kState0] = t.state0;
        m.ptr[kState1] = t.state1;
        m.ptr[kState2] = t.state2;
        m.ptr[kMask] = const_cast<float*>(t.mask);
        m.ptr[kEma] = t.ema;
        m.ptr[kStep] = t.step;
        m.numel = t.numel;
        m.index = static_cast<int32_t>(i);
        list.push_back(m);
      }
      if (list.empty()) continue;
      const cudaError_t err = run_kernel(kernel, pd, gd, list, prm, stream);
      if (err != cudaSuccess) return err;
    }
  }
  return cudaSuccess;
}

}  // namespace

cudaError_t optim_step(OptimAlgo algo, const OptimTensor* tensors, int64_t count,
                       const OptimHyper& hyper, double* lamb_workspace, cudaStream_t stream) {
  for (int64_t i = 0; i < count; ++i) {
    const OptimTensor& t = tensors[i];
    if (!(t.param_dtype == DType::kFloat || t.param_dtype == DType::kBFloat16 ||
          t.param_dtype == DType::kHalf) ||
        !(t.grad_dtype == DType::kFloat || t.grad_dtype == DType::kBFloat16 ||
          t.grad_dtype == DType::kHalf)) {
      return cudaErrorInvalidValue;
    }
  }
  cudaError_t err = launch_step_increment(tensors, count, hyper.found_inf, stream);
  if (err != cudaSuccess) return err;
  const OptimParams prm{hyper, lamb_workspace};
  switch (algo) {
    case OptimAlgo::kAdam:
      return run_all(Kernel::kAdam, tensors, count, prm, stream);
    case OptimAlgo::kSgd:
      return run_all(Kernel::kSgd, tensors, count, prm, stream);
    case OptimAlgo::kLion:
      return run_all(Kernel::kLion, tensors, count, prm, stream);
    case OptimAlgo::kLamb:
      if (lamb_workspace == nullptr) return cudaErrorInvalidValue;
      err = cudaMemsetAsync(lamb_workspace, 0, sizeof(double) * 2 * static_cast<size_t>(count),
                            stream);
      if (err == cudaSuccess) err = run_all(Kernel::kLambPhase1, tensors, count, prm, stream);
      if (err == cudaSuccess) err = run_all(Kernel::kLambPhase2, tensors, count, prm, stream);
      return err;
  }
  return cudaErrorInvalidValue;
}

}  // namespace torchspeed::kernels::cuda
