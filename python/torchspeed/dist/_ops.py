"""Typed wrappers of the dist area's ops (csrc/ops/dist.cpp): the reducer's bucket pass."""

import torch

from .._native import native_op


def scale_cast_(out: torch.Tensor, src: torch.Tensor, scale: float = 1.0) -> torch.Tensor:
    """``out = src * scale``, rounded once into ``out``'s dtype; returns ``out``.

    The gradient reducer's one pass over a bucket (torchspeed.dist): the division by the world
    size fused with the bf16/fp16 compression cast, and the widening back after the all-reduce.
    Both tensors contiguous with the same number of elements on one device; dtypes float32,
    bfloat16 and float16 in any combination, or float64 into float64. ``out`` may be ``src``
    itself (in place). CPU (SIMD, every ISA) and CUDA (no host synchronisation).
    """
    native_op("scale_cast_", "dist")(out, src, float(scale))
    return out


__all__ = ["scale_cast_"]
