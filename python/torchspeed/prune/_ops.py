"""Typed wrappers of the prune area's ops (csrc/ops/prune.cpp): bit-packed masks on CPU and CUDA.

A packed mask is uint8 ``[ceil(numel / 8)]``: bit j (least significant first) of byte b is
element ``8 * b + j`` of the tensor (memory order; the logical order of a contiguous tensor), 1
keeps it, 0 prunes it: ``numpy.packbits(keep.ravel(), bitorder="little")``.
"""

from __future__ import annotations

import numbers
from typing import List, Sequence

import torch

from .._native import native_op


def _op(name: str):
    return native_op(name, "prune", what=f"torchspeed.prune.{name}")


def _int(v, op: str, label: str) -> int:
    """``v`` as an int; TypeError for a float, a bool or anything else (no silent truncation),
    ValueError outside int64 (what the op's schema takes)."""
    if isinstance(v, bool) or not isinstance(v, numbers.Integral):
        raise TypeError(f"torchspeed.prune.{op}: {label} must be an int, got {v!r}")
    if not -(2**63) <= v < 2**63:
        raise ValueError(f"torchspeed.prune.{op}: {label} must fit in int64, got {v}")
    return int(v)


def _tensor(v, op: str, label: str) -> None:
    if not isinstance(v, torch.Tensor):
        raise TypeError(f"torchspeed.prune.{op}: {label} must be a tensor, got {type(v).__name__}")


def _shape(shape, op: str) -> List[int]:
    if isinstance(shape, torch.Size):
        return list(shape)
    if isinstance(shape, (str, bytes)) or not isinstance(shape, Sequence):
        raise TypeError(f"torchspeed.prune.{op}: shape must be a sequence of ints, got {shape!r}")
    return [_int(s, op, f"shape[{i}]") for i, s in enumerate(shape)]


def pack_mask(mask: torch.Tensor) -> torch.Tensor:
    """A bool mask (dense; packed in memory order) as uint8 ``[ceil(numel / 8)]``."""
    _tensor(mask, "pack_mask", "mask")
    return _op("pack_mask")(mask)


def unpack_mask(packed: torch.Tensor, shape: Sequence[int]) -> torch.Tensor:
    """The bool mask of ``shape`` (contiguous) that ``packed`` holds."""
    _tensor(packed, "unpack_mask", "packed")
    return _op("unpack_mask")(packed, _shape(shape, "unpack_mask"))


def apply_mask_(w: torch.Tensor, packed: torch.Tensor) -> torch.Tensor:
    """In place: ``w = 0`` (+0.0) where the mask bit is 0; kept elements are not rewritten.

    w: float32/float64/bfloat16/float16, dense (the mask is read in w's memory order). Returns w.
    """
    _tensor(w, "apply_mask_", "w")
    _tensor(packed, "apply_mask_", "packed")
    _op("apply_mask_")(w, packed)
    return w


def nm_mask(w: torch.Tensor, n: int = 2, m: int = 4) -> torch.Tensor:
    """Packed N:M mask: the n largest ``|w|`` of every m consecutive elements of the last dim.

    w contiguous, last dim a multiple of m, ``1 <= m <= 256``, ``0 <= n <= m``. Magnitudes compare
    exactly (NaN above inf, -0 == +0); equal magnitudes keep the lower index."""
    _tensor(w, "nm_mask", "w")
    return _op("nm_mask")(w, _int(n, "nm_mask", "n"), _int(m, "nm_mask", "m"))


def magnitude_mask(w: torch.Tensor, amount: int) -> torch.Tensor:
    """Packed mask pruning exactly ``amount`` elements: the smallest ``|w|``; at the threshold,
    equal magnitudes prune the higher (memory) index first. Deterministic; CUDA never syncs."""
    _tensor(w, "magnitude_mask", "w")
    return _op("magnitude_mask")(w, _int(amount, "magnitude_mask", "amount"))
