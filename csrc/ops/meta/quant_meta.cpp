// Meta (shape-only) implementation of the quant ops (quantize_int8, dequantize_int8,
// fake_quantize(_backward), int8_pack_weight, int8_linear): validates and returns empty results of
// the right shapes and dtypes. Also registered for the sparse keys.
#include <ATen/ATen.h>
#include <torch/library.h>

#include "ops/quant_checks.h"

namespace torchspeed::ops {
namespace {

at::Tensor quantize_int8_meta(const QuantizeInt8Args& a) {
  validate(a);
  return at::empty_symint(a.x.sym_sizes(), a.x.options().dtype(at::kChar));
}

at::Tensor dequantize_int8_meta(const DequantizeInt8Args& a) {
  validate(a);
  return at::empty_symint(a.q.sym_sizes(), a.q.options().dtype(at::kFloat));
}

at::Tensor int8_pack_weight_meta(const Int8PackWeightArgs& a) {
  validate(a);
  return at::empty_symint({int8_packed_bytes(a.w.sym_size(0), a.w.sym_size(1))},
                          a.w.options().dtype(at::kByte));
}

at::Tensor int8_linear_meta(const Int8LinearArgs& a) {
  const SymInt8LinearShape s = validate(a);
  return at::empty_symint(int8_linear_out_shape(a.x, s.n), a.x.options());
}

FakeQuantizeResult fake_quantize_meta(const FakeQuantizeArgs& a) {
  validate(a);
  return {at::empty_symint(a.x.sym_sizes(), a.x.options()),
          at::empty_symint(a.x.sym_sizes(), a.x.options().dtype(at::kBool))};
}

at::Tensor fake_quantize_backward_meta(const FakeQuantizeBackwardArgs& a) {
  validate(a);
  return at::empty_symint(a.grad.sym_sizes(), a.grad.options());
}

}  // namespace

void register_quant_validators(torch::Library& m) {
  TORCHSPEED_OP_IMPL(m, QuantizeInt8Args, quantize_int8_meta);
  TORCHSPEED_OP_IMPL(m, DequantizeInt8Args, dequantize_int8_meta);
  TORCHSPEED_OP_IMPL(m, Int8PackWeightArgs, int8_pack_weight_meta);
  TORCHSPEED_OP_IMPL(m, Int8LinearArgs, int8_linear_meta);
  TORCHSPEED_OP_IMPL(m, FakeQuantizeArgs, fake_quantize_meta);
  TORCHSPEED_OP_IMPL(m, FakeQuantizeBackwardArgs, fake_quantize_backward_meta);
}

TORCH_LIBRARY_IMPL(torchspeed, Meta, m) { register_quant_validators(m); }
TORCHSPEED_REGISTER_FOR_SPARSE_KEYS(register_quant_validators)

}  // namespace torchspeed::ops
