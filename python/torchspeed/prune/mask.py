"""The mask buffer beside a weight: its name (``<name>_mask_packed``, uint8, 1 bit per element),
reading it (``get_mask``, ``is_pruned``), applying it to the weight in place, and the weights a
model offers for pruning (``prunable_parameters``, ``sparsity``). Masks are in the tensor's logical
(row-major) order; a contiguous weight's memory order is the same.
"""

from __future__ import annotations

import collections.abc
from typing import Dict, List, Optional, Tuple

import torch
from torch import nn

from ._ops import apply_mask_, unpack_mask

__all__ = ["MASK_SUFFIX", "PRUNABLE", "get_mask", "is_pruned", "prunable_parameters", "sparsity"]

MASK_SUFFIX = "_mask_packed"

PRUNABLE = (nn.Linear, nn.Conv1d, nn.Conv2d, nn.Conv3d)


def _module(module, where: str, label: str = "module") -> nn.Module:
    if not isinstance(module, nn.Module):
        raise TypeError(
            f"torchspeed.prune.{where}: {label} must be an nn.Module, got {type(module).__name__}"
        )
    return module


def _check_types(types, where: str) -> None:
    """``types``: a module class or a tuple of them (what isinstance takes)."""
    items = types if isinstance(types, tuple) else (types,)
    if not items or not all(isinstance(t, type) for t in items):
        raise TypeError(
            f"torchspeed.prune.{where}: types must be a module class or a tuple of them, got "
            f"{types!r}"
        )


def _param(module: nn.Module, name: str) -> torch.Tensor:
    if not isinstance(module, nn.Module):
        raise TypeError(
            f"torchspeed.prune: module must be an nn.Module, got {type(module).__name__}"
        )
    if not isinstance(name, str):
        raise TypeError(f"torchspeed.prune: name must be a str, got {name!r}")
    p = getattr(module, name, None)
    if not isinstance(p, torch.Tensor):
        raise ValueError(
            f"torchspeed.prune: {type(module).__name__} has no tensor parameter {name!r}"
        )
    if not p.is_floating_point():
        raise TypeError(f"torchspeed.prune: {name} must be a floating tensor, got {p.dtype}")
    return p


def get_mask(module: nn.Module, name: str = "weight") -> Optional[torch.Tensor]:
    """The bool mask of ``module.<name>`` (its shape; True = kept), or None when not pruned."""
    _module(module, "get_mask")
    if not isinstance(name, str):
        raise TypeError(f"torchspeed.prune.get_mask: name must be a str, got {name!r}")
    packed = module._buffers.get(name + MASK_SUFFIX)
    if packed is None:
        return None
    return unpack_mask(packed, _param(module, name).shape)


def _logical(w: torch.Tensor) -> torch.Tensor:
    """w in logical order (the ops read memory order; contiguous makes them the same)."""
    return w.detach().contiguous()


def _apply(param: torch.Tensor, packed: torch.Tensor) -> None:
    with torch.no_grad():
        if param.is_contiguous():
            apply_mask_(param.data, packed)
        else:
            param.data.masked_fill_(~unpack_mask(packed, param.shape), 0)


def prunable_parameters(model: nn.Module, types=PRUNABLE) -> List[Tuple[nn.Module, str]]:
    """(module, "weight") for every Linear/Conv (or ``types``) in ``model``."""
    _module(model, "prunable_parameters", "model")
    _check_types(types, "prunable_parameters")
    return [
        (mod, "weight")
        for mod in model.modules()
        if isinstance(mod, types) and isinstance(getattr(mod, "weight", None), torch.Tensor)
    ]


def is_pruned(module: nn.Module) -> bool:
    """True when ``module`` or a submodule holds a torchspeed.prune mask."""
    _module(module, "is_pruned")
    return any(b.endswith(MASK_SUFFIX) for mod in module.modules() for b in mod._buffers)


def sparsity(module: nn.Module, types=PRUNABLE) -> Dict[str, float]:
    """Fraction of zeros of every Linear/Conv weight (by qualified name) and ``"total"``."""
    _module(module, "sparsity")
    _check_types(types, "sparsity")
    out: Dict[str, float] = {}
    zeros = total = 0
    for qual, mod in module.named_modules():
        if not isinstance(mod, types):
            continue
        w = mod.weight.detach()
        z = int((w == 0).sum())
        out[f"{qual}.weight" if qual else "weight"] = z / max(w.numel(), 1)
        zeros += z
        total += w.numel()
    out["total"] = zeros / max(total, 1)
    return out


def _targets(model_or_params, where: str) -> List[Tuple[nn.Module, str]]:
    """A model's prunable (module, "weight") pairs, or the (module, name) pairs given."""
    if isinstance(model_or_params, nn.Module):
        return prunable_parameters(model_or_params)
    return _pairs(model_or_params, where)


def _pairs(parameters, where: str) -> List[Tuple[nn.Module, str]]:
    """``parameters`` as a list of (module, name) pairs, each checked (TypeError otherwise)."""
    if isinstance(parameters, (str, bytes, torch.Tensor)) or not isinstance(
        parameters, collections.abc.Iterable
    ):
        raise TypeError(
            f"torchspeed.prune.{where}: parameters must be an iterable of (module, name) pairs, "
            f"got {type(parameters).__name__}"
        )
    pairs = list(parameters)
    for i, pair in enumerate(pairs):
        if (
            not isinstance(pair, (tuple, list))
            or len(pair) != 2
            or not isinstance(pair[0], nn.Module)
            or not isinstance(pair[1], str)
        ):
            raise TypeError(
                f"torchspeed.prune.{where}: parameters[{i}] must be a (module, name) pair, got "
                f"{pair!r}"[:300]
            )
    return [(m, n) for m, n in pairs]
