// CUDA adam_lowbit_step_: Adam/AdamW with bf16 or int8 moments over multi-tensor-apply chunks, one
// launch per (param dtype, grad dtype) batch, after optim_step (optim.cu) has incremented the
// steps.
//
// The element math is optim_lowbit_math.cuh (compared bit for bit with the CPU kernels on the host
// by ctest), and the per-tensor scalars come from the device lr, scale, clip and step through the
// step_scalars() the CPU op calls too, so a CUDA step writes the CPU step's bits. found_inf skips
// every block; nothing is read on the host: no sync, CUDA-graph capturable.
//   bf16: one element per lane, as the fp32 step; the new moments are rounded stochastically with
//         the CPU's hash of (element index, step, param position).
//   int8: each CUDA block works through its 16K-element part of a chunk in rounds of 4096 elements
//         (2 groups of 4 per thread), which hold whole quantization blocks (a power of two <= 4096;
//         parts and rounds start on one): the threads of one quantization block dequantize and
//         update the moments in registers, reduce the block's new absmaxes (warp shuffles, shared
//         memory past a warp), then update the params and write the codes.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>
#include <vector>

#include "kernels/common/step_scalars.h"
#include "kernels/cuda/api.cuh"
#include "kernels/cuda/multi_tensor_apply.cuh"
#include "kernels/cuda/numerics.cuh"
#include "kernels/cuda/optim_lowbit_math.cuh"
#include "kernels/cuda/optim_math.cuh"

