"""Fake quantization for quantization-aware training: the ``FakeQuantize`` module (an observer +
fake-quant, like torch.ao.quantization.FakeQuantize) over the fused op ``fake_quantize``
(torchspeed.quant._ops, with a straight-through gradient).

    y = torchspeed.quant.fake_quantize(w, scale, zero_point)   # w's dtype, differentiable

    fq = FakeQuantize(MovingAverageMinMaxObserver, granularity="per_channel")
    w_q = fq(linear.weight)          # observes, then fake-quantizes; gradients pass through

The op ``torch.ops.torchspeed.fake_quantize`` returns (y, mask) from one pass over x; its backward
(registered in torchspeed.quant._ops with torch.library.register_autograd) is ``grad_y * mask``,
the clamp-masked straight-through estimator of torch's ``fake_quantize_per_*_affine_cachemask``.
"""

from __future__ import annotations

import torch
from torch import nn

from ._ops import fake_quantize
from .observer import MovingAverageMinMaxObserver, _apply_keeping_buffer_dtypes, _Observer


class FakeQuantize(nn.Module):
    """Observer + fake quantization, like torch.ao.quantization.FakeQuantize.

    ``observer``: an observer class (constructed with ``**observer_kwargs``) or instance from
    torchspeed.quant.observer. forward(x): when the observer is enabled, records x and refreshes
    ``scale`` / ``zero_point`` (buffers, in the state_dict) from it; when fake-quant is enabled,
    returns ``fake_quantize(x, scale, zero_point)`` over the observer's range ([-127, 127]
    symmetric, [-128, 127] affine), else x. ``enable_fake_quant`` / ``disable_fake_quant`` /
    ``enable_observer`` / ``disable_observer`` toggle them (``fake_quant_enabled`` and
    ``observer_enabled`` are uint8 buffers, as in torch.ao).

    Only torchspeed.quant observers are accepted (TypeError otherwise): torch.ao's observers use
    torch.ao's qparams formula and ``ch_axis`` layout, not torchspeed's (pass torch.ao's
    ``qscheme`` to a torchspeed observer instead). A forward that raises (NaN / inf in x, a dtype
    the op does not take, x on another device than the buffers) leaves the module unchanged: the
    observer's record and ``scale`` / ``zero_point`` are written only once everything succeeded.
    ``scale`` stays float32 and ``zero_point`` int32 under module dtype casts (``.half()``,
    ``.to(torch.bfloat16)``), as do the observer's ranges."""

    def __init__(self, observer=None, **observer_kwargs) -> None:
        super().__init__()
        if observer is None:
            observer = MovingAverageMinMaxObserver
        if (isinstance(observer, type) and not issubclass(observer, _Observer)) or (
            not isinstance(observer, type) and not isinstance(observer, _Observer)
        ):
            what = observer if isinstance(observer, type) else type(observer)
            raise TypeError(
                "torchspeed.quant.FakeQuantize: observer must be a torchspeed.quant observer "
                "class or instance (MinMaxObserver, MovingAverageMinMaxObserver, "
                f"PercentileObserver), got {what.__module__}.{what.__qualname__}; torch.ao "
                "observers are not supported (give a torchspeed observer torch.ao's qscheme)"
            )
        if isinstance(observer, type):
            observer = observer(**observer_kwargs)
        elif observer_kwargs:
            raise ValueError(
                "torchspeed.quant.FakeQuantize: observer_kwargs apply to an observer class, "
                "not to an instance"
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

    def _apply(self, fn, recurse=True):
        return _apply_keeping_buffer_dtypes(self, fn, recurse)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not isinstance(x, torch.Tensor):
            raise TypeError(
                f"torchspeed.quant.FakeQuantize: x must be a tensor, got {type(x).__name__}"
            )
        quantize = bool(self.fake_quant_enabled[0] == 1)
        if quantize:
            # refused before the observer records anything
            if x.dtype not in (torch.float32, torch.bfloat16, torch.float16):
                raise ValueError(
                    "torchspeed.quant.FakeQuantize: x must be float32, bfloat16 or float16, got "
                    f"{x.dtype}"
                )
            if x.device != self.scale.device:
                raise ValueError(
                    f"torchspeed.quant.FakeQuantize: x is on {x.device} but the module's buffers "
                    f"are on {self.scale.device} (move the module with .to(x.device))"
                )
        scale, zp = self.scale, self.zero_point
        observe = bool(self.observer_enabled[0] == 1)
        obs = self.activation_post_process
        if observe:
            # the observer replaces its buffers (never in place): restoring the references
            # undoes its record if anything below raises
            saved = dict(obs._buffers)
            try:
                obs(x.detach())
                scale, zp = self.calculate_qparams()
                scale, zp = scale.to(self.scale.device), zp.to(self.zero_point.device)
            except Exception:
                obs._buffers.update(saved)
                raise
        if quantize:
            try:
                x = fake_quantize(
                    x, scale, None if self.symmetric else zp, self.quant_min, self.quant_max
                )
            except Exception:
                if observe:
                    obs._buffers.update(saved)
                raise
        if observe:
            if self.scale.shape != scale.shape:
                self.scale.resize_(scale.shape)
                self.zero_point.resize_(zp.shape)
            self.scale.copy_(scale)
            self.zero_point.copy_(zp)
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


__all__ = ["FakeQuantize"]
