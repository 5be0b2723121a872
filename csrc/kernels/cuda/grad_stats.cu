// CUDA grad_stats: per-tensor sums of squares and a non-finite flag over a list of tensors in one
// read (and, when unscaling, one write) of every element, then a one-block finalize for the norms.
#include <cuda_runtime.h>

#include <cmath>
#include <vector>

#include "kernels/cuda/api.cuh"
#include "kernels/cuda/multi_tensor_apply.cuh"
#include "kernels/cuda/numerics.cuh"

namespace torchspeed::kernels::cuda {
namespace {

struct GradStatsParams {
  const float* inv_scale;  // null: read only
  double* sumsq;           // per tensor index, zeroed before the first launch
  float* found_inf;        // zeroed before the first launch
};

using GradStatsMeta = MtaMeta<1, 96, 320>;
static_assert(sizeof(GradStatsMeta) + sizeof(GradStatsParams) <= kMaxKernelArgBytes,
              "grad_stats kernel arguments exceed the 4 KB parameter limit");

/// kMtaSplit blocks per 64K-element chunk. fp32 (fp64 for double tensors) per-thread sums of at
/// most 32 squares, a block sum in fp64, one atomicAdd per block into the tensor's fp64 slot.
template <typename T>
__global__ void __launch_bounds__(kMtaBlockSize)
    grad_stats_kernel(const __grid_constant__ GradStatsMeta meta, const GradStatsParams p) {
  using A = acc_t<T>;
  const int slot = meta.block_tensor[mta_meta_block()];
  T* data = static_cast<T*>(meta.ptr[0][slot]);
  const bool unscale = p.inv_scale != nullptr;
  const A scale = unscale ? static_cast<A>(*p.inv_scale) : A(1);
  A acc = A(0);
  bool nonfinite = false;
  mta_for_each_quad(meta.numel[slot], meta.block_chunk[mta_meta_block()], mta_aligned(data),
                    [&](auto vec, int64_t i, int valid) {
                      constexpr bool kVec = decltype(vec)::value;
                      A x[kMtaIlp];
                      load_quad<kVec>(data, i, valid, x);
#pragma unroll
                      for (int k = 0; k < kMtaIlp; ++k) nonfinite |= !isfinite(x[k]);
                      if (unscale) {
#pragma unroll
                        for (int k = 0; k < kMtaIlp; ++k) x[k] = x[k] * scale;
                        store_quad<kVec>(data, i, valid, x);
                      }
#pragma unroll
                      for (int k = 0; k < kMtaIlp; ++k) acc = ::fma(x[k], x[k], acc);
                    });
  // Checked before unscaling; the flag write races harmlessly (every writer stores 1.0f).
  const int any_nonfinite = __syncthreads_or(nonfinite);
  const double block_sumsq = mta_block_sum(static_cast<double>(acc));
  if (threadIdx.x == 0) {
    if (block_sumsq != 0.0) atomicAdd(p.sumsq + meta.index[slot], block_sumsq);  // NaN too
    if (any_nonfinite) *p.found_inf = 1.0f;
  }
}

/// One block: per-tensor norms and the total in a fixed order, rounded to float32 as the CPU op.
__global__ void __launch_bounds__(1024)
    grad_stats_finalize_kernel(const double* sumsq, int64_t count, float* total_norm,
                               float* per_tensor_norms) {
  double total = 0.0;
  for (int64_t i = threadIdx.x; i < count; i += blockDim.x) {
    total += sumsq[i];
    if (per_tensor_norms) per_tensor_norms[i] = static_cast<float>(::sqrt(sumsq[i]));
  }
  total = mta_block_sum(total);
  if (threadIdx.x == 0) *total_norm = static_cast<float>(::sqrt(total));
}

template <typename T>
cudaError_t launch_grad_stats(const std::vector<MtaTensor<1>>& list, const GradStatsParams& p,
                              cudaStream_t stream) {
  return mta_for_each_launch<GradStatsMeta>(
      list.data(), list.size(), [&](const GradStatsMeta& meta, int blocks) {
        grad_stats_kernel<T><<<blocks * kMtaSplit, kMtaBlockSize, 0, stream>>>(meta, p);
        return cudaGetLastError();
      });
}

}  // namespace

cudaError_t grad_stats(const GradStatsTensor* tensors, int64_t count, const float* inv_scale,
                       double* workspace, float* total_norm, float* per_tensor_norms,
                       float* found_inf, cudaStream_t stream) {
  cudaError_t err =
      cudaMemsetAsync(workspace, 0, sizeof(double) * static_cast<size_t>(count), stream);
  if (err == cudaSuccess) err = cudaMemsetAsync(found_inf, 0, sizeof(float), stream);
  if (err != cudaSuccess) return err;
  const GradStatsParams params{inv_scale, workspace, found_inf};
  // One kernel instantiation per storage type: group the tensors by dtype.
  std::vector<MtaTensor<1>> list;
  list.reserve(static_cast<size_t>(count));
  for (DType dtype : {DType::kFloat, DType::kBFloat16, DType::kHalf, DType::kDouble}) {
    list.clear();
    for (int64_t i = 0; i < count; ++i) {
      if (tensors[i].dtype == dtype && tensors[i].numel > 0) {
        list.push_back({{tensors[i].data}, tensors[i].numel, static_cast<int32_t>(i)});
      }
    }
    if (list.empty()) continue;
    switch (dtype) {
      case DType::kFloat:
        err = launch_grad_stats<float>(list, params, stream);
        break;
      case DType::kBFloat16:
        err = launch_grad_stats<__nv_bfloat16>(list, params, stream);
        break;
      case DType::kHalf:
        err = launch_grad_stats<__half>(list, params, stream);
        break;
      case DType::kDouble:
        err = launch_grad_stats<double>(list, params, stream);
        break;
    }
    if (err != cudaSuccess) return err;
  }
  grad_stats_finalize_kernel<<<1, 1024, 0, stream>>>(workspace, count, total_norm,
                                                     per_tensor_norms);
  return cudaGetLastError();
}

}  // namespace torchspeed::kernels::cuda
