"""Min-max quantization parameters for int8: ``choose_qparams`` (from a tensor) and
``qparams_from_minmax`` (from a recorded range, the one formula the observers share).

    scale, zp = torchspeed.quant.choose_qparams(w, granularity="per_channel")   # symmetric
    q = torchspeed.quant.quantize_int8(w, scale, zp)        # int8, CPU SIMD or CUDA
    w_hat = torchspeed.quant.dequantize_int8(q, scale, zp)  # float32, |w_hat - w| <= scale / 2

The granularity is scale's shape, for x viewed as [rows, cols] (cols = its last dim): one element
(per tensor), [rows] (per channel, e.g. a Linear weight's output channels) or [rows, groups] (per
group of cols / groups consecutive elements).
"""

from __future__ import annotations

import math
from typing import Tuple

import torch

_GRANULARITIES = ("per_tensor", "per_channel", "per_group")


def choose_qparams(
    x: torch.Tensor,
    granularity: str = "per_tensor",
    group_size: int = 128,
    symmetric: bool = True,
    eps: float = 1e-12,
) -> Tuple[torch.Tensor, torch.Tensor]:
    """Min-max quantization parameters (scale float32, zero_point int32) for quantize_int8.

    symmetric: ``scale = max|x| / 127``, zero_point 0 (the range maps onto [-127, 127]).
    asymmetric: ``[min, max]`` (always including 0) maps onto [-128, 127] with a zero point.
    ``per_group`` splits each row of x (viewed as [rows, cols]) into groups of ``group_size``.
    A NaN or inf in x raises ValueError (on CUDA that check synchronises once, on the reduced
    ranges)."""
    if not isinstance(x, torch.Tensor):
        raise TypeError(
            f"torchspeed.quant.choose_qparams: x must be a tensor, got {type(x).__name__}"
        )
    _check_symmetric_eps(symmetric, eps, "choose_qparams")
    if granularity not in _GRANULARITIES:
        raise ValueError(
            f"torchspeed.quant.choose_qparams: granularity must be one of {_GRANULARITIES}, "
            f"got {granularity!r}"
        )
    if not x.is_floating_point():
        raise ValueError(
            f"torchspeed.quant.choose_qparams: x must be floating point, got {x.dtype}"
        )
    if x.dim() < 1 or x.numel() == 0:
        raise ValueError("torchspeed.quant.choose_qparams: x must be a non-empty tensor")
    cols = x.shape[-1]
    v = x.detach().reshape(-1, cols).float()
    if granularity == "per_tensor":
        v = v.reshape(1, -1)
    elif granularity == "per_group":
        if isinstance(group_size, bool) or not isinstance(group_size, int):
            raise TypeError(
                f"torchspeed.quant.choose_qparams: group_size must be a positive int dividing the "
                f"last dim ({cols}), got {group_size!r}"
            )
        if group_size < 1 or cols % group_size:
            raise ValueError(
                f"torchspeed.quant.choose_qparams: group_size must be a positive int dividing the "
                f"last dim ({cols}), got {group_size!r}"
            )
        v = v.reshape(v.shape[0], cols // group_size, group_size)
    lo, hi = v.amin(dim=-1), v.amax(dim=-1)  # NaN and inf propagate into the ranges
    if not _all_finite(lo, hi):
        raise ValueError("torchspeed.quant.choose_qparams: x must be finite (has NaN or inf)")
    scale, zp = qparams_from_minmax(lo, hi, symmetric, eps)
    if granularity == "per_tensor":
        scale, zp = scale.reshape(1), zp.reshape(1)
    return scale.contiguous(), zp.contiguous()


def _check_symmetric_eps(symmetric, eps, where: str) -> None:
    if not isinstance(symmetric, bool):
        raise TypeError(f"torchspeed.quant.{where}: symmetric must be a bool, got {symmetric!r}")
    if isinstance(eps, bool) or not isinstance(eps, (int, float)):
        raise TypeError(f"torchspeed.quant.{where}: eps must be finite and > 0, got {eps!r}")
    if not (eps > 0 and math.isfinite(eps)):
        raise ValueError(f"torchspeed.quant.{where}: eps must be finite and > 0, got {eps!r}")


def _all_finite(*ts: torch.Tensor) -> bool:
    """True when every element of ts is finite: one host synchronisation on CUDA."""
    ok = torch.isfinite(ts[0]).all()
    for t in ts[1:]:
        ok = ok & torch.isfinite(t).all()
    return bool(ok)


def qparams_from_minmax(
    min_val: torch.Tensor, max_val: torch.Tensor, symmetric: bool = True, eps: float = 1e-12
) -> Tuple[torch.Tensor, torch.Tensor]:
    """choose_qparams' formula from a recorded range (float32 tensors of one shape), the one
    formula the observers (torchspeed.quant.observer) share: the range always includes 0, then
    symmetric ``scale = max(-min, max) / 127`` (zero_point 0), or asymmetric ``scale = (max - min)
    / 255``, ``zero_point = clamp(-128 - round(min / scale), -128, 127)``; scale >= eps. Equal to
    torch.ao's observers' ``_calculate_qparams`` for qint8 with quant range [-127, 127]
    (symmetric) or [-128, 127] (affine). A NaN or inf in min_val / max_val raises ValueError;
    a finite range wider than float32's max (``max - min`` overflows) gets the finite scale
    ``max / 255 - min / 255``."""
    _check_symmetric_eps(symmetric, eps, "qparams_from_minmax")
    for name, t in (("min_val", min_val), ("max_val", max_val)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(
                f"torchspeed.quant.qparams_from_minmax: {name} must be a tensor, "
                f"got {type(t).__name__}"
            )
    if min_val.shape != max_val.shape:
        raise ValueError(
            "torchspeed.quant.qparams_from_minmax: min_val and max_val must have one shape, got "
            f"{tuple(min_val.shape)} and {tuple(max_val.shape)}"
        )
    for name, t in (("min_val", min_val), ("max_val", max_val)):
        if not _all_finite(t):
            raise ValueError(
                f"torchspeed.quant.qparams_from_minmax: {name} must be finite (has NaN or inf)"
            )
    lo = torch.minimum(min_val.float(), torch.zeros((), device=min_val.device))
    hi = torch.maximum(max_val.float(), torch.zeros((), device=max_val.device))
    if symmetric:
        scale = (torch.maximum(-lo, hi) / 127.0).clamp_min(eps)
        zp = torch.zeros_like(scale, dtype=torch.int32)
    else:
        scale = (hi - lo) / 255.0
        # hi - lo overflows past float32's max for |range| > 3.4e38: the same value, finite
        scale = torch.where(torch.isfinite(scale), scale, hi / 255.0 - lo / 255.0).clamp_min(eps)
        zp = (-128 - torch.round(lo / scale)).clamp(-128, 127).to(torch.int32)
    return scale, zp


__all__ = ["choose_qparams", "qparams_from_minmax"]
