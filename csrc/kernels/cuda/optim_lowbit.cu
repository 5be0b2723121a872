// CUDA low-bit optimizer steps over multi-tensor-apply chunks: Adam/AdamW with bf16 or int8
// moments (adam_lowbit_step_), Lion and SGD momentum with one bf16 or int8 moment
// (lion_lowbit_step_, sgd_lowbit_step_); one launch per (param dtype, grad dtype) batch, after
// optim_step (optim.cu) has incremented the steps.
//
// The element math is optim_lowbit_math.cuh (compared bit for bit with the CPU kernels on the host
// by ctest), and the per-tensor scalars come from the device lr, scale, clip and step through the
// step_scalars() the CPU op calls too, so a CUDA step writes the CPU step's bits. found_inf skips
// every block; nothing is read on the host: no sync, CUDA-graph capturable. Every kernel starts
// with load_slot (its tensor's pointers and scalars, or the found_inf skip).
//   bf16: one element per lane, as the fp32 step; the new moments are rounded stochastically with
//         the CPU's hash of (element index, step, param position).
//   int8: each CUDA block works through its 16K-element part of a chunk in rounds of 4096 elements
//         (2 groups of 4 per thread), which hold whole quantization blocks (a power of two <= 4096;
//         parts and rounds start on one): the threads of one quantization block dequantize and
//         update the moments in registers, reduce the block's new absmaxes (warp shuffles, shared
//         memory past a warp), then write the codes (Adam updates the params there too; Lion and
//         SGD already did, their param not depending on the new absmax, and round their codes
//         stochastically, with the same hash).
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

/// One tensor's step scalars, 1 / sqrt(bias correction 2) (Adam's) and stochastic-rounding salt,
/// derived by thread 0 from the device values (as the CPU op derives them on the host) and shared.
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

/// What every kernel reads first: its tensor's pointers (null when absent), size, chunk and
/// step scalars. P: param storage, G: grad storage.
template <typename P, typename G>
struct Slot {
  P* param;
  const G* grad;
  float* master;
  void* exp_avg;     // bf16, or int8 codes
  void* exp_avg_sq;  // bf16, or uint8 codes (Adam only)
  float* exp_avg_absmax;
  float* exp_avg_sq_absmax;
  const uint8_t* mask;
  float* ema;
  int64_t numel;
  int32_t chunk;
  TensorScalars ts;
  /// The param-side pointers allow 4-element vector access (the kernels add their moments').
  __device__ bool aligned() const {
    return mta_aligned(param) && mta_aligned(grad) && mta_aligned(master) && mta_aligned(ema);
  }
};

/// Fills `t` for this block's tensor, or returns false when found_inf skips the step (the same
/// answer in every thread of the grid, before any barrier).
template <typename P, typename G>
__device__ __forceinline__ bool load_slot(const LowbitMeta& meta, const LowbitParams& prm,
                                          Slot<P, G>& t) {
  if (prm.d.found_inf != nullptr && *prm.d.found_inf != 0.f) return false;
  const int block = mta_meta_block();
  const int slot = meta.block_tensor[block];
  t.param = static_cast<P*>(meta.ptr[kParam][slot]);
  t.grad = static_cast<const G*>(meta.ptr[kGrad][slot]);
  t.master = static_cast<float*>(meta.ptr[kMaster][slot]);
  t.exp_avg = meta.ptr[kExpAvg][slot];
  t.exp_avg_sq = meta.ptr[kExpAvgSq][slot];
  t.exp_avg_absmax = static_cast<float*>(meta.ptr[kExpAvgAbsmax][slot]);
  t.exp_avg_sq_absmax = static_cast<float*>(meta.ptr[kExpAvgSqAbsmax][slot]);
  t.mask = static_cast<const uint8_t*>(meta.ptr[kMask][slot]);
  t.ema = static_cast<float*>(meta.ptr[kEma][slot]);
  t.numel = meta.numel[slot];
  t.chunk = meta.block_chunk[block];
  t.ts = tensor_scalars(prm, static_cast<const float*>(meta.ptr[kStep][slot]), meta.index[slot]);
  return true;
}

/// The fp32 value of the params of a quad: the master's when there is one.
template <bool kVec, typename P, typename G>
__device__ __forceinline__ void load_param_quad(const Slot<P, G>& t, int64_t i, int valid,
                                                float (&p)[kMtaIlp]) {
  if (t.master) {
    load_quad<kVec>(t.master, i, valid, p);
  } else {
    load_quad<kVec>(t.param, i, valid, p);
  }
}

