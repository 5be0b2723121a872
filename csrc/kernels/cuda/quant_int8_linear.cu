// The int8 Linear's CUDA kernels (contract in api.cuh; the CPU kernels compute the same numbers):
//   - quantize_rows_int8: one block per row, an absmax reduction then the quantization pass;
//   - int8_linear: out = act(float(a @ w^T) * (a_scale * w_scale) + bias), int8 tensor cores
//     (mma.sync.m16n8k32.s8.s8.s32) on a 128x128x64 block tile, 8 warps of 64x32, a 2-stage
//     shared-memory pipeline (cp.async 16-byte copies when K % 16 == 0 and the rows are aligned,
//     guarded byte loads otherwise), any M, N, K >= 1 (edges zero-filled), the epilogue fused into
//     the store. GPUs below sm_80 (no int8 m16n8k32) take a simple int32 dot-product kernel.
// The element math (row scale, rounding, epilogue) is quant_math.cuh's, compared bit for bit with
// the CPU formula on the host by ctest (tests/cpp/test_cuda_math_host.cpp).
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/cuda/api.cuh"
#include "kernels/cuda/numerics.cuh"
#include "kernels/cuda/quant_math.cuh"

namespace torchspeed::kernels::cuda {
namespace {

// ---- quantize_rows_int8 -------------------------------------------------------------------------

constexpr int kRowThreads = 256;

template <typename T>
__global__ void __launch_bounds__(kRowThreads)
    quantize_rows_kernel(const T* __restrict__ x, int64_t cols, int8_t* __restrict__ q,
                         float* __restrict__ scale) {
  const int64_t row = blockIdx.x;
  const T* xr = x + row * cols;
  int8_t* qr = q + row * cols;
  float m = 0.f;
  for (int64_t k = threadIdx.x; k < cols; k += kRowThreads)
    m = max_gt(absmax_operand(to_acc(xr[k])), m);
  // max is order-independent on non-NaN values (NaN became +inf above): any reduction tree gives
  // the CPU's result.
  for (int off = 16; off > 0; off >>= 1) m = max_gt(__shfl_xor_sync(0xffffffffu, m, off), m);
  __shared__ float warp_max[kRowThreads / 32];
  __shared__ float row_scale;
  if ((threadIdx.x & 31) == 0) warp_max[threadIdx.x >> 5] = m;
  __syncthreads();
  if (threadIdx.x == 0) {
    float r = warp_max[0];
    for (int w = 1; w < kRowThreads / 32; ++w) r = max_gt(warp_max[w], r);
    row_scale = row_scale_int8(r);
    scale[row] = row_scale;
  }
  __syncthreads();
  const float inv = __frcp_rn(row_scale);  // 1 / scale in fp32, correctly rounded
  for (int64_t k = threadIdx.x; k < cols; k += kRowThreads) {
    qr[k] = quantize_row_element(to_acc(xr[k]), inv);
  }
}

// ---- int8_linear: tiles -------------------------------------------------------------------------

constexpr int kBM = 128, kBN = 128, kBK = 64;
constexpr int kStages = 2;     // double buffering: tile k + 1 loads while tile k is multiplied
constexpr int kThreads = 256;  // 8 warps: 2 along M x 4 along N
constexpr int kWarpM = 64, kWarpN = 32;
constexpr int kMTiles = kWarpM / 16, kNTiles = kWarpN / 8;
// Shared rows padded from 64 to 80 bytes: the fragments' 32-bit loads (8 rows x 4 words per warp
// access) then hit 32 distinct banks, and rows stay 16-byte aligned for cp.async.
constexpr int kLds = kBK + 16;
constexpr int kTileBytes = kBM * kLds;  // one operand's tile (kBM == kBN)
constexpr int kSmemBytes = 2 * kStages * kTileBytes;
static_assert(kBM == kBN, "the A and B tiles share one layout");
static_assert(kSmemBytes <= 48 * 1024, "static shared memory limit");

__device__ __forceinline__ void cp_async_16(void* smem, const void* gmem, bool valid) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  const unsigned dst = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  const int src_bytes = valid ? 16 : 0;  // 0: the 16 bytes are zero-filled
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(gmem),
               "r"(src_bytes)
               : "memory");
#else
  *static_cast<int4*>(smem) = valid ? *static_cast<const int4*>(gmem) : make_int4(0, 0, 0, 0);
#endif
}
__device__ __forceinline__ void cp_async_commit() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.commit_group;\n" ::: "memory");
#endif
}
template <int N>
__device__ __forceinline__ void cp_async_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
#endif
}

