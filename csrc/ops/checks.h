// Argument checks shared by every op's CPU, CUDA and Meta implementation: all arguments are
// validated before anything is modified, and every message names the op, the argument and the
// value that came in.
#pragma once

#include <ATen/ATen.h>

#include <string>

#include "kernels/common/optim_types.h"

namespace torchspeed::ops {

/// The kernel layer's dtype for a tensor the kernels accept (float32/64, bfloat16, float16).
inline kernels::DType kernel_dtype(at::ScalarType t) {
  switch (t) {
    case at::kDouble:
      return kernels::DType::kDouble;
    case at::kBFloat16:
      return kernels::DType::kBFloat16;
    case at::kHalf:
      return kernels::DType::kHalf;
    default:
      return kernels::DType::kFloat;
  }
}

inline bool is_kernel_float(at::ScalarType t) {
  return t == at::kFloat || t == at::kDouble || t == at::kBFloat16 || t == at::kHalf;
}

/// Checks a list of tensors an op reads or updates: non-empty, dense,
/// float32/float64/bfloat16/float16, all on one device. Returns that device.
inline at::Device check_float_tensor_list(const char* op, const char* arg, at::TensorList list) {
  TORCH_CHECK(!list.empty(), "torchspeed.", op, ": ", arg,
              " must be a non-empty list of tensors, got an empty list");
  const at::Device device = list[0].device();
  for (size_t i = 0; i < list.size(); ++i) {
    const at::Tensor& t = list[i];
    TORCH_CHECK(t.defined(), "torchspeed.", op, ": ", arg, "[", i, "] must be a tensor, got None");
    TORCH_CHECK(t.layout() == at::kStrided, "torchspeed.", op, ": ", arg, "[", i,
                "] must be a dense (strided) tensor, got layout ", t.layout());
    TORCH_CHECK(is_kernel_float(t.scalar_type()), "torchspeed.", op, ": ", arg, "[", i,
                "] must be float32, float64, bfloat16 or float16, got ", t.scalar_type());
    TORCH_CHECK(t.device() == device, "torchspeed.", op, ": ", arg, "[", i, "] must be on ", device,
                " like ", arg, "[0], got ", t.device());
  }
  return device;
}

/// Checks an optional one-element float32 scalar tensor (an AMP inverse scale, found_inf, lr).
inline void check_scalar_tensor(const char* op, const char* arg, const at::Tensor& t,
                                const at::Device& device) {
  TORCH_CHECK(t.sym_numel() == 1 && t.scalar_type() == at::kFloat, "torchspeed.", op, ": ", arg,
              " must be a one-element float32 tensor, got ", t.scalar_type(), " of shape ",
              t.sym_sizes());
  TORCH_CHECK(t.layout() == at::kStrided, "torchspeed.", op, ": ", arg,
              " must be a dense tensor, got layout ", t.layout());
  TORCH_CHECK(t.device() == device, "torchspeed.", op, ": ", arg, " must be on ", device,
              " like the tensors, got ", t.device());
}

/// Converts a std exception from the kernel layer (e.g. a bad TORCHSPEED_CPU_ISA) into a torch
/// error with the op's name.
template <class F>
decltype(auto) rethrow_as_torch_error(const char* op, F&& f) {
  try {
    return f();
  } catch (const c10::Error&) {
    throw;
  } catch (const std::exception& e) {
    TORCH_CHECK(false, "torchspeed.", op, ": ", e.what());
  }
}

}  // namespace torchspeed::ops

/// Registers REGISTER(m) (a function adding validating impls) for the sparse dispatch keys, so a
/// sparse argument gets the op's own "must be dense" error instead of the dispatcher's generic
/// "could not run with arguments from the SparseCPU backend".
#define TORCHSPEED_REGISTER_FOR_SPARSE_KEYS(REGISTER)              \
  TORCH_LIBRARY_IMPL(torchspeed, SparseCPU, m) { REGISTER(m); }    \
  TORCH_LIBRARY_IMPL(torchspeed, SparseCUDA, m) { REGISTER(m); }   \
  TORCH_LIBRARY_IMPL(torchspeed, SparseCsrCPU, m) { REGISTER(m); } \
  TORCH_LIBRARY_IMPL(torchspeed, SparseCsrCUDA, m) { REGISTER(m); }
