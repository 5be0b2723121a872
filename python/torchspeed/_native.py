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


class AreaNotBuiltError(ImportError):
    """A torchspeed area (``dist``, ``quant``, ``prune``, ``data``, ...) that this build left out
    was used. The message names the CMake option that builds it."""


def area_not_built(what: str, area: str) -> AreaNotBuiltError:
    """The one "area not built" error: ``what`` is the public name the user called."""
    option = f"TORCHSPEED_WITH_{area.upper()}"
    return AreaNotBuiltError(
        f"{what}: torchspeed was built without the {area} area ({option}=OFF); rebuild with "
        f"{option}=ON (pip: {option}=ON pip install --no-build-isolation .)"
    )


def native_module(area: str, what: str = ""):
    """``torchspeed._C.<area>``: the area's pybind11 classes, or the one "area not built" error."""
    from . import _C  # the loaded native module (this file is what loads it, see load_native)

    module = getattr(_C, area, None)
    if module is None:
        raise area_not_built(what or f"torchspeed.{area}", area)
    return module


def native_op(name: str, area: str, what: str = ""):
    """``torch.ops.torchspeed.<name>``, or the one "area not built" error naming the CMake option
    of the ``area`` that registers it. ``what`` is the public name (default
    ``torchspeed.<name>``)."""
    op = getattr(torch.ops.torchspeed, name, None)
    if op is None:
        raise area_not_built(what or f"torchspeed.{name}", area)
    return op