/// Copies rows [row0, row0 + 128) x bytes [k0, k0 + 64) of a row-major [rows, K] int8 matrix into
/// a shared tile (row stride kLds), zeros outside the matrix. kAligned: K % 16 == 0 and a 16-byte
/// aligned base, so every 16-byte chunk is either wholly inside or wholly outside.
template <bool kAligned>
__device__ __forceinline__ void load_tile(int8_t* tile, const int8_t* __restrict__ g, int64_t rows,
                                          int64_t K, int64_t row0, int64_t k0) {
  constexpr int kChunks = kBM * kBK / 16;  // 512 chunks of 16 bytes, 2 per thread
#pragma unroll
  for (int c = threadIdx.x; c < kChunks; c += kThreads) {
    const int r = c / (kBK / 16), kc = (c % (kBK / 16)) * 16;
    const int64_t gr = row0 + r, gk = k0 + kc;
    int8_t* dst = tile + r * kLds + kc;
    if constexpr (kAligned) {
      const bool valid = gr < rows && gk < K;
      cp_async_16(dst, valid ? g + gr * K + gk : g, valid);
    } else {
      alignas(16) int8_t v[16];
#pragma unroll
      for (int i = 0; i < 16; ++i) v[i] = (gr < rows && gk + i < K) ? g[gr * K + gk + i] : 0;
      *reinterpret_cast<int4*>(dst) = *reinterpret_cast<const int4*>(v);
    }
  }
}

__device__ __forceinline__ void mma_s8(int (&c)[4], const uint32_t (&a)[4],
                                       const uint32_t (&b)[2]) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile(
      "mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
      "{%8, %9}, {%0, %1, %2, %3};\n"
      : "+r"(c[0]), "+r"(c[1]), "+r"(c[2]), "+r"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
#else
  (void)c;
  (void)a;
  (void)b;
  __trap();  // never launched below sm_80 (int8_linear picks the simple kernel there)
#endif
}

template <typename Out>
__device__ __forceinline__ void store_out(Out* out, int64_t N, int64_t m, int64_t n, int32_t acc,
                                          const float* a_scale, const float* w_scale,
                                          const float* bias, bool relu) {
  const float v = int8_linear_epilogue(acc, a_scale[m], w_scale[n], bias ? bias[n] : 0.f,
                                       bias != nullptr, relu);
  out[m * N + n] = from_acc<Out>(v);
}

