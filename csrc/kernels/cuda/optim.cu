// CUDA fused optimizer steps (Adam/AdamW, SGD, Lion, LAMB) over multi-tensor-apply chunks.
//
// The per-element math is a line-by-line mirror of the CPU templates in kernels/cpu/optim.h
// (same operation order, explicit fma exactly where the CPU uses fma, IEEE-rounded fp32 ops
// elsewhere), and the per-tensor scalars come from the device step and lr through the same
// step_scalars() the CPU op calls on the host (kernels/common/step_scalars.h), so CPU and CUDA
// agree to an ulp or so per step. found_inf, grad_scale, clip_coef, lr and the steps are read on
// the device: nothing synchronises with the host.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <vector>

#include "kernels/common/step_scalars.h"
#include "kernels/cuda/api.cuh"
#include "kernels/cuda/multi_tensor_apply.cuh"
#include "kernels/cuda/numerics.cuh"
#include "kernels/cuda/optim_math.cuh"

namespace torchspeed::kernels::cuda {
namespace {

// Metadata lists (one pointer per tensor each).
enum List : int {
  kParam = 0,
  kGrad,
  kMaster,
  kExpAvg,
  kExpAvgSq,
  kMaxExpAvgSq,
  kMask,
  kEma,
  kStep,
  kDepth
};

using OptimMeta = MtaMeta<kDepth, 24, 320>;

struct OptimParams {
  OptimHyper h;
  DeviceScalars d;
  double* lamb_sumsq;  // [2 * count]: ||p||^2, ||u||^2 per tensor index (LAMB)
};
static_assert(sizeof(OptimMeta) + sizeof(OptimParams) <= kMaxKernelArgBytes,
              "optimizer kernel arguments exceed the 4 KB parameter limit");

enum class Kernel : int { kAdam, kSgd, kLion, kLambPhase1, kLambPhase2 };

/// One block = one part of one chunk of one param. P: param storage, G: grad storage. The math per
/// element is in optim_math.cuh (shared with the host build that checks it against the CPU
/// kernels).
template <Kernel kKernel, typename P, typename G>
__global__ void __launch_bounds__(kMtaBlockSize)
    optim_kernel(const __grid_constant__ OptimMeta meta, const __grid_constant__ OptimParams prm) {
  const OptimHyper& h = prm.h;
  // AMP: a step whose grads held inf/NaN writes nothing (uniform across the grid).
  const DeviceScalars& d = prm.d;
  if (d.found_inf != nullptr && *d.found_inf != 0.f) return;

  const int slot = meta.block_tensor[mta_meta_block()];
  P* const param = static_cast<P*>(meta.ptr[kParam][slot]);
  const G* const grad = static_cast<const G*>(meta.ptr[kGrad][slot]);
  float* const master = static_cast<float*>(meta.ptr[kMaster][slot]);
  float* const exp_avg = static_cast<float*>(meta.ptr[kExpAvg][slot]);
  float* const exp_avg_sq = static_cast<float*>(meta.ptr[kExpAvgSq][slot]);
  float* const max_exp_avg_sq = static_cast<float*>(meta.ptr[kMaxExpAvgSq][slot]);
  const uint8_t* const mask = static_cast<const uint8_t*>(meta.ptr[kMask][slot]);
  float* const ema = static_cast<float*>(meta.ptr[kEma][slot]);
  const float* const step = static_cast<const float*>(meta.ptr[kStep][slot]);

  // Thread 0 derives the tensor's scalars from the device lr, scale, clip and step.
  __shared__ StepScalars shared_scalars;
  if (threadIdx.x == 0) {
    const int64_t index = meta.index[slot];
    constexpr bool kPhase2 = kKernel == Kernel::kLambPhase2;
    shared_scalars = step_scalars(
        h, d.lr ? static_cast<double>(*d.lr) : h.lr, d.grad_scale ? *d.grad_scale : 1.f,
        d.clip_coef ? *d.clip_coef : 1.f, step != nullptr, step ? *step : 0.f, kPhase2,
        kPhase2 ? prm.lamb_sumsq[2 * index] : 0.0, kPhase2 ? prm.lamb_sumsq[2 * index + 1] : 0.0);
  }
  __syncthreads();
  const StepScalars s = shared_scalars;

  const bool aligned = mta_aligned(param) && mta_aligned(grad) && mta_aligned(master) &&
                       mta_aligned(exp_avg) && mta_aligned(exp_avg_sq) &&
                       mta_aligned(max_exp_avg_sq) && mta_aligned(ema);
  float p_acc = 0.f, u_acc = 0.f;  // LAMB phase 1: ||p||^2, ||u||^2 of this thread

  mta_for_each_quad(
      meta.numel[slot], meta.block_chunk[mta_meta_block()], aligned,
      [&](auto vec, int64_t i, int valid) {
        constexpr bool kVec = decltype(vec)::value;
        constexpr int N = kMtaIlp;
        float g[N];
        if constexpr (kKernel != Kernel::kLambPhase2) {
          load_quad<kVec>(grad, i, valid, g);
#pragma unroll
          for (int k = 0; k < N; ++k) g[k] = scale_grad(h, s, g[k]);
        } else {
          (void)g;  // phase 2 recomputes the update from the moments alone
        }
        float p[N];  // load_param: the master when there is one
        if (master) {
          load_quad<kVec>(master, i, valid, p);
        } else {
          load_quad<kVec>(param, i, valid, p);
        }

        if constexpr (kKernel == Kernel::kAdam) {
          float m[N], v[N], vmax[N] = {0.f, 0.f, 0.f, 0.f};
          load_quad<kVec>(exp_avg, i, valid, m);
          load_quad<kVec>(exp_avg_sq, i, valid, v);
          if (h.amsgrad) load_quad<kVec>(max_exp_avg_sq, i, valid, vmax);
#pragma unroll
          for (int k = 0; k < N; ++k) adam_element(h, s, g[k], p[k], m[k], v[k], vmax[k]);
          store_quad<kVec>(exp_avg, i, valid, m);
          store_quad<kVec>(exp_avg_sq, i, valid, v);
          if (h.amsgrad) store_quad<kVec>(max_exp_avg_sq, i, valid, vmax);
        } else if constexpr (kKernel == Kernel::kSgd) {
          float buf[N] = {0.f, 0.f, 0.f, 0.f};
          if (h.momentum != 0.f && !h.first_step) load_quad<kVec>(exp_avg, i, valid, buf);
#pragma unroll
          for (int k = 0; k < N; ++k) sgd_element(h, s, g[k], p[k], buf[k]);
          if (h.momentum != 0.f) store_quad<kVec>(exp_avg, i, valid, buf);
        } else if constexpr (kKernel == Kernel::kLion) {
          float m[N];
          load_quad<kVec>(exp_avg, i, valid, m);
#pragma unroll
          for (int k = 0; k < N; ++k) lion_element(h, s, g[k], p[k], m[k]);
          store_quad<kVec>(exp_avg, i, valid, m);
        } else if constexpr (kKernel == Kernel::kLambPhase1) {
          float m[N], v[N];
          load_quad<kVec>(exp_avg, i, valid, m);
          load_quad<kVec>(exp_avg_sq, i, valid, v);
#pragma unroll
          for (int k = 0; k < N; ++k) lamb_moments(h, g[k], m[k], v[k]);
          store_quad<kVec>(exp_avg, i, valid, m);
          store_quad<kVec>(exp_avg_sq, i, valid, v);
#pragma unroll
          for (int k = 0; k < N; ++k) {
            if (k < valid) {  // padding lanes may be 0/0 when eps == 0
              const float u = lamb_update(h, s, m[k], v[k], p[k]);
              p_acc = f_fma(p[k], p[k], p_acc);
              u_acc = f_fma(u, u, u_acc);
            }
          }
          return;  // phase 1 does not touch the param
        } else {   // kLambPhase2: recompute u from the new moments, apply lr * trust * u
          float m[N], v[N];
          load_quad<kVec>(exp_avg, i, valid, m);
          load_quad<kVec>(exp_avg_sq, i, valid, v);
#pragma unroll
          for (int k = 0; k < N; ++k) p[k] = lamb_apply(h, s, m[k], v[k], p[k]);
        }

        // store_param: mask, master, rounded param, EMA.
        if (mask) {  // bit-packed: bit i of the param's mask
#pragma unroll
          for (int k = 0; k < N; ++k) {
            if (k < valid) p[k] = apply_mask(mask_bit(mask, i + k), p[k]);
          }
        }
        if (master) store_quad<kVec>(master, i, valid, p);
        store_quad<kVec>(param, i, valid, p);
        if (ema) {
          float e[N];
          load_quad<kVec>(ema, i, valid, e);
#pragma unroll
          for (int k = 0; k < N; ++k) e[k] = ema_update(h, p[k], e[k]);
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

cudaError_t launch_step_increment(const OptimTensor* tensors, int64_t count, const float* found_inf,
                                  cudaStream_t stream) {
  StepMeta meta{};
  meta.found_inf = found_inf;
  meta.count = 0;
  for (int64_t i = 0; i < count; ++i) {
    if (tensors[i].step == nullptr) continue;
    meta.steps[meta.count++] = tensors[i].step;
    const bool last = i + 1 == count;
    if (meta.count > 0 && (meta.count == kMaxStepsPerLaunch || last)) {
      step_increment_kernel<<<(meta.count + kMtaBlockSize - 1) / kMtaBlockSize, kMtaBlockSize, 0,
                              stream>>>(meta);
      const cudaError_t err = cudaGetLastError();
      if (err != cudaSuccess) return err;
      meta.count = 0;
    }
  }
  if (meta.count > 0) {  // the last tensors had no step pointer
    step_increment_kernel<<<(meta.count + kMtaBlockSize - 1) / kMtaBlockSize, kMtaBlockSize, 0,
                            stream>>>(meta);
    return cudaGetLastError();
  }
  return cudaSuccess;
}

// ---- host: group by (param dtype, grad dtype), launch per metadata batch ------------------------

template <Kernel kKernel, typename P, typename G>
cudaError_t launch_batches(const std::vector<MtaTensor<kDepth>>& list, const OptimParams& prm,
                           cudaStream_t stream) {
  return mta_for_each_launch<OptimMeta>(
      list.data(), list.size(), [&](const OptimMeta& meta, int blocks) {
        optim_kernel<kKernel, P, G><<<blocks * kMtaSplit, kMtaBlockSize, 0, stream>>>(meta, prm);
        return cudaGetLastError();
      });
}

template <Kernel kKernel>
cudaError_t dispatch(DType param_dtype, DType grad_dtype,
                     const std::vector<MtaTensor<kDepth>>& list, const OptimParams& prm,
                     cudaStream_t stream) {
  return dispatch_param_grad(param_dtype, grad_dtype, [&](auto p, auto g) {
    return launch_batches<kKernel, decltype(p), decltype(g)>(list, prm, stream);
  });
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
  return for_each_dtype_list<kDepth>(
      tensors, count,
      [](const OptimTensor& t, MtaTensor<kDepth>& m) {
        m.ptr[kParam] = t.param;
        m.ptr[kGrad] = const_cast<void*>(t.grad);
        m.ptr[kMaster] = t.master;
        m.ptr[kExpAvg] = t.exp_avg;
        m.ptr[kExpAvgSq] = t.exp_avg_sq;
        m.ptr[kMaxExpAvgSq] = t.max_exp_avg_sq;
        m.ptr[kMask] = const_cast<uint8_t*>(t.mask);
        m.ptr[kEma] = t.ema;
        m.ptr[kStep] = t.step;
      },
      [&](DType pd, DType gd, const std::vector<MtaTensor<kDepth>>& list) {
        return run_kernel(kernel, pd, gd, list, prm, stream);
      });
}

}  // namespace

cudaError_t optim_step(OptimAlgo algo, const OptimTensor* tensors, int64_t count,
                       const OptimHyper& hyper, const DeviceScalars& scalars,
                       double* lamb_workspace, cudaStream_t stream, int lamb_phase) {
  for (int64_t i = 0; i < count; ++i) {
    const OptimTensor& t = tensors[i];
    if (!(t.param_dtype == DType::kFloat || t.param_dtype == DType::kBFloat16 ||
          t.param_dtype == DType::kHalf) ||
        !(t.grad_dtype == DType::kFloat || t.grad_dtype == DType::kBFloat16 ||
          t.grad_dtype == DType::kHalf)) {
      return cudaErrorInvalidValue;
    }
  }
  const bool lowbit = hyper.state_format != StateFormat::kFloat;
  if (lowbit && algo == OptimAlgo::kLamb) return cudaErrorInvalidValue;
  if (lamb_phase != 0 && (algo != OptimAlgo::kLamb || lamb_phase < 0 || lamb_phase > 2)) {
    return cudaErrorInvalidValue;
  }
  cudaError_t err = lamb_phase == 2
                        ? cudaSuccess
                        : launch_step_increment(tensors, count, scalars.found_inf, stream);
  if (err != cudaSuccess) return err;
  if (lowbit) return detail::lowbit_update(algo, tensors, count, hyper, scalars, stream);
  const OptimParams prm{hyper, scalars, lamb_workspace};
  switch (algo) {
    case OptimAlgo::kAdam:
      return run_all(Kernel::kAdam, tensors, count, prm, stream);
    case OptimAlgo::kSgd:
      return run_all(Kernel::kSgd, tensors, count, prm, stream);
    case OptimAlgo::kLion:
      return run_all(Kernel::kLion, tensors, count, prm, stream);
    case OptimAlgo::kLamb:
      if (lamb_workspace == nullptr) return cudaErrorInvalidValue;
      if (lamb_phase != 2) {
        err = cudaMemsetAsync(lamb_workspace, 0, sizeof(double) * 2 * static_cast<size_t>(count),
                              stream);
        if (err == cudaSuccess) err = run_all(Kernel::kLambPhase1, tensors, count, prm, stream);
      }
      if (err == cudaSuccess && lamb_phase != 1) {
        err = run_all(Kernel::kLambPhase2, tensors, count, prm, stream);
      }
      return err;
  }
  return cudaErrorInvalidValue;
}

}  // namespace torchspeed::kernels::cuda
