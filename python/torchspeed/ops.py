"""Every area's typed op wrappers in one namespace (torch.ops.torchspeed.* with docstrings).

Each area keeps its wrappers in ``torchspeed/<area>/_ops.py``; this module indexes them. An op of
an area this build left out raises the one "area not built" error when called.
"""

from .dist._ops import scale_cast_
from .optim._ops import GradStats, grad_stats
from .prune._ops import apply_mask_, magnitude_mask, nm_mask, pack_mask, unpack_mask
from .quant._ops import (
    dequantize_int8,
    fake_quantize,
    int8_linear,
    int8_pack_weight,
    quantize_int8,
)

__all__ = [
    "GradStats",
    "grad_stats",
    "scale_cast_",
    "pack_mask",
    "unpack_mask",
    "apply_mask_",
    "nm_mask",
    "magnitude_mask",
    "quantize_int8",
    "dequantize_int8",
    "fake_quantize",
    "int8_pack_weight",
    "int8_linear",
]