template <bool kAligned, typename Out>
__global__ void __launch_bounds__(kThreads)
    int8_linear_mma_kernel(const int8_t* __restrict__ a, const float* __restrict__ a_scale,
                           const int8_t* __restrict__ w, const float* __restrict__ w_scale,
                           const float* __restrict__ bias, bool relu, Out* __restrict__ out,
                           int64_t M, int64_t N, int64_t K) {
  __shared__ __align__(16) int8_t smem[kSmemBytes];
  int8_t* a_tiles = smem;                         // kStages tiles of A
  int8_t* b_tiles = smem + kStages * kTileBytes;  // kStages tiles of W
  const int64_t m0 = static_cast<int64_t>(blockIdx.y) * kBM;
  const int64_t n0 = static_cast<int64_t>(blockIdx.x) * kBN;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int wm = (warp >> 2) * kWarpM, wn = (warp & 3) * kWarpN;
  const int g = lane >> 2, t = lane & 3;  // the mma fragments' groupID, threadID_in_group

  int acc[kMTiles][kNTiles][4];
#pragma unroll
  for (int i = 0; i < kMTiles; ++i)
#pragma unroll
    for (int j = 0; j < kNTiles; ++j)
#pragma unroll
      for (int r = 0; r < 4; ++r) acc[i][j][r] = 0;

  const int64_t k_tiles = (K + kBK - 1) / kBK;
#pragma unroll
  for (int s = 0; s < kStages - 1; ++s) {
    if (s < k_tiles) {
      load_tile<kAligned>(a_tiles + s * kTileBytes, a, M, K, m0, s * kBK);
      load_tile<kAligned>(b_tiles + s * kTileBytes, w, N, K, n0, s * kBK);
    }
    cp_async_commit();
  }

  for (int64_t kt = 0; kt < k_tiles; ++kt) {
    cp_async_wait<kStages - 2>();  // tile kt has landed (this thread's copies)
    __syncthreads();               // ... everyone's, and everyone is done with tile kt - 1
    const int64_t next = kt + kStages - 1;
    if (next < k_tiles) {
      const int st = static_cast<int>(next % kStages);
      load_tile<kAligned>(a_tiles + st * kTileBytes, a, M, K, m0, next * kBK);
      load_tile<kAligned>(b_tiles + st * kTileBytes, w, N, K, n0, next * kBK);
    }
    cp_async_commit();

    const int st = static_cast<int>(kt % kStages);
    const int8_t* at = a_tiles + st * kTileBytes;
    const int8_t* bt = b_tiles + st * kTileBytes;
#pragma unroll
    for (int kk = 0; kk < kBK; kk += 32) {
      // A (row-major 16x32): a0 = (row g, k 4t..4t+3), a1 = row g + 8, a2/a3 = the same at k + 16.
      uint32_t af[kMTiles][4];
#pragma unroll
      for (int i = 0; i < kMTiles; ++i) {
        const int8_t* p = at + (wm + i * 16 + g) * kLds + kk + 4 * t;
        af[i][0] = *reinterpret_cast<const uint32_t*>(p);
        af[i][1] = *reinterpret_cast<const uint32_t*>(p + 8 * kLds);
        af[i][2] = *reinterpret_cast<const uint32_t*>(p + 16);
        af[i][3] = *reinterpret_cast<const uint32_t*>(p + 8 * kLds + 16);
      }
      // B (col-major 32x8 = W's rows): b0 = (k 4t..4t+3, n g), b1 = the same at k + 16.
      uint32_t bf[kNTiles][2];
#pragma unroll
      for (int j = 0; j < kNTiles; ++j) {
        const int8_t* p = bt + (wn + j * 8 + g) * kLds + kk + 4 * t;
        bf[j][0] = *reinterpret_cast<const uint32_t*>(p);
        bf[j][1] = *reinterpret_cast<const uint32_t*>(p + 16);
      }
#pragma unroll
      for (int i = 0; i < kMTiles; ++i)
#pragma unroll
        for (int j = 0; j < kNTiles; ++j) mma_s8(acc[i][j], af[i], bf[j]);
    }
  }
  cp_async_wait<0>();

  // C (16x8 int32): c0, c1 = (row g, cols 2t, 2t + 1), c2, c3 = row g + 8.
#pragma unroll
  for (int i = 0; i < kMTiles; ++i) {
#pragma unroll
    for (int j = 0; j < kNTiles; ++j) {
      const int64_t n = n0 + wn + j * 8 + 2 * t;
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int64_t m = m0 + wm + i * 16 + g + 8 * h;
        if (m >= M) continue;
        if (n < N) store_out(out, N, m, n, acc[i][j][2 * h], a_scale, w_scale, bias, relu);
        if (n + 1 < N)
          store_out(out, N, m, n + 1, acc[i][j][2 * h + 1], a_scale, w_scale, bias, relu);
      }
    }
  }
}

/// Below sm_80: one thread per output, an exact int32 dot product (dp4a-free, any alignment).
template <typename Out>
__global__ void int8_linear_simple_kernel(const int8_t* __restrict__ a,
                                          const float* __restrict__ a_scale,
                                          const int8_t* __restrict__ w,
                                          const float* __restrict__ w_scale,
                                          const float* __restrict__ bias, bool relu,
                                          Out* __restrict__ out, int64_t M, int64_t N, int64_t K) {
  const int64_t n = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t m = blockIdx.y;
  if (n >= N || m >= M) return;
  int32_t acc = 0;
  for (int64_t k = 0; k < K; ++k) acc += static_cast<int32_t>(a[m * K + k]) * w[n * K + k];
  store_out(out, N, m, n, acc, a_scale, w_scale, bias, relu);
}

