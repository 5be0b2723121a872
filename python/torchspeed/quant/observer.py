"""Calibration observers: record the range of the tensors passed through them, then give int8
quantization parameters with torchspeed.quant's one formula (``qparams_from_minmax``, the one
``choose_qparams`` uses).

    obs = MovingAverageMinMaxObserver(granularity="per_channel", symmetric=False)
    for x in calibration_batches:
        obs(x)                              # records, returns x unchanged
    scale, zero_point = obs.calculate_qparams()
    q = torchspeed.quant.quantize_int8(w, scale, zero_point)

Granularity is torchspeed's rule (the existing ``choose_qparams``): x viewed as [rows, cols] (cols =
its last dim); ``per_tensor`` records one range, ``per_channel`` one per row (a Linear weight's
output channels: torch.ao's ``ch_axis=0`` for a 2-D weight), ``per_group`` one per group of
``group_size`` consecutive elements of a row. ``symmetric=True`` maps ``max(|min|, |max|)`` onto
[-127, 127] with zero_point 0; ``symmetric=False`` maps [min, max] (always including 0) onto
[-128, 127] with a zero point. The recorded ``min_val`` / ``max_val`` are buffers (state_dict).

A batch with a NaN or inf raises ValueError naming x and records nothing (torch.ao's observers
would record it and give a NaN/inf scale); on CUDA the check synchronises once per forward, on
the reduced ranges, as torch.ao's ``calculate_qparams`` does. Module dtype casts (``.half()``,
``.to(torch.bfloat16)``) leave the recorded ranges float32.
"""

from __future__ import annotations

import math
from typing import Optional, Tuple

import torch
from torch import nn

from .affine import qparams_from_minmax

_GRANULARITIES = ("per_tensor", "per_channel", "per_group")

# torch.ao qscheme -> (granularity, symmetric), for callers that speak torch.ao.
_QSCHEMES = {
    torch.per_tensor_symmetric: ("per_tensor", True),
    torch.per_tensor_affine: ("per_tensor", False),
    torch.per_channel_symmetric: ("per_channel", True),
    torch.per_channel_affine: ("per_channel", False),
}


def _apply_keeping_buffer_dtypes(module: nn.Module, fn, recurse: bool) -> nn.Module:
    """``nn.Module._apply(fn)``, then every buffer of ``module`` that fn gave another dtype is
    the original one moved to the new device instead (``.half()`` / ``.to(torch.bfloat16)`` /
    ``.type(...)`` cast floating buffers: quantization state must keep its fp32 / integer dtype,
    and casting it back would lose bits)."""
    saved = dict(module._buffers)
    nn.Module._apply(module, fn, recurse)
    for name, old in saved.items():
        new = module._buffers.get(name)
        if old is not None and new is not None and new.dtype != old.dtype:
            module._buffers[name] = old.to(device=new.device)
    return module


def _is_number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _check_eps(eps, name: str) -> None:
    if not _is_number(eps):
        raise TypeError(f"torchspeed.quant.{name}: eps must be finite and > 0, got {eps!r}")
    if not (eps > 0 and math.isfinite(eps)):
        raise ValueError(f"torchspeed.quant.{name}: eps must be finite and > 0, got {eps!r}")


