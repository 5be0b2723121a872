"""Loads the native library with a readable error when it was built for another torch."""

import json
import os

import torch

_HERE = os.path.dirname(os.path.abspath(__file__))
BUILD_INFO_PATH = os.path.join(_HERE, "build_info.json")


def read_build_info() -> dict:
    """The JSON the build wrote next to the package: versions, CUDA, ISAs, features."""
    try:
        with open(BUILD_INFO_PATH, encoding="utf-8") as f:
            return json.load(f)
    except FileNotFoundError:
        return {}


def load_native():
    info = read_build_info()
    if not info:
        raise ImportError(
            "torchspeed's native part is not built (no build_info.json next to the package). "
            "Install with: pip install --no-build-isolation .   (or -e . for development)"
        )
    built = info.get("torch_version", "unknown")
    running = torch.__version__
    if built != running:
        raise ImportError(
            f"torchspeed was built for torch {built}, you have torch {running}. Rebuild torchspeed "
            "against this torch (pip install --no-build-isolation --force-reinstall .) or install "
            f"torch=={built.split('+')[0]}."
        )
    try:
        from . import _C  # noqa: F401  (loads libtorchspeed, which registers torch.ops.torchspeed)
    except ImportError as e:
        raise ImportError(
            f"torchspeed's native module failed to load ({e}). It was built for torch {built}; "
            f"you have {running}. Rebuild with: pip install --no-build-isolation ."
        ) from e
    return _C, info


def native_op(name: str, area: str, prefix: str = "torchspeed"):
    """``torch.ops.torchspeed.<name>``, or a clear error naming the CMake option of the ``area``
    that registers it when this build left that area out."""
    op = getattr(torch.ops.torchspeed, name, None)
    if op is None:
        raise RuntimeError(
            f"{prefix}.{name}: built without the {area} area (TORCHSPEED_WITH_{area.upper()}=OFF)"
        )
    return op