template <typename Out>
cudaError_t launch_int8_linear(const int8_t* a, const float* a_scale, const int8_t* w,
                               const float* w_scale, const float* bias, bool relu, Out* out,
                               int64_t M, int64_t N, int64_t K, cudaStream_t stream) {
  int device = 0, major = 0;
  cudaError_t err = cudaGetDevice(&device);
  if (err == cudaSuccess) {
    err = cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device);
  }
  if (err != cudaSuccess) return err;
  if (major < 8) {
    if (M > 65535) return cudaErrorInvalidValue;
    const dim3 grid(static_cast<unsigned>((N + 127) / 128), static_cast<unsigned>(M));
    int8_linear_simple_kernel<<<grid, 128, 0, stream>>>(a, a_scale, w, w_scale, bias, relu, out, M,
                                                        N, K);
    return cudaGetLastError();
  }
  const int64_t grid_m = (M + kBM - 1) / kBM, grid_n = (N + kBN - 1) / kBN;
  if (grid_m > 65535 || grid_n > 2147483647LL) return cudaErrorInvalidValue;
  const dim3 grid(static_cast<unsigned>(grid_n), static_cast<unsigned>(grid_m));
  const bool aligned = K % 16 == 0 && reinterpret_cast<uintptr_t>(a) % 16 == 0 &&
                       reinterpret_cast<uintptr_t>(w) % 16 == 0;
  if (aligned) {
    int8_linear_mma_kernel<true, Out>
        <<<grid, kThreads, 0, stream>>>(a, a_scale, w, w_scale, bias, relu, out, M, N, K);
  } else {
    int8_linear_mma_kernel<false, Out>
        <<<grid, kThreads, 0, stream>>>(a, a_scale, w, w_scale, bias, relu, out, M, N, K);
  }
  return cudaGetLastError();
}

}  // namespace

cudaError_t quantize_rows_int8(DType in_dtype, const void* x, int64_t rows, int64_t cols, int8_t* q,
                               float* scale, cudaStream_t stream) {
  if (rows < 0 || cols < 0 || rows > 2147483647LL) return cudaErrorInvalidValue;
  if (rows == 0) return cudaSuccess;
  const unsigned grid = static_cast<unsigned>(rows);
  switch (in_dtype) {
    case DType::kFloat:
      quantize_rows_kernel<<<grid, kRowThreads, 0, stream>>>(static_cast<const float*>(x), cols, q,
                                                             scale);
      break;
    case DType::kBFloat16:
      quantize_rows_kernel<<<grid, kRowThreads, 0, stream>>>(static_cast<const __nv_bfloat16*>(x),
                                                             cols, q, scale);
      break;
    case DType::kHalf:
      quantize_rows_kernel<<<grid, kRowThreads, 0, stream>>>(static_cast<const __half*>(x), cols, q,
                                                             scale);
      break;
    default:
      return cudaErrorInvalidValue;
  }
  return cudaGetLastError();
}

cudaError_t int8_linear(const int8_t* a, const float* a_scale, const int8_t* w,
                        const float* w_scale, const float* bias, bool relu, DType out_dtype,
                        void* out, int64_t M, int64_t N, int64_t K, cudaStream_t stream) {
  if (M < 0 || N < 0 || K < 0) return cudaErrorInvalidValue;
  if (M == 0 || N == 0) return cudaSuccess;  // nothing to write (K == 0 writes act(bias))
  switch (out_dtype) {
    case DType::kFloat:
      return launch_int8_linear(a, a_scale, w, w_scale, bias, relu, static_cast<float*>(out), M, N,
                                K, stream);
    case DType::kBFloat16:
      return launch_int8_linear(a, a_scale, w, w_scale, bias, relu,
                                static_cast<__nv_bfloat16*>(out), M, N, K, stream);
    case DType::kHalf:
      return launch_int8_linear(a, a_scale, w, w_scale, bias, relu, static_cast<__half*>(out), M, N,
                                K, stream);
    default:
      return cudaErrorInvalidValue;
  }
}

}  // namespace torchspeed::kernels::cuda