/// bf16 moments: one block = one part of one chunk of one param, one element per lane. kAlgo:
/// Adam (two moments) or Lion / SGD (one, exp_avg).
template <OptimAlgo kAlgo, typename P, typename G>
__global__ void __launch_bounds__(kMtaBlockSize)
    bf16_kernel(const __grid_constant__ LowbitMeta meta, const __grid_constant__ LowbitParams prm) {
  constexpr bool kAdam = kAlgo == OptimAlgo::kAdam;
  const OptimHyper& h = prm.h;
  Slot<P, G> t;
  if (!load_slot(meta, prm, t)) return;
  const TensorScalars& ts = t.ts;
  __nv_bfloat16* const m_ptr = static_cast<__nv_bfloat16*>(t.exp_avg);
  __nv_bfloat16* const v_ptr = static_cast<__nv_bfloat16*>(t.exp_avg_sq);  // null unless Adam
  const bool aligned = t.aligned() && mta_aligned(m_ptr) && mta_aligned(v_ptr);
  mta_for_each_quad(t.numel, t.chunk, aligned, [&](auto vec, int64_t i, int valid) {
    constexpr bool kVec = decltype(vec)::value;
    constexpr int N = kMtaIlp;
    float g[N], p[N], m[N];
    [[maybe_unused]] float v[N];  // Adam's second moment
    uint16_t m_bits[N];
    [[maybe_unused]] uint16_t v_bits[N];
    load_quad<kVec>(t.grad, i, valid, g);
    load_param_quad<kVec>(t, i, valid, p);
    load_quad<kVec>(m_ptr, i, valid, m);
    if constexpr (kAdam) load_quad<kVec>(v_ptr, i, valid, v);
#pragma unroll
    for (int k = 0; k < N; ++k) {
      const uint32_t noise = lowbit_sr_noise(i + k, ts.salt);
      const float gk = scale_grad(h, ts.s, g[k]);
      if constexpr (kAdam) {
        adam_bf16_element(h, ts.s, ts.inv_bc2, noise, gk, p[k], m[k], v[k], m_bits[k], v_bits[k]);
      } else {
        signed_moment_bf16_element<kAlgo>(h, ts.s, noise, gk, p[k], m[k], m_bits[k]);
      }
    }
    store_bits16_quad<kVec>(m_ptr, i, valid, m_bits);
    if constexpr (kAdam) store_bits16_quad<kVec>(v_ptr, i, valid, v_bits);
    store_param_quad<kVec>(h, t.param, t.master, t.mask, t.ema, i, valid, p);
  });
}

/// The int8 kernels' walk over their part of a chunk: rounds of kInt8Round elements, each thread
/// holding kInt8Quads groups of kMtaIlp, and the threads of one quantization block.
struct Int8Walk {
  int64_t begin, end;  // this CUDA block's elements
  int64_t block;       // the quantization block (a power of two in [8, kInt8Round])
  int block_shift;     // log2(block): shifts, not int64 division
  bool whole_round;    // block == kInt8Round: both groups of every thread are one block
  int group;           // threads per quantization block (kMtaBlockSize for a whole round)

  __device__ Int8Walk(int32_t state_block, int64_t numel, int32_t chunk) {
    block = state_block;
    block_shift = __ffs(state_block) - 1;
    begin = static_cast<int64_t>(chunk) * kMtaChunkSize +
            static_cast<int64_t>(mta_part()) * kMtaPartSize;
    end = begin + kMtaPartSize < numel ? begin + kMtaPartSize : numel;
    whole_round = block == kInt8Round;
    group = whole_round ? kMtaBlockSize : static_cast<int>(block / kMtaIlp);
  }

  /// The first element of group q of this thread in the round at r0, and how many of its kMtaIlp
  /// elements exist (0 past the tensor). A group never straddles a quantization block (>= 8).
  __device__ int64_t first(int64_t r0, int q) const {
    return r0 + (static_cast<int64_t>(q) * kMtaBlockSize + threadIdx.x) * kMtaIlp;
  }
  __device__ static int valid(int64_t first, int64_t numel) {
    const int64_t left = numel - first;
    return left <= 0 ? 0 : (left < kMtaIlp ? static_cast<int>(left) : kMtaIlp);
  }

  /// The new absmaxes of the round's blocks from the threads' running ones (values >= 0). Every
  /// thread of the CUDA block must call it; each has read its blocks' old absmaxes before any
  /// group's max completes (its value is an input of the shuffle / the barrier in group_max), so
  /// the absmaxes may be written after it.
  __device__ void reduce(float (&acc)[kInt8Quads]) const {
    if (whole_round) {
      acc[0] = acc[1] = group_max(lowbit_absmax_v(acc[0], acc[1]), group);
    } else {
#pragma unroll
      for (int q = 0; q < kInt8Quads; ++q) acc[q] = group_max(acc[q], group);
    }
  }
};

