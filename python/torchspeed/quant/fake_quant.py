"""Fake quantization for quantization-aware training: ``fake_quantize`` (the fused op with a
straight-through gradient) and the ``FakeQuantize`` module (an observer + fake-quant, like
torch.ao.quantization.FakeQuantize).

    y = torchspeed.quant.fake_quantize(w, scale, zero_point)   # w's dtype, differentiable

    fq = FakeQuantize(MovingAverageMinMaxObserver, granularity="per_channel")
    w_q = fq(linear.weight)          # observes, then fake-quantizes; gradients pass through

The op ``torch.ops.torchspeed.fake_quantize`` returns (y, mask) from one pass over x; its backward
(registered here with torch.library.register_autograd) is ``grad_y * mask``, the clamp-masked
straight-through estimator of torch's ``fake_quantize_per_*_affine_cachemask``.
"""

from __future__ import annotations

from typing import Optional

import torch
from torch import nn

_OP = "torchspeed::fake_quantize"


def _fake_quant_op():
    op = getattr(torch.ops.torchspeed, "fake_quantize", None)
    if op is None:
        raise RuntimeError(
            "torchspeed.fake_quantize: built without the quant area (TORCHSPEED_WITH_QUANT=OFF)"
        )
    return op


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
    return _fake_quant_op()(x.contiguous(), scale, zero_point, quant_min, quant_max)[0]


def _setup_context(ctx, inputs, output):
    ctx.save_for_backward(output[1])


def _backward(ctx, grad_y, grad_mask):
    (mask,) = ctx.saved_tensors
    # grad_y * mask in one pass (torch's `dY * mask` casts the bool mask on the fly, 2x slower)
    return (
        torch.ops.torchspeed.fake_quantize_backward(grad_y.contiguous(), mask),
        None,
        None,
        None,
        None,
    )


if hasattr(torch.ops.torchspeed, "fake_quantize"):
    torch.library.register_autograd(_OP, _backward, setup_context=_setup_context)


class FakeQuantize(nn.Module):
    """Observer + fake quantization, like torch.ao.quantization.FakeQuantize.

    ``observer``: an observer class (constructed with ``**observer_kwargs``) or instance from
    torchspeed.quant.observer. forward(x): when the observer is enabled, records x and refreshes
    ``scale`` / ``zero_point`` (buffers, in the state_dict) from it; when fake-quant is enabled,
    returns ``fake_quantize(x, scale, zero_point)`` over the observer's range ([-127, 127]
    symmetric, [-128, 127] affine), else x. ``enable_fake_quant`` / ``disable_fake_quant`` /
    ``enable_observer`` / ``disable_observer`` toggle them (``fake_quant_enabled`` and
    ``observer_enabled`` are uint8 buffers, as in torch.ao)."""

    def __init__(self, observer=None, **observer_kwargs) -> None:
        super().__init__()
        if observer is None:
            from torchspeed.quant.observer import MovingAverageMinMaxObserver

            observer = MovingAverageMinMaxObserver
        if isinstance(observer, type):
            observer = observer(**observer_kwargs)
        elif observer_kwargs:
            raise ValueError(
                "torchspeed.quant.FakeQuantize: observer_kwargs apply to an observer class, "
                "not to an instance"
            )
        if not hasattr(observer, "calculate_qparams"):
            raise TypeError(
                "torchspeed.quant.FakeQuantize: observer must be a torchspeed.quant observer, "
                f"got {type(observer).__name__}"
            )
        self.activation_post_process = observer
        self.quant_min = observer.quant_min
        self.quant_max = observer.quant_max
        self.symmetric = observer.symmetric
        self.register_buffer("fake_quant_enabled", torch.tensor([1], dtype=torch.uint8))
        self.register_buffer("observer_enabled", torch.tensor([1], dtype=torch.uint8))
        self.register_buffer("scale", torch.tensor([1.0], dtype=torch.float32))
        self.register_buffer("zero_point", torch.tensor([0], dtype=torch.int32))

    def enable_fake_quant(self, enabled: bool = True) -> FakeQuantize:
        self.fake_quant_enabled[0] = 1 if enabled else 0
        return self

    def disable_fake_quant(self) -> FakeQuantize:
        return self.enable_fake_quant(False)

    def enable_observer(self, enabled: bool = True) -> FakeQuantize:
        self.observer_enabled[0] = 1 if enabled else 0
        return self

    def disable_observer(self) -> FakeQuantize:
        return self.enable_observer(False)

    def calculate_qparams(self):
        return self.activation_post_process.calculate_qparams()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.observer_enabled[0] == 1:
            self.activation_post_process(x.detach())
            scale, zp = self.calculate_qparams()
            scale, zp = scale.to(self.scale.device), zp.to(self.zero_point.device)
            if self.scale.shape != scale.shape:
                self.scale.resize_(scale.shape)
                self.zero_point.resize_(zp.shape)
            self.scale.copy_(scale)
            self.zero_point.copy_(zp)
        if self.fake_quant_enabled[0] == 1:
            x = fake_quantize(
                x,
                self.scale,
                None if self.symmetric else self.zero_point,
                self.quant_min,
                self.quant_max,
            )
        return x

    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs):
        # scale / zero_point take the saved shapes (per channel / per group), as torch.ao does.
        for name in ("scale", "zero_point"):
            key = prefix + name
            if key in state_dict:
                getattr(self, name).resize_(state_dict[key].shape)
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)

    def extra_repr(self) -> str:
        return (
            f"fake_quant_enabled={int(self.fake_quant_enabled[0])}, "
            f"observer_enabled={int(self.observer_enabled[0])}, quant_min={self.quant_min}, "
            f"quant_max={self.quant_max}, symmetric={self.symmetric}"
        )


__all__ = ["fake_quantize", "FakeQuantize"]
