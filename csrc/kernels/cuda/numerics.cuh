// Device-side element access for the CUDA kernels: loads of kMtaIlp elements of any storage type
// into fp32/fp64 registers (one vector load when aligned, guarded scalars otherwise) and rounded
// stores back. (The IEEE-exact arithmetic of the optimizers is in optim_math.cuh.)
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>
#include <vector>

#include "kernels/common/optim_types.h"
#include "kernels/cuda/multi_tensor_apply.cuh"

namespace torchspeed::kernels::cuda {

// ---- one element <-> fp32 / fp64 ----------------------------------------------------------------

__device__ __forceinline__ float to_acc(float x) { return x; }
__device__ __forceinline__ double to_acc(double x) { return x; }
// bf16 is the top half of an fp32: widening is exact.
__device__ __forceinline__ float to_acc(__nv_bfloat16 x) {
  return __uint_as_float(static_cast<uint32_t>(__bfloat16_as_ushort(x)) << 16);
}
__device__ __forceinline__ float to_acc(__half x) { return __half2float(x); }

template <typename T>
__device__ __forceinline__ T from_acc(float x);
template <>
__device__ __forceinline__ float from_acc<float>(float x) {
  return x;
}
template <>
__device__ __forceinline__ __nv_bfloat16 from_acc<__nv_bfloat16>(float x) {
  return __float2bfloat16_rn(x);  // round to nearest even, like c10::BFloat16 and the CPU kernels
}
template <>
__device__ __forceinline__ __half from_acc<__half>(float x) {
  return __float2half_rn(x);
}
__device__ __forceinline__ double from_acc_d(double x) { return x; }

/// The register type a storage type is computed in: fp32 for fp32/bf16/fp16, fp64 for fp64.
template <typename T>
struct AccOf {
  using type = float;
};
template <>
struct AccOf<double> {
  using type = double;
};
template <typename T>
using acc_t = typename AccOf<T>::type;

// ---- kMtaIlp elements: vector when kVec, guarded scalars otherwise ------------------------------

namespace detail {
__device__ __forceinline__ float lo16_to_acc(uint32_t w, __nv_bfloat16*) {
  return __uint_as_float(w << 16);
}
__device__ __forceinline__ float hi16_to_acc(uint32_t w, __nv_bfloat16*) {
  return __uint_as_float(w & 0xffff0000u);
}
__device__ __forceinline__ float lo16_to_acc(uint32_t w, __half*) {
  return __half2float(__ushort_as_half(static_cast<unsigned short>(w & 0xffffu)));
}
__device__ __forceinline__ float hi16_to_acc(uint32_t w, __half*) {
  return __half2float(__ushort_as_half(static_cast<unsigned short>(w >> 16)));
}
__device__ __forceinline__ uint32_t bits16(__nv_bfloat16 x) { return __bfloat16_as_ushort(x); }
__device__ __forceinline__ uint32_t bits16(__half x) { return __half_as_ushort(x); }
}  // namespace detail

/// r[k] = p[i + k] for k < valid (0 for the others).
template <bool kVec, typename T, typename A>
__device__ __forceinline__ void load_quad(const T* p, int64_t i, int valid, A (&r)[kMtaIlp]) {
  static_assert(kMtaIlp == 4, "the vector paths below load 4 elements");
  if constexpr (kVec && sizeof(T) == 4) {
    const float4 v = *reinterpret_cast<const float4*>(p + i);
    r[0] = v.x, r[1] = v.y, r[2] = v.z, r[3] = v.w;
  } else if constexpr (kVec && sizeof(T) == 8) {
    const double2 a = *reinterpret_cast<const double2*>(p + i);
    const double2 b = *reinterpret_cast<const double2*>(p + i + 2);
    r[0] = a.x, r[1] = a.y, r[2] = b.x, r[3] = b.y;
  } else if constexpr (kVec && sizeof(T) == 2) {
    const uint2 v = *reinterpret_cast<const uint2*>(p + i);
    T* tag = nullptr;
    r[0] = detail::lo16_to_acc(v.x, tag), r[1] = detail::hi16_to_acc(v.x, tag);
    r[2] = detail::lo16_to_acc(v.y, tag), r[3] = detail::hi16_to_acc(v.y, tag);
  } else {
#pragma unroll
    for (int k = 0; k < kMtaIlp; ++k) r[k] = k < valid ? static_cast<A>(to_acc(p[i + k])) : A(0);
  }
}

/// p[i + k] = round(r[k]) for k < valid.
template <bool kVec, typename T, typename A>
__device__ __forceinline__ void store_quad(T* p, int64_t i, int valid, const A (&r)[kMtaIlp]) {
  if constexpr (kVec && std::is_same_v<T, float>) {
    *reinterpret_cast<float4*>(p + i) = make_float4(r[0], r[1], r[2], r[3]);
  } else if constexpr (kVec && std::is_same_v<T, double>) {
    *reinterpret_cast<double2*>(p + i) = make_double2(r[0], r[1]);
    *reinterpret_cast<double2*>(p + i + 2) = make_double2(r[2], r[3]);
  } else if constexpr (kVec && sizeof(T) == 2) {
    uint2 v;
    v.x = detail::bits16(from_acc<T>(r[0])) | (detail::bits16(from_acc<T>(r[1])) << 16);
    v.y = detail::bits16(from_acc<T>(r[2])) | (detail::bits16(from_acc<T>(r[3])) << 16);
    *reinterpret_cast<uint2*>(p + i) = v;
  } else if constexpr (std::is_same_v<T, double>) {
#pragma unroll
    for (int k = 0; k < kMtaIlp; ++k) {
      if (k < valid) p[i + k] = static_cast<double>(r[k]);
    }
  } else {
#pragma unroll
    for (int k = 0; k < kMtaIlp; ++k) {
      if (k < valid) p[i + k] = from_acc<T>(static_cast<float>(r[k]));
    }
  }
}

// ---- host: storage dtypes -> types
// ---------------------------------------------------------------

/// Calls f(P{}, G{}) with the storage types of a (param, grad) dtype pair (float, __half or
/// __nv_bfloat16 each) and returns its result; cudaErrorInvalidValue for any other dtype. The
/// optimizer kernels' launch dispatch (optim.cu, optim_lowbit.cu).
template <class F>
cudaError_t dispatch_param_grad(DType param_dtype, DType grad_dtype, F&& f) {
  const auto with_grad = [&](auto p) -> cudaError_t {
    switch (grad_dtype) {
      case DType::kBFloat16:
        return f(p, __nv_bfloat16{});
      case DType::kHalf:
        return f(p, __half{});
      case DType::kFloat:
        return f(p, float{});
      default:
        return cudaErrorInvalidValue;
    }
  };
  switch (param_dtype) {
    case DType::kBFloat16:
      return with_grad(__nv_bfloat16{});
    case DType::kHalf:
      return with_grad(__half{});
    case DType::kFloat:
      return with_grad(float{});
    default:
      return cudaErrorInvalidValue;
  }
}

/// The optimizers' multi-tensor lists, one per (param dtype, grad dtype) present (float, bf16,
/// fp16; empty tensors skipped), in tensor order: fill(t, m) sets m.ptr's slots from t, m.numel
/// and m.index (the tensor's position) are set here; launch(param_dtype, grad_dtype, list) runs
/// each list. Stops at the first error.
template <int kDepth, class Fill, class Launch>
cudaError_t for_each_dtype_list(const OptimTensor* tensors, int64_t count, Fill&& fill,
                                Launch&& launch) {
  constexpr DType kTypes[] = {DType::kFloat, DType::kBFloat16, DType::kHalf};
  std::vector<MtaTensor<kDepth>> list;
  list.reserve(static_cast<size_t>(count));
  for (DType pd : kTypes) {
    for (DType gd : kTypes) {
      list.clear();
      for (int64_t i = 0; i < count; ++i) {
        const OptimTensor& t = tensors[i];
        if (t.param_dtype != pd || t.grad_dtype != gd || t.numel <= 0) continue;
        MtaTensor<kDepth> m{};
        fill(t, m);
        m.numel = t.numel;
        m.index = static_cast<int32_t>(i);
        list.push_back(m);
      }
      if (list.empty()) continue;
      const cudaError_t err = launch(pd, gd, list);
      if (err != cudaSuccess) return err;
    }
  }
  return cudaSuccess;
}

}  // namespace torchspeed::kernels::cuda