/// Adam with int8 moments: one block = one part of one chunk of one param, in rounds of whole
/// quantization blocks (see the file comment).
template <typename P, typename G>
__global__ void __launch_bounds__(kMtaBlockSize, 2)
    adam_int8_kernel(const __grid_constant__ LowbitMeta meta,
                     const __grid_constant__ LowbitParams prm) {
  const OptimHyper& h = prm.h;
  Slot<P, G> t;
  if (!load_slot(meta, prm, t)) return;
  const TensorScalars& ts = t.ts;
  int8_t* const m_codes = static_cast<int8_t*>(t.exp_avg);
  uint8_t* const v_codes = static_cast<uint8_t*>(t.exp_avg_sq);
  float* const m_absmax = t.exp_avg_absmax;
  float* const v_absmax = t.exp_avg_sq_absmax;
  const Int8Walk walk(h.state_block, t.numel, t.chunk);
  const bool aligned = t.aligned() && mta_aligned(m_codes) && mta_aligned(v_codes);

  for (int64_t r0 = walk.begin; r0 < walk.end; r0 += kInt8Round) {  // uniform across the block
    constexpr int N = kMtaIlp;
    float p[kInt8Quads][N], m[kInt8Quads][N], v[kInt8Quads][N];
    float m_acc[kInt8Quads], v_acc[kInt8Quads];
    int64_t first[kInt8Quads];
    int valid[kInt8Quads];
#pragma unroll
    for (int q = 0; q < kInt8Quads; ++q) {
      first[q] = walk.first(r0, q);
      valid[q] = Int8Walk::valid(first[q], t.numel);
      m_acc[q] = v_acc[q] = 0.f;
      if (valid[q] == 0) continue;
      const int64_t i = first[q];
      const int64_t k = i >> walk.block_shift;
      const float m_amax = m_absmax[k], v_amax = v_absmax[k];
      with_vec(aligned && valid[q] == N, [&](auto vec) {
        constexpr bool kVec = decltype(vec)::value;
        float g[N];
        int8_t mc[N];
        uint8_t vc[N];
        load_quad<kVec>(t.grad, i, valid[q], g);
        load_param_quad<kVec>(t, i, valid[q], p[q]);
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
    walk.reduce(m_acc);
    walk.reduce(v_acc);
#pragma unroll
    for (int q = 0; q < kInt8Quads; ++q) {
      if (valid[q] == 0) continue;
      const int64_t i = first[q];
      if ((i & (walk.block - 1)) == 0) {  // the thread holding a block's first element writes them
        m_absmax[i >> walk.block_shift] = m_acc[q];
        v_absmax[i >> walk.block_shift] = v_acc[q];
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
        store_param_quad<kVec>(h, t.param, t.master, t.mask, t.ema, i, valid[q], p[q]);
      });
    }
  }
}

/// Lion / SGD with one int8 moment (exp_avg codes, exp_avg_absmax): the walk of adam_int8_kernel;
/// the params are written in the first phase, the codes (rounded stochastically) in the second.
template <OptimAlgo kAlgo, typename P, typename G>
__global__ void __launch_bounds__(kMtaBlockSize, 2)
    signed_moment_int8_kernel(const __grid_constant__ LowbitMeta meta,
                              const __grid_constant__ LowbitParams prm) {
  const OptimHyper& h = prm.h;
  Slot<P, G> t;
  if (!load_slot(meta, prm, t)) return;
  const TensorScalars& ts = t.ts;
  int8_t* const codes = static_cast<int8_t*>(t.exp_avg);
  float* const absmax = t.exp_avg_absmax;
  const Int8Walk walk(h.state_block, t.numel, t.chunk);
  const bool aligned = t.aligned() && mta_aligned(codes);

  for (int64_t r0 = walk.begin; r0 < walk.end; r0 += kInt8Round) {  // uniform across the block
    constexpr int N = kMtaIlp;
    float m[kInt8Quads][N];
    float acc[kInt8Quads];
    int64_t first[kInt8Quads];
    int valid[kInt8Quads];
#pragma unroll
    for (int q = 0; q < kInt8Quads; ++q) {
      first[q] = walk.first(r0, q);
      valid[q] = Int8Walk::valid(first[q], t.numel);
      acc[q] = 0.f;
      if (valid[q] == 0) continue;
      const int64_t i = first[q];
      const float amax = absmax[i >> walk.block_shift];
      with_vec(aligned && valid[q] == N, [&](auto vec) {
        constexpr bool kVec = decltype(vec)::value;
        float g[N], p[N];
        int8_t c[N];
        load_quad<kVec>(t.grad, i, valid[q], g);
        load_param_quad<kVec>(t, i, valid[q], p);
        load_codes_quad<kVec>(codes, i, valid[q], c);
#pragma unroll
        for (int e = 0; e < N; ++e) {
          if (e < valid[q]) {
            signed_moment_int8_update<kAlgo>(h, ts.s, scale_grad(h, ts.s, g[e]), p[e], c[e], amax,
                                             m[q][e], acc[q]);
          }
        }
        store_param_quad<kVec>(h, t.param, t.master, t.mask, t.ema, i, valid[q], p);
      });
    }
    walk.reduce(acc);
#pragma unroll
    for (int q = 0; q < kInt8Quads; ++q) {
      if (valid[q] == 0) continue;
      const int64_t i = first[q];
      if ((i & (walk.block - 1)) == 0) absmax[i >> walk.block_shift] = acc[q];
      const float inv = lowbit_inverse(acc[q]);
      with_vec(aligned && valid[q] == N, [&](auto vec) {
        constexpr bool kVec = decltype(vec)::value;
        int8_t c[N];
#pragma unroll
        for (int e = 0; e < N; ++e) {
          c[e] = e < valid[q]
                     ? signed_moment_int8_code(m[q][e], inv, lowbit_sr_noise(i + e, ts.salt))
                     : int8_t{0};
        }
        store_codes_quad<kVec>(codes, i, valid[q], c);
      });
    }
  }
}

// ---- host: group by (param dtype, grad dtype), launch per metadata batch ------------------------

template <OptimAlgo kAlgo, bool kInt8, typename P, typename G>
cudaError_t launch_batches(const std::vector<MtaTensor<kDepth>>& list, const LowbitParams& prm,
                           cudaStream_t stream) {
  return mta_for_each_launch<LowbitMeta>(
      list.data(), list.size(), [&](const LowbitMeta& meta, int blocks) {
        const int grid = blocks * kMtaSplit;
        if constexpr (!kInt8) {
          bf16_kernel<kAlgo, P, G><<<grid, kMtaBlockSize, 0, stream>>>(meta, prm);
        } else if constexpr (kAlgo == OptimAlgo::kAdam) {
          adam_int8_kernel<P, G><<<grid, kMtaBlockSize, 0, stream>>>(meta, prm);
        } else {
          signed_moment_int8_kernel<kAlgo, P, G><<<grid, kMtaBlockSize, 0, stream>>>(meta, prm);
        }
        return cudaGetLastError();
      });
}

template <OptimAlgo kAlgo>
cudaError_t dispatch(bool int8, DType param_dtype, DType grad_dtype,
                     const std::vector<MtaTensor<kDepth>>& list, const LowbitParams& prm,
                     cudaStream_t stream) {
  return dispatch_param_grad(param_dtype, grad_dtype, [&](auto p, auto g) {
    using P = decltype(p);
    using G = decltype(g);
    return int8 ? launch_batches<kAlgo, true, P, G>(list, prm, stream)
                : launch_batches<kAlgo, false, P, G>(list, prm, stream);
  });
}

}  // namespace

namespace detail {

cudaError_t lowbit_update(OptimAlgo algo, const OptimTensor* tensors, int64_t count,
                          const OptimHyper& hyper, const DeviceScalars& scalars,
                          cudaStream_t stream) {
  const bool int8 = hyper.state_format == StateFormat::kInt8;
  if (!int8 && hyper.state_format != StateFormat::kBFloat16) return cudaErrorInvalidValue;
  if (int8 && (hyper.state_block < 8 || hyper.state_block > kInt8Round ||
               (hyper.state_block & (hyper.state_block - 1)) != 0)) {
    return cudaErrorInvalidValue;
  }
  if (hyper.amsgrad) return cudaErrorInvalidValue;  // the op refuses it: no max_exp_avg_sq list
  // A low-bit SGD step needs its buffer (the op refuses momentum 0 with a low-bit state).
  if (algo == OptimAlgo::kSgd && hyper.momentum == 0.f) return cudaErrorInvalidValue;
  for (int64_t i = 0; i < count; ++i) {
    if (tensors[i].sr_index != 0) return cudaErrorInvalidValue;  // whole tensors only
  }
  const LowbitParams prm{hyper, scalars};
  // m.index, the param's position, is the stochastic rounding's salt.
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
      [&](DType pd, DType gd, const std::vector<MtaTensor<kDepth>>& list) -> cudaError_t {
        switch (algo) {
          case OptimAlgo::kAdam:
            return dispatch<OptimAlgo::kAdam>(int8, pd, gd, list, prm, stream);
          case OptimAlgo::kLion:
            return dispatch<OptimAlgo::kLion>(int8, pd, gd, list, prm, stream);
          case OptimAlgo::kSgd:
            return dispatch<OptimAlgo::kSgd>(int8, pd, gd, list, prm, stream);
          default:
            return cudaErrorInvalidValue;  // LAMB has no low-bit step
        }
      });
}

}  // namespace detail
}  // namespace torchspeed::kernels::cuda
