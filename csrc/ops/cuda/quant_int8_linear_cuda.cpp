// CUDA implementation of torchspeed::int8_linear: validates (shapes and dtypes; values stay on the
// device), then enqueues the torch-free kernels declared in kernels/cuda/api.cuh on the current
// stream: quantize_rows_int8 (per-row scales and int8 rows), then int8_linear (int8 tensor cores,
// exact int32, the fused fp32 epilogue). The weight is the plain contiguous int8 [N, K]
// (int8_pack_weight is CPU only). No host synchronisation.
#include <ATen/ATen.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/library.h>

#include "kernels/cuda/api.cuh"
#include "ops/quant_checks.h"

namespace torchspeed::ops {
namespace {

namespace kc = kernels::cuda;

at::Tensor int8_linear_cuda(const Int8LinearArgs& a) {
  const char* op = Int8LinearArgs::kName;
  const SymInt8LinearShape s = validate(a);
  TORCH_CHECK(!s.packed, "torchspeed.", op,
              ": on CUDA packed_w must be the contiguous int8 [N, K] weight, got a CPU-packed "
              "uint8 buffer");
  const int64_t m = s.m.expect_int(), n = s.n.expect_int(), k = s.k.expect_int();
  const c10::cuda::CUDAGuard guard(a.x.device());
  std::vector<int64_t> shape(a.x.sizes().begin(), a.x.sizes().end());
  shape.back() = n;
  at::Tensor out = at::empty(shape, a.x.options());
  if (m == 0) return out;
  at::Tensor q = at::empty({m, k}, a.x.options().dtype(at::kChar));
  at::Tensor x_scale = at::empty({m}, a.x.options().dtype(at::kFloat));
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  const auto dtype = kernel_dtype(a.x.scalar_type());
  cudaError_t err = kc::quantize_rows_int8(dtype, a.x.data_ptr(), m, k, q.data_ptr<int8_t>(),
                                           x_scale.data_ptr<float>(), stream);
  TORCH_CHECK(err == cudaSuccess, "torchspeed.", op,
              ": CUDA launch failed (row quantization): ", cudaGetErrorString(err));
  err = kc::int8_linear(q.data_ptr<int8_t>(), x_scale.data_ptr<float>(),
                        a.packed_w.data_ptr<int8_t>(), a.w_scale.data_ptr<float>(),
                        a.bias ? a.bias->data_ptr<float>() : nullptr, a.relu, dtype, out.data_ptr(),
                        m, n, k, stream);
  TORCH_CHECK(err == cudaSuccess, "torchspeed.", op,
              ": CUDA launch failed (int8 GEMM): ", cudaGetErrorString(err));
  return out;
}

}  // namespace

TORCH_LIBRARY_IMPL(torchspeed, CUDA, m) { TORCHSPEED_OP_IMPL(m, Int8LinearArgs, int8_linear_cuda); }

}  // namespace torchspeed::ops
