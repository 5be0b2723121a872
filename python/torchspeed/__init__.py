"""torchspeed: fused AMP optimizers, a native prefetching loader, and more, for PyTorch training.

Example::

    opt = torchspeed.optim.AdamW(model.parameters(), lr=1e-3)  # drop-in for torch.optim.AdamW
    stats = torchspeed.ops.grad_stats(grads)  # norm + non-finite flag, one pass
    loader = torchspeed.data.DataLoader(dataset, batch_size=256, num_workers=8)
    model = torchspeed.dist.AccumulatingDDP(model, accumulation_steps=8)  # after init_process_group
"""

import os as _os

import torch  # noqa: F401  (must be loaded before the native library)

from ._native import load_native as _load_native

_C, build_info = _load_native()

from . import profile  # noqa: I001 (first: data and optim report their phases to it)
from . import checkpoint, data, dist, ops, optim, quant, tune
from . import prune  # noqa: I001 (pruning; its optimizer masks use torchspeed.optim)

__version__ = build_info.get("version", "0.0.0")

#: Pass to CMake (CMAKE_PREFIX_PATH) so that find_package(torchspeed) finds this installation.
cmake_prefix_path = _os.path.join(_os.path.dirname(_os.path.abspath(__file__)), "share", "cmake")


def cpu_isa() -> str:
    """The CPU instruction set torchspeed's kernels use now (honours TORCHSPEED_CPU_ISA)."""
    return _C.cpu_isa()


__all__ = [
    "checkpoint",
    "data",
    "dist",
    "ops",
    "optim",
    "profile",
    "prune",
    "quant",
    "tune",
    "cpu_isa",
    "cmake_prefix_path",
    "build_info",
    "__version__",
]