namespace torchspeed::kernels::cuda {
namespace {

// Metadata lists (one pointer per tensor each). bf16 leaves the absmax lists null.
enum List : int {
  kParam = 0,
  kGrad,
  kMaster,
  kExpAvg,
  kExpAvgSq,
  kExpAvgAbsmax,
  kExpAvgSqAbsmax,
  kMask,
  kEma,
  kStep,
  kDepth
};

using LowbitMeta = MtaMeta<kDepth, 24, 320>;

struct LowbitParams {
  OptimHyper h;
  DeviceScalars d;
};
static_assert(sizeof(LowbitMeta) + sizeof(LowbitParams) <= kMaxKernelArgBytes,
              "low-bit optimizer kernel arguments exceed the 4 KB parameter limit");

constexpr int kInt8Quads = 2;  // groups of kMtaIlp elements per thread per round
constexpr int64_t kInt8Round = int64_t{kMtaBlockSize} * kMtaIlp * kInt8Quads;
static_assert(kInt8Round == 4096, "a round must hold the largest quantization block (4096)");
static_assert(kMtaPartSize % kInt8Round == 0, "rounds must tile a chunk's part");

/// One tensor's step scalars, 1 / sqrt(bias correction 2) and stochastic-rounding salt, derived by
/// thread 0 from the device values (as the CPU op derives them on the host) and shared.
struct TensorScalars {
  StepScalars s;
  float inv_bc2;
  uint32_t salt;
};

__device__ __forceinline__ TensorScalars tensor_scalars(const LowbitParams& prm, const float* step,
                                                        int32_t position) {
  __shared__ TensorScalars shared;
  if (threadIdx.x == 0) {
    const DeviceScalars& d = prm.d;
    const float t = step ? *step : 0.f;
    shared.s = step_scalars(prm.h, d.lr ? static_cast<double>(*d.lr) : prm.h.lr,
                            d.grad_scale ? *d.grad_scale : 1.f, d.clip_coef ? *d.clip_coef : 1.f,
                            step != nullptr, t);
    shared.inv_bc2 = adam_lowbit_inv_bc2(shared.s);
    shared.salt = lowbit_step_salt(t, position);
  }
  __syncthreads();
  return shared;
}

/// store_param for kMtaIlp elements: mask, master, rounded param, EMA.
template <bool kVec, typename P>
__device__ __forceinline__ void store_param_quad(const OptimHyper& h, P* param, float* master,
                                                 const uint8_t* mask, float* ema, int64_t i,
                                                 int valid, float (&p)[kMtaIlp]) {
  if (mask) {
#pragma unroll
    for (int k = 0; k < kMtaIlp; ++k) {
      if (k < valid) p[k] = apply_mask(mask_bit(mask, i + k), p[k]);
    }
  }
  if (master) store_quad<kVec>(master, i, valid, p);
  store_quad<kVec>(param, i, valid, p);
  if (ema) {
    float e[kMtaIlp];
    load_quad<kVec>(ema, i, valid, e);
#pragma unroll
    for (int k = 0; k < kMtaIlp; ++k) e[k] = ema_update(h, p[k], e[k]);
    store_quad<kVec>(ema, i, valid, e);
  }
}

/// p[i + k] = bits[k] for k < valid (16-bit words; one 8-byte store when kVec).
template <bool kVec>
__device__ __forceinline__ void store_bits16_quad(__nv_bfloat16* p, int64_t i, int valid,
                                                  const uint16_t (&bits)[kMtaIlp]) {
  if constexpr (kVec) {
    *reinterpret_cast<uint2*>(p + i) =
        make_uint2(bits[0] | (uint32_t{bits[1]} << 16), bits[2] | (uint32_t{bits[3]} << 16));
  } else {
#pragma unroll
    for (int k = 0; k < kMtaIlp; ++k) {
      if (k < valid) p[i + k] = __ushort_as_bfloat16(bits[k]);
    }
  }
}

/// c[k] = p[i + k] for k < valid (0 for the others; one 4-byte load when kVec).
template <bool kVec, typename C>
__device__ __forceinline__ void load_codes_quad(const C* p, int64_t i, int valid, C (&c)[kMtaIlp]) {
  if constexpr (kVec) {
    const uint32_t w = *reinterpret_cast<const uint32_t*>(p + i);
#pragma unroll
    for (int k = 0; k < kMtaIlp; ++k) c[k] = static_cast<C>(w >> (8 * k));
  } else {
#pragma unroll
    for (int k = 0; k < kMtaIlp; ++k) c[k] = k < valid ? p[i + k] : C(0);
  }
}

/// p[i + k] = c[k] for k < valid (one 4-byte store when kVec).
template <bool kVec, typename C>
__device__ __forceinline__ void store_codes_quad(C* p, int64_t i, int valid,
                                                 const C (&c)[kMtaIlp]) {
  if constexpr (kVec) {
    uint32_t w = 0;
#pragma unroll
    for (int k = 0; k < kMtaIlp; ++k) w |= uint32_t{static_cast<uint8_t>(c[k])} << (8 * k);
    *reinterpret_cast<uint32_t*>(p + i) = w;
  } else {
#pragma unroll
    for (int k = 0; k < kMtaIlp; ++k) {
      if (k < valid) p[i + k] = c[k];
    }
  }
}

/// The max over each group of `group` consecutive threads (a power of two in [1, kMtaBlockSize],
/// the same in the whole block): every thread gets its group's. Values are >= 0 and not NaN.
/// Every thread of the block must call it.
__device__ __forceinline__ float group_max(float x, int group) {
  for (int offset = 1; offset < group && offset < 32; offset <<= 1) {
    x = lowbit_absmax_v(x, __shfl_xor_sync(0xffffffffu, x, offset));
  }
  if (group <= 32) return x;
  __shared__ float warp_max[kMtaBlockSize / 32];
  __syncthreads();  // a previous call's readers are done
  if ((threadIdx.x & 31) == 0) warp_max[threadIdx.x >> 5] = x;
  __syncthreads();
  const int warps = group >> 5;
  const int first = static_cast<int>(threadIdx.x >> 5) & ~(warps - 1);
  float r = 0.f;
  for (int w = 0; w < warps; ++w) r = lowbit_absmax_v(r, warp_max[first + w]);
  return r;
}

/// Calls body(std::integral_constant<bool, vec>) with vec == `vector`.
template <class Body>
__device__ __forceinline__ void with_vec(bool vector, Body&& body) {
  if (vector) {
    body(std::integral_constant<bool, true>{});
  } else {
    body(std::integral_constant<bool, false>{});
  }
}

/// bf16 moments: one block = one part of one chunk of one param. P: param storage, G: grad
/// storage.
template <typename P, typename G>
__global__ void __launch_bounds__(kMtaBlockSize)
    adam_bf16_kernel(const __grid_constant__ LowbitMeta meta,
                     const __grid_constant__ LowbitParams prm) {
  const OptimHyper& h = prm.h;
  if (prm.d.found_inf != nullptr && *prm.d.found_inf != 0.f) return;  // uniform across the grid
  const int slot = meta.block_tensor[mta_meta_block()];
  P* const param = static_cast<P*>(meta.ptr[kParam][slot]);
  const G* const grad = static_cast<const G*>(meta.ptr[kGrad][slot]);
  float* const master = static_cast<float*>(meta.ptr[kMaster][slot]);
  __nv_bfloat16* const m_ptr = static_cast<__nv_bfloat16*>(meta.ptr[kExpAvg][slot]);
  __nv_bfloat16* const v_ptr = static_cast<__nv_bfloat16*>(meta.ptr[kExpAvgSq][slot]);
  const uint8_t* const mask = static_cast<const uint8_t*>(meta.ptr[kMask][slot]);
  float* const ema = static_cast<float*>(meta.ptr[kEma][slot]);
  const TensorScalars ts =
      tensor_scalars(prm, static_cast<const float*>(meta.ptr[kStep][slot]), meta.index[slot]);

  const bool aligned = mta_aligned(param) && mta_aligned(grad) && mta_aligned(master) &&
                       mta_aligned(m_ptr) && mta_aligned(v_ptr) && mta_aligned(ema);
  mta_for_each_quad(meta.numel[slot], meta.block_chunk[mta_meta_block()], aligned,
                    [&](auto vec, int64_t i, int valid) {
                      constexpr bool kVec = decltype(vec)::value;
                      constexpr int N = kMtaIlp;
                      float g[N], p[N], m[N], v[N];
                      uint16_t m_bits[N], v_bits[N];
                      load_quad<kVec>(grad, i, valid, g);
                      if (master) {
                        load_quad<kVec>(master, i, valid, p);
                      } else {
                        load_quad<kVec>(param, i, valid, p);
                      }
                      load_quad<kVec>(m_ptr, i, valid, m);
                      load_quad<kVec>(v_ptr, i, valid, v);
#pragma unroll
                      for (int k = 0; k < N; ++k) {
                        adam_bf16_element(h, ts.s, ts.inv_bc2, lowbit_sr_noise(i + k, ts.salt),
                                          scale_grad(h, ts.s, g[k]), p[k], m[k], v[k], m_bits[k],
                                          v_bits[k]);
                      }
                      store_bits16_quad<kVec>(m_ptr, i, valid, m_bits);
                      store_bits16_quad<kVec>(v_ptr, i, valid, v_bits);
                      store_param_quad<kVec>(h, param, master, mask, ema, i, valid, p);
                    });
}

/// int8 moments: one block = one part of one chunk of one param, in rounds of whole quantization
/// blocks (see the file comment).
template <typename P, typename G>
__global__ void __launch_bounds__(kMtaBlockSize, 2)
    adam_int8_kernel(const __grid_constant__ LowbitMeta meta,
                     const __grid_constant__ LowbitParams prm) {
  const OptimHyper& h = prm.h;
  if (prm.d.found_inf != nullptr && *prm.d.found_inf != 0.f) return;  // uniform across the grid
  const int slot = meta.block_tensor[mta_meta_block()];
  P* const param = static_cast<P*>(meta.ptr[kParam][slot]);
  const G* const grad = static_cast<const G*>(meta.ptr[kGrad][slot]);
  float* const master = static_cast<float*>(meta.ptr[kMaster][slot]);
  int8_t* const m_codes = static_cast<int8_t*>(meta.ptr[kExpAvg][slot]);
  uint8_t* const v_codes = static_cast<uint8_t*>(meta.ptr[kExpAvgSq][slot]);
  float* const m_absmax = static_cast<float*>(meta.ptr[kExpAvgAbsmax][slot]);
  float* const v_absmax = static_cast<float*>(meta.ptr[kExpAvgSqAbsmax][slot]);
  const uint8_t* const mask = static_cast<const uint8_t*>(meta.ptr[kMask][slot]);
  float* const ema = static_cast<float*>(meta.ptr[kEma][slot]);
  const TensorScalars ts =
      tensor_scalars(prm, static_cast<const float*>(meta.ptr[kStep][slot]), meta.index[slot]);

  const int64_t numel = meta.numel[slot];
  const int64_t block = h.state_block;
  const int block_shift = __ffs(h.state_block) - 1;  // a power of two: shifts, not int64 division
  // Threads per quantization block; a 4096-element block spans both groups of every thread.
  const bool whole_round = block == kInt8Round;
  const int group = whole_round ? kMtaBlockSize : static_cast<int>(block / kMtaIlp);
  const bool aligned = mta_aligned(param) && mta_aligned(grad) && mta_aligned(master) &&
                       mta_aligned(m_codes) && mta_aligned(v_codes) && mta_aligned(ema);
  const int64_t begin = static_cast<int64_t>(meta.block_chunk[mta_meta_block()]) * kMtaChunkSize +
                        static_cast<int64_t>(mta_part()) * kMtaPartSize;
  const int64_t end = begin + kMtaPartSize < numel ? begin + kMtaPartSize : numel;

  for (int64_t r0 = begin; r0 < end; r0 += kInt8Round) {  // uniform across the block
    constexpr int N = kMtaIlp;
    float p[kInt8Quads][N], m[kInt8Quads][N], v[kInt8Quads][N];
    float m_acc[kInt8Quads], v_acc[kInt8Quads];
    int64_t first[kInt8Quads];
    int valid[kInt8Quads];
#pragma unroll
    for (int q = 0; q < kInt8Quads; ++q) {
      first[q] = r0 + (static_cast<int64_t>(q) * kMtaBlockSize + threadIdx.x) * N;
      const int64_t left = numel - first[q];
      valid[q] = left <= 0 ? 0 : (left < N ? static_cast<int>(left) : N);
      m_acc[q] = v_acc[q] = 0.f;
      if (valid[q] == 0) continue;
      const int64_t i = first[q];
      const int64_t k = i >> block_shift;  // a group of N never straddles a block (block >= 8)
      const float m_amax = m_absmax[k], v_amax = v_absmax[k];
      with_vec(aligned && valid[q] == N, [&](auto vec) {
        constexpr bool kVec = decltype(vec)::value;
        float g[N];
        int8_t mc[N];
        uint8_t vc[N];
        load_quad<kVec>(grad, i, valid[q], g);
        if (master) {
          load_quad<kVec>(master, i, valid[q], p[q]);
        } else {
          load_quad<kVec>(param, i, valid[q], p[q]);
        }
        load_codes_quad<kVec>(m_codes, i, valid[q], mc);
        load_codes_quad<kVec>(v_codes, i, valid[q], vc);
#pragma unroll
        for (int e = 0; e < N; ++e) {
          if (e < valid[q]) {
            adam_int8_moments(h, scale_grad(h, ts.s, g[e]), p[q][e], mc[e], vc[e], m_amax, v_amax,
                              m[q][e], v[q][e], m_acc[q], v_acc[q]);
          }
        }
      });
    }
    // The blocks' new absmaxes. Every thread has read its blocks' old ones before a group's max
    // completes (its value is an input of the shuffle / the barrier in group_max).
    if (whole_round) {
      m_acc[0] = m_acc[1] = group_max(lowbit_absmax_v(m_acc[0], m_acc[1]), group);
      v_acc[0] = v_acc[1] = group_max(lowbit_absmax_v(v_acc[0], v_acc[1]), group);
    } else {
#pragma unroll
      for (int q = 0; q < kInt8Quads; ++q) {
        m_acc[q] = group_max(m_acc[q], group);
        v_acc[q] = group_max(v_acc[q], group);
      }
    }
#pragma unroll
    for (int q = 0; q < kInt8Quads; ++q) {
      if (valid[q] == 0) continue;
      const int64_t i = first[q];
      if ((i & (block - 1)) == 0) {  // the thread holding a block's first element writes them
        m_absmax[i >> block_shift] = m_acc[q];
        v_absmax[i >> block_shift] = v_acc[q];
      }
      const float m_inv = lowbit_inverse(m_acc[q]), v_inv = lowbit_inverse(v_acc[q]);
      with_vec(aligned && valid[q] == N, [&](auto vec) {
        constexpr bool kVec = decltype(vec)::value;
        int8_t mc[N];
        uint8_t vc[N];
#pragma unroll
        for (int e = 0; e < N; ++e) {
          if (e < valid[q]) {
            adam_int8_finish(h, ts.s, ts.inv_bc2, m_inv, v_inv, m[q][e], v[q][e], p[q][e], mc[e],
                             vc[e]);
          } else {
            mc[e] = 0;
            vc[e] = 0;
          }
        }
        store_codes_quad<kVec>(m_codes, i, valid[q], mc);
        store_codes_quad<kVec>(v_codes, i, valid[q], vc);
        store_param_quad<kVec>(h, param, master, mask, ema, i, valid[q], p[q]);
      });
    }
  }
}

// ---- host: group by (param dtype, grad dtype), launch per metadata batch ------------------------

template <bool kInt8, typename P, typename G>
cudaError_t launch_batches(const std::vector<MtaTensor<kDepth>>& list, const LowbitParams& prm,
                           cudaStream_t stream) {
  return mta_for_each_launch<LowbitMeta>(
      list.data(), list.size(), [&](const LowbitMeta& meta, int blocks) {
        if constexpr (kInt8) {
          adam_int8_kernel<P, G><<<blocks * kMtaSplit, kMtaBlockSize, 0, stream>>>(meta, prm);
        } else {
          adam_bf16_kernel<P, G><<<blocks * kMtaSplit, kMtaBlockSize, 0, stream>>>(meta, prm);
        }
        return cudaGetLastError();
      });
}

template <bool kInt8>
cudaError_t dispatch(DType param_dtype, DType grad_dtype,
                     const std::vector<MtaTensor<kDepth>>& list, const LowbitParams& prm,
                     cudaStream_t stream) {
  return dispatch_param_grad(param_dtype, grad_dtype, [&](auto p, auto g) {
    return launch_batches<kInt8, decltype(p), decltype(g)>(list, prm, stream);
  });
}

}  // namespace

namespace detail {

cudaError_t adam_lowbit_update(const OptimTensor* tensors, int64_t count, const OptimHyper& hyper,
                               const DeviceScalars& scalars, cudaStream_t stream) {
  const bool int8 = hyper.state_format == StateFormat::kInt8;
  if (!int8 && hyper.state_format != StateFormat::kBFloat16) return cudaErrorInvalidValue;
  if (int8 && (hyper.state_block < 8 || hyper.state_block > kInt8Round ||
               (hyper.state_block & (hyper.state_block - 1)) != 0)) {
    return cudaErrorInvalidValue;
  }
  if (hyper.amsgrad) return cudaErrorInvalidValue;  // the op refuses it: no max_exp_avg_sq list
  for (int64_t i = 0; i < count; ++i) {
    if (tensors[i].sr_index != 0) return cudaErrorInvalidValue;  // whole tensors only
  }
  const LowbitParams prm{hyper, scalars};
  // m.index, the param's position, is the bf16 rounding's salt.
  return for_each_dtype_list<kDepth>(
      tensors, count,
      [](const OptimTensor& t, MtaTensor<kDepth>& m) {
        m.ptr[kParam] = t.param;
        m.ptr[kGrad] = const_cast<void*>(t.grad);
        m.ptr[kMaster] = t.master;
        m.ptr[kExpAvg] = t.exp_avg_lp;
        m.ptr[kExpAvgSq] = t.exp_avg_sq_lp;
        m.ptr[kExpAvgAbsmax] = t.exp_avg_absmax;
        m.ptr[kExpAvgSqAbsmax] = t.exp_avg_sq_absmax;
        m.ptr[kMask] = const_cast<uint8_t*>(t.mask);
        m.ptr[kEma] = t.ema;
        m.ptr[kStep] = t.step;
      },
      [&](DType pd, DType gd, const std::vector<MtaTensor<kDepth>>& list) {
        return int8 ? dispatch<true>(pd, gd, list, prm, stream)
                    : dispatch<false>(pd, gd, list, prm, stream);
      });
}

}  // namespace detail
}  // namespace torchspeed::kernels::cuda
