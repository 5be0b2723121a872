// CPU implementation of torchspeed::quantize_int8, dequantize_int8 and fake_quantize: validates,
// then runs the ISA kernels (kernels/cpu/quant.h) over segments sharing one (scale, zero_point): a
// row's group, a row, or 64K-element chunks of a per-tensor call, in one parallel region.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <algorithm>
#include <atomic>

#include "kernels/cpu/dispatch.h"
#include "ops/cpu/chunking.h"
#include "ops/quant_checks.h"

namespace torchspeed::ops {
namespace {

/// Runs fn(begin, length, scale_index) over every segment of the layout, in parallel.
template <class F>
void for_each_segment(const QuantLayout& l, F&& fn) {
  const int64_t total = l.rows * l.cols;
  if (total == 0) return;
  if (l.groups == 0) {
    const int64_t chunks = (total + kChunkElements - 1) / kChunkElements;
    at::parallel_for(0, chunks, 1, [&](int64_t b, int64_t e) {
      for (int64_t c = b; c < e; ++c) {
        const int64_t begin = c * kChunkElements;
        fn(begin, std::min(kChunkElements, total - begin), int64_t{0});
      }
    });
    return;
  }
  const int64_t gs = l.group_size();
  const int64_t grain = std::max<int64_t>(1, kChunkElements / std::max<int64_t>(l.cols, 1));
  at::parallel_for(0, l.rows, grain, [&](int64_t b, int64_t e) {
    for (int64_t r = b; r < e; ++r) {
      for (int64_t g = 0; g < l.groups; ++g) fn(r * l.cols + g * gs, gs, r * l.groups + g);
    }
  });
}

at::Tensor quantize_int8_cpu(const QuantizeInt8Args& a) {
  const QuantLayout l = validate(a).concrete();
  const char* op = QuantizeInt8Args::kName;
  check_quant_values(op, a.scale, a.zero_point);
  const auto& table = *rethrow_as_torch_error(op, [] { return &kernels::cpu::cpu_kernels(); });
  at::Tensor q = at::empty(a.x.sizes(), a.x.options().dtype(at::kChar));
  const float* scale = a.scale.data_ptr<float>();
  const int32_t* zp = a.zero_point ? a.zero_point->data_ptr<int32_t>() : nullptr;
  const auto dtype = kernel_dtype(a.x.scalar_type());
  const char* x = static_cast<const char*>(a.x.data_ptr());
  const int64_t es = a.x.element_size();
  int8_t* out = q.data_ptr<int8_t>();
  std::atomic<bool> ok{true};
  for_each_segment(l, [&](int64_t begin, int64_t n, int64_t s) {
    // 1 / scale in fp32, as torch's reference `x * (1.0 / scale)` computes it.
    const float inv = 1.0f / scale[s];
    if (!table.quant.quantize_int8(dtype, x + begin * es, out + begin, n, inv,
                                   zp ? static_cast<float>(zp[s]) : 0.f)) {
      ok = false;
    }
  });
  TORCH_INTERNAL_ASSERT(ok, "torchspeed.", op, ": the validator let through ", a.x.scalar_type());
  return q;
}

at::Tensor dequantize_int8_cpu(const DequantizeInt8Args& a) {
  const QuantLayout l = validate(a).concrete();
  check_quant_values(DequantizeInt8Args::kName, a.scale, a.zero_point);
  const auto& table = *rethrow_as_torch_error(DequantizeInt8Args::kName,
                                              [] { return &kernels::cpu::cpu_kernels(); });
  at::Tensor out = at::empty(a.q.sizes(), a.q.options().dtype(at::kFloat));
  const float* scale = a.scale.data_ptr<float>();
  const int32_t* zp = a.zero_point ? a.zero_point->data_ptr<int32_t>() : nullptr;
  const int8_t* q = a.q.data_ptr<int8_t>();
  float* o = out.data_ptr<float>();
  for_each_segment(l, [&](int64_t begin, int64_t n, int64_t s) {
    table.quant.dequantize_int8(q + begin, o + begin, n, scale[s],
                                zp ? static_cast<float>(zp[s]) : 0.f);
  });
  return out;
}

FakeQuantizeResult fake_quantize_cpu(const FakeQuantizeArgs& a) {
  const QuantLayout l = validate(a).concrete();
  const char* op = FakeQuantizeArgs::kName;
  check_fake_quant_values(a);
  const auto& table = *rethrow_as_torch_error(op, [] { return &kernels::cpu::cpu_kernels(); });
  at::Tensor y = at::empty(a.x.sizes(), a.x.options());
  at::Tensor mask = at::empty(a.x.sizes(), a.x.options().dtype(at::kBool));
  const float* scale = a.scale.data_ptr<float>();
  const int32_t* zp = a.zero_point ? a.zero_point->data_ptr<int32_t>() : nullptr;
  const auto dtype = kernel_dtype(a.x.scalar_type());
  const char* x = static_cast<const char*>(a.x.data_ptr());
  char* out = static_cast<char*>(y.data_ptr());
  uint8_t* m = reinterpret_cast<uint8_t*>(mask.data_ptr<bool>());
  const int64_t es = a.x.element_size();
  const float qmin = static_cast<float>(a.quant_min), qmax = static_cast<float>(a.quant_max);
  std::atomic<bool> ok{true};
  for_each_segment(l, [&](int64_t begin, int64_t n, int64_t s) {
    // 1 / scale in fp32, as torch's fake_quantize kernels compute `1.0f / scale`.
    if (!table.quant.fake_quantize(dtype, x + begin * es, out + begin * es, m + begin, n, scale[s],
                                   1.0f / scale[s], zp ? static_cast<float>(zp[s]) : 0.f, qmin,
                                   qmax)) {
      ok = false;
    }
  });
  TORCH_INTERNAL_ASSERT(ok, "torchspeed.", op, ": the validator let through ", a.x.scalar_type());
  return {y, mask};
}

at::Tensor fake_quantize_backward_cpu(const FakeQuantizeBackwardArgs& a) {
  validate(a);
  const char* op = FakeQuantizeBackwardArgs::kName;
  const auto& table = *rethrow_as_torch_error(op, [] { return &kernels::cpu::cpu_kernels(); });
  at::Tensor out = at::empty(a.grad.sizes(), a.grad.options());
  const auto dtype = kernel_dtype(a.grad.scalar_type());
  const char* g = static_cast<const char*>(a.grad.data_ptr());
  const uint8_t* m = reinterpret_cast<const uint8_t*>(a.mask.data_ptr<bool>());
  char* o = static_cast<char*>(out.data_ptr());
  const int64_t es = a.grad.element_size();
  std::atomic<bool> ok{true};
  for_each_segment(QuantLayout{1, a.grad.numel(), 0}, [&](int64_t begin, int64_t n, int64_t) {
    if (!table.quant.fake_quantize_backward(dtype, g + begin * es, m + begin, o + begin * es, n)) {
      ok = false;
    }
  });
  TORCH_INTERNAL_ASSERT(ok, "torchspeed.", op, ": the validator let through ",
                        a.grad.scalar_type());
  return out;
}

}  // namespace

TORCH_LIBRARY_IMPL(torchspeed, CPU, m) {
  TORCHSPEED_OP_IMPL(m, QuantizeInt8Args, quantize_int8_cpu);
  TORCHSPEED_OP_IMPL(m, DequantizeInt8Args, dequantize_int8_cpu);
  TORCHSPEED_OP_IMPL(m, FakeQuantizeArgs, fake_quantize_cpu);
  TORCHSPEED_OP_IMPL(m, FakeQuantizeBackwardArgs, fake_quantize_backward_cpu);
}

}  // namespace torchspeed::ops
