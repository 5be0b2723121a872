"""int8 quantization: affine quantize / dequantize kernels and min-max quantization parameters
(re-exports only: each name lives in the module named beside it below).

    scale, zp = torchspeed.quant.choose_qparams(w, granularity="per_channel")   # symmetric
    q = torchspeed.quant.quantize_int8(w, scale, zp)        # int8, CPU SIMD or CUDA
    w_hat = torchspeed.quant.dequantize_int8(q, scale, zp)  # float32, |w_hat - w| <= scale / 2

The granularity is scale's shape, for x viewed as [rows, cols] (cols = its last dim): one element
(per tensor), [rows] (per channel, e.g. a Linear weight's output channels) or [rows, groups] (per
group of cols / groups consecutive elements).

Quantization-aware training: ``fake_quantize(x, scale, zero_point)`` (one fused pass, with a
straight-through gradient, fp32/bf16/fp16), the calibration observers (``MinMaxObserver``,
``MovingAverageMinMaxObserver``, ``PercentileObserver``) and the ``FakeQuantize`` module that
combines both, like torch.ao.quantization.FakeQuantize.

Inference: ``Int8Linear`` / ``quantize_dynamic(model)`` (exact int8 GEMM on every CPU ISA and CUDA,
per-channel int8 weights packed once, per-row dynamic activations).
"""

from ._ops import dequantize_int8, fake_quantize, int8_linear, int8_pack_weight, quantize_int8
from .affine import choose_qparams, qparams_from_minmax
from .dynamic import quantize_dynamic
from .fake_quant import FakeQuantize
from .linear import Int8Linear, int8_path
from .observer import MinMaxObserver, MovingAverageMinMaxObserver, PercentileObserver

__all__ = [
    "quantize_int8",
    "dequantize_int8",
    "choose_qparams",
    "Int8Linear",
    "quantize_dynamic",
    "int8_linear",
    "int8_pack_weight",
    "int8_path",
    "qparams_from_minmax",
    "fake_quantize",
    "FakeQuantize",
    "MinMaxObserver",
    "MovingAverageMinMaxObserver",
    "PercentileObserver",
]