class _Observer(nn.Module):
    """Shared state and qparams: subclasses implement ``_combine(min_now, max_now)``."""

    def __init__(
        self,
        granularity: str = "per_tensor",
        symmetric: bool = True,
        group_size: int = 128,
        eps: float = 1e-12,
        qscheme: Optional[torch.qscheme] = None,
        dtype: torch.dtype = torch.qint8,
    ) -> None:
        super().__init__()
        name = type(self).__name__
        if qscheme is not None:
            if not isinstance(qscheme, torch.qscheme) or qscheme not in _QSCHEMES:
                raise ValueError(
                    f"torchspeed.quant.{name}: qscheme must be one of "
                    f"{list(_QSCHEMES)}, got {qscheme!r}"
                )
            granularity, symmetric = _QSCHEMES[qscheme]
        if not isinstance(granularity, str) or granularity not in _GRANULARITIES:
            raise ValueError(
                f"torchspeed.quant.{name}: granularity must be one of {_GRANULARITIES}, "
                f"got {granularity!r}"
            )
        if not isinstance(symmetric, bool):
            raise TypeError(f"torchspeed.quant.{name}: symmetric must be a bool, got {symmetric!r}")
        if dtype not in (torch.qint8, torch.int8):
            raise ValueError(
                f"torchspeed.quant.{name}: dtype must be torch.qint8 or torch.int8, got {dtype!r}"
            )
        if isinstance(group_size, bool) or not isinstance(group_size, int):
            raise TypeError(
                f"torchspeed.quant.{name}: group_size must be a positive int, got {group_size!r}"
            )
        if group_size < 1:
            raise ValueError(
                f"torchspeed.quant.{name}: group_size must be a positive int, got {group_size!r}"
            )
        _check_eps(eps, name)
        self.granularity = granularity
        self.symmetric = bool(symmetric)
        self.group_size = group_size
        self.eps = float(eps)
        self.dtype = torch.qint8
        self.quant_min, self.quant_max = (-127, 127) if self.symmetric else (-128, 127)
        # Empty until the first forward: then shaped like the qparams ([1], [rows], [rows, groups]).
        self.register_buffer("min_val", torch.tensor([], dtype=torch.float32))
        self.register_buffer("max_val", torch.tensor([], dtype=torch.float32))

    def _apply(self, fn, recurse=True):
        return _apply_keeping_buffer_dtypes(self, fn, recurse)

    def _segments(self, x: torch.Tensor) -> torch.Tensor:
        """x as float32 [segments..., elements]: [1, n], [rows, cols] or [rows, groups, size]."""
        name = type(self).__name__
        if not isinstance(x, torch.Tensor):
            raise TypeError(f"torchspeed.quant.{name}: x must be a tensor, got {type(x).__name__}")
        if x.dim() < 1 or x.numel() == 0:
            raise ValueError(f"torchspeed.quant.{name}: x must be a non-empty tensor")
        if not x.is_floating_point():
            raise ValueError(f"torchspeed.quant.{name}: x must be floating point, got {x.dtype}")
        cols = x.shape[-1]
        v = x.detach().reshape(-1, cols).float()
        if self.granularity == "per_tensor":
            return v.reshape(1, -1)
        if self.granularity == "per_group":
            if cols % self.group_size:
                raise ValueError(
                    f"torchspeed.quant.{name}: group_size {self.group_size} must divide the last "
                    f"dim ({cols})"
                )
            return v.reshape(v.shape[0], cols // self.group_size, self.group_size)
        return v

    def _ranges(self, v: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
        return v.amin(dim=-1), v.amax(dim=-1)

    def _finite(self, v: torch.Tensor, lo: torch.Tensor, hi: torch.Tensor) -> torch.Tensor:
        """A 0-d bool tensor: True when v has no NaN or inf (amin / amax propagate both)."""
        return torch.isfinite(lo).all() & torch.isfinite(hi).all()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        v = self._segments(x)
        lo, hi = self._ranges(v)
        finite = self._finite(v, lo, hi)
        if self.granularity == "per_tensor":
            lo, hi = lo.reshape(1), hi.reshape(1)
        if self.min_val.numel() == 0:
            new_lo, new_hi = lo, hi
        else:
            if self.min_val.shape != lo.shape:
                raise ValueError(
                    f"torchspeed.quant.{type(self).__name__}: x gives ranges of shape "
                    f"{tuple(lo.shape)}, but the observer recorded {tuple(self.min_val.shape)}"
                )
            new_lo, new_hi = self._combine(lo, hi)
        # one host synchronisation for both checks; nothing is recorded before it
        ok = finite & torch.isfinite(new_lo).all() & torch.isfinite(new_hi).all()
        if not bool(ok):
            if not bool(finite):
                raise ValueError(
                    f"torchspeed.quant.{type(self).__name__}: x must be finite (has NaN or inf); "
                    "nothing was recorded"
                )
            raise ValueError(
                f"torchspeed.quant.{type(self).__name__}: x's range combined with the recorded "
                "one overflows float32; nothing was recorded"
            )
        self.min_val = new_lo.detach().clone()
        self.max_val = new_hi.detach().clone()
        return x

    def _combine(self, lo: torch.Tensor, hi: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
        raise NotImplementedError

    def calculate_qparams(self) -> Tuple[torch.Tensor, torch.Tensor]:
        """(scale float32, zero_point int32), shaped [1], [rows] or [rows, groups], from the
        recorded range with choose_qparams' formula."""
        if self.min_val.numel() == 0:
            raise RuntimeError(
                f"torchspeed.quant.{type(self).__name__}: calculate_qparams before any forward "
                "(nothing recorded)"
            )
        scale, zp = qparams_from_minmax(self.min_val, self.max_val, self.symmetric, self.eps)
        return scale.contiguous(), zp.contiguous()

    def reset_min_max_vals(self) -> None:
        self.min_val = torch.tensor([], dtype=torch.float32, device=self.min_val.device)
        self.max_val = torch.tensor([], dtype=torch.float32, device=self.max_val.device)

    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs):
        # The buffers' shapes depend on the data seen: take the saved ones.
        for name in ("min_val", "max_val"):
            key = prefix + name
            if key in state_dict:
                setattr(self, name, torch.empty_like(state_dict[key]))
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)

    def extra_repr(self) -> str:
        return (
            f"granularity={self.granularity!r}, symmetric={self.symmetric}, "
            f"min_val={self.min_val}, max_val={self.max_val}"
        )


class MinMaxObserver(_Observer):
    """The running minimum and maximum of everything observed (torch.ao's MinMaxObserver /
    PerChannelMinMaxObserver, with torchspeed's granularities)."""

    def _combine(self, lo, hi):
        return torch.minimum(self.min_val, lo), torch.maximum(self.max_val, hi)


class MovingAverageMinMaxObserver(_Observer):
    """An exponential moving average of each batch's min and max: the first batch's range, then
    ``min = min + averaging_constant * (min_batch - min)`` (and max alike), torch.ao's
    MovingAverage(PerChannel)MinMaxObserver formula, in the same fp32 operation order."""

    def __init__(self, averaging_constant: float = 0.01, **kwargs) -> None:
        super().__init__(**kwargs)
        if not _is_number(averaging_constant):
            raise TypeError(
                "torchspeed.quant.MovingAverageMinMaxObserver: averaging_constant must be in "
                f"(0, 1], got {averaging_constant!r}"
            )
        if not 0 < averaging_constant <= 1:
            raise ValueError(
                "torchspeed.quant.MovingAverageMinMaxObserver: averaging_constant must be in "
                f"(0, 1], got {averaging_constant!r}"
            )
        self.averaging_constant = float(averaging_constant)

    def _combine(self, lo, hi):
        c = self.averaging_constant
        return self.min_val + c * (lo - self.min_val), self.max_val + c * (hi - self.max_val)


class PercentileObserver(_Observer):
    """Clips outliers: each batch's range is its ``percentile``-th largest and (100 -
    percentile)-th smallest values per segment (exact order statistics with torch.kthvalue, no
    histogram: of n values, the ceil(n * percentile / 100)-th smallest and the mirror one from
    the top); the recorded range is the mean over the batches seen. percentile = 100 is the min
    and max (MinMaxObserver's range on one batch)."""

    def __init__(self, percentile: float = 99.99, **kwargs) -> None:
        super().__init__(**kwargs)
        if not _is_number(percentile):
            raise TypeError(
                "torchspeed.quant.PercentileObserver: percentile must be in (50, 100], got "
                f"{percentile!r}"
            )
        if not 50 < percentile <= 100:
            raise ValueError(
                "torchspeed.quant.PercentileObserver: percentile must be in (50, 100], got "
                f"{percentile!r}"
            )
        self.percentile = float(percentile)
        self.register_buffer("num_batches", torch.zeros((), dtype=torch.int64))

    def _ranges(self, v):
        n = v.shape[-1]
        k_hi = min(n, max(1, math.ceil(n * self.percentile / 100.0)))
        hi = v.kthvalue(k_hi, dim=-1).values
        lo = v.kthvalue(n + 1 - k_hi, dim=-1).values
        return lo, hi

    def _finite(self, v, lo, hi):
        # the order statistics may leave a NaN / inf outlier out: check every value
        return torch.isfinite(v).all()

    def forward(self, x):
        out = super().forward(x)
        # a new tensor, not in place: FakeQuantize restores the observer's buffers on an error
        self.num_batches = self.num_batches + 1
        return out

    def _combine(self, lo, hi):
        n = float(self.num_batches.item())  # batches recorded before this one
        return (
            self.min_val + (lo - self.min_val) / (n + 1),
            self.max_val + (hi - self.max_val) / (n + 1),
        )

    def reset_min_max_vals(self) -> None:
        super().reset_min_max_vals()
        self.num_batches.zero_()


__all__ = ["MinMaxObserver", "MovingAverageMinMaxObserver", "PercentileObserver"]
