"""Typed wrappers of the quant area's ops (csrc/ops/quant.cpp): int8 affine quantize / dequantize,
fake quantization with its straight-through gradient, and the int8 Linear's packing and GEMM.

Each op is found through ``torchspeed._native.native_op``: a build without the quant area
(``TORCHSPEED_WITH_QUANT=OFF``) raises the one "area not built" error when a wrapper is called.
The ops validate their tensors (RuntimeError naming the argument, as torch's own ops); the
wrappers refuse an argument of the wrong Python type with a TypeError first.
"""

from __future__ import annotations

import numbers
from typing import Optional

import torch

from .._native import AreaNotBuiltError, native_op

__all__ = [
    "quantize_int8",
    "dequantize_int8",
    "fake_quantize",
    "int8_pack_weight",
    "int8_linear",
]


def _op(name: str):
    return native_op(name, "quant", what=f"torchspeed.quant.{name}")


def _tensor(v, op: str, label: str, optional: bool = False) -> None:
    if optional and v is None:
        return
    if not isinstance(v, torch.Tensor):
        raise TypeError(
            f"torchspeed.quant.{op}: {label} must be a tensor{' or None' if optional else ''}, "
            f"got {type(v).__name__}"
        )


def _int(v, op: str, label: str) -> int:
    if isinstance(v, bool) or not isinstance(v, numbers.Integral):
        raise TypeError(f"torchspeed.quant.{op}: {label} must be an int, got {v!r}")
    if not -(2**63) <= v < 2**63:
        raise ValueError(f"torchspeed.quant.{op}: {label} must fit in int64, got {v}")
    return int(v)


def quantize_int8(
    x: torch.Tensor, scale: torch.Tensor, zero_point: Optional[torch.Tensor] = None
) -> torch.Tensor:
    """``clamp(round_half_even(x * (1 / scale)) + zero_point, -128, 127)`` as int8 (NaN gives
    127, as torch.quantize_per_tensor does).

    x: contiguous float32, bfloat16 or float16 (computed in fp32: equal to torch's formula on
    ``x.float()`` bit for bit). scale: float32 > 0, one element / [rows] / [rows, groups].
    zero_point: int32 of scale's shape in [-128, 127], or None (symmetric). On CPU the values of
    scale and zero_point are checked; on CUDA they stay on the device (no synchronisation)."""
    _tensor(x, "quantize_int8", "x")
    _tensor(scale, "quantize_int8", "scale")
    _tensor(zero_point, "quantize_int8", "zero_point", optional=True)
    return _op("quantize_int8")(x, scale, zero_point)


def dequantize_int8(
    q: torch.Tensor, scale: torch.Tensor, zero_point: Optional[torch.Tensor] = None
) -> torch.Tensor:
    """``(q - zero_point) * scale`` as float32, with quantize_int8's granularity rule."""
    _tensor(q, "dequantize_int8", "q")
    _tensor(scale, "dequantize_int8", "scale")
    _tensor(zero_point, "dequantize_int8", "zero_point", optional=True)
    return _op("dequantize_int8")(q, scale, zero_point)


def fake_quantize(
    x: torch.Tensor,
    scale: torch.Tensor,
    zero_point: Optional[torch.Tensor] = None,
    quant_min: int = -128,
    quant_max: int = 127,
) -> torch.Tensor:
    """``(clamp(round_half_even(x * (1 / scale)) + zp, quant_min, quant_max) - zp) * scale``.

    Computed in fp32 for float32, bfloat16 and float16 x, returned in x's dtype (bit for bit
    torch.fake_quantize_per_tensor_affine / per_channel_affine on float32, and that formula on
    ``x.float()`` for bf16/fp16). scale: float32 > 0 with quantize_int8's granularity rule (one
    element, [rows], [rows, groups] for x viewed as [rows, cols]); zero_point: int32 of scale's
    shape within [quant_min, quant_max], or None (0). Gradient with respect to x: ``grad *
    (quant_min <= round(x / scale) + zp <= quant_max)`` (none for scale and zero_point).
    A non-contiguous x is made contiguous first."""
    _tensor(x, "fake_quantize", "x")
    _tensor(scale, "fake_quantize", "scale")
    _tensor(zero_point, "fake_quantize", "zero_point", optional=True)
    qmin = _int(quant_min, "fake_quantize", "quant_min")
    qmax = _int(quant_max, "fake_quantize", "quant_max")
    return _op("fake_quantize")(x.contiguous(), scale, zero_point, qmin, qmax)[0]


def _setup_context(ctx, inputs, output):
    ctx.save_for_backward(output[1])


def _backward(ctx, grad_y, grad_mask):
    (mask,) = ctx.saved_tensors
    # grad_y * mask in one pass (torch's `dY * mask` casts the bool mask on the fly, 2x slower)
    return (_op("fake_quantize_backward")(grad_y.contiguous(), mask), None, None, None, None)


def _register_autograd() -> None:
    """The op returns (y, mask) from one pass over x; its backward is ``grad_y * mask``, the
    clamp-masked straight-through estimator of torch's ``fake_quantize_per_*_affine_cachemask``."""
    try:
        _op("fake_quantize")
    except AreaNotBuiltError:
        return  # built without the quant area: fake_quantize raises when it is called
    torch.library.register_autograd(
        "torchspeed::fake_quantize", _backward, setup_context=_setup_context
    )


_register_autograd()


def int8_pack_weight(w: torch.Tensor) -> torch.Tensor:
    """Packs an int8 [N, K] weight (values in [-127, 127]) for the current CPU int8 path."""
    _tensor(w, "int8_pack_weight", "w")
    return _op("int8_pack_weight")(w)


def int8_linear(
    x: torch.Tensor,
    packed_w: torch.Tensor,
    w_scale: torch.Tensor,
    bias: Optional[torch.Tensor] = None,
    relu: bool = False,
) -> torch.Tensor:
    """``act(float(q(x) @ w.T) * (x_scale * w_scale) + bias)`` in x's dtype, x quantized per row.

    packed_w: ``int8_pack_weight(w)`` on CPU, the int8 [N, K] weight itself on CUDA."""
    _tensor(x, "int8_linear", "x")
    _tensor(packed_w, "int8_linear", "packed_w")
    _tensor(w_scale, "int8_linear", "w_scale")
    _tensor(bias, "int8_linear", "bias", optional=True)
    if not isinstance(relu, bool):
        raise TypeError(f"torchspeed.quant.int8_linear: relu must be a bool, got {relu!r}")
    return _op("int8_linear")(x, packed_w, w_scale, bias, relu)
