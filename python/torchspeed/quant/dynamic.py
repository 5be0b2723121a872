"""``quantize_dynamic``: swaps a model's ``nn.Linear`` modules for ``Int8Linear`` (int8
weights, activations quantized per row at run time), like torch.ao's dynamic quantization.

    qmodel = torchspeed.quant.quantize_dynamic(model)          # a converted copy
    with torch.no_grad():
        y = qmodel(x)
"""

from __future__ import annotations

import copy
from typing import Iterable, Optional

import torch
from torch import nn

from .linear import Int8Linear

__all__ = ["quantize_dynamic"]


def _matches(name: str, names) -> bool:
    return any(name == n or name.startswith(n + ".") for n in names)


def quantize_dynamic(
    model: nn.Module,
    qconfig_spec: Optional[Iterable] = None,
    dtype: torch.dtype = torch.qint8,
    inplace: bool = False,
    modules_to_not_convert: Optional[Iterable[str]] = None,
) -> nn.Module:
    """Swaps ``nn.Linear`` modules (nested ones too) for ``Int8Linear``, like
    ``torch.ao.quantization.quantize_dynamic(model, {nn.Linear}, dtype=torch.qint8)``.

    qconfig_spec: None (every nn.Linear), or a set of module types (only ``nn.Linear`` is
    supported) and/or qualified module names (convert only those, and the Linears inside them).
    modules_to_not_convert: qualified names whose modules (and their children) stay float.
    Subclasses of nn.Linear (e.g. MultiheadAttention's out_proj) are left alone. inplace=False
    converts a deep copy."""
    if not isinstance(model, nn.Module):
        raise TypeError(
            "torchspeed.quant.quantize_dynamic: model must be an nn.Module, got "
            f"{type(model).__name__}"
        )
    if not isinstance(inplace, bool):
        raise TypeError(
            f"torchspeed.quant.quantize_dynamic: inplace must be a bool, got {inplace!r}"
        )
    if dtype not in (torch.qint8, torch.int8):
        raise ValueError(
            f"torchspeed.quant.quantize_dynamic: only dtype=torch.qint8 is supported, got {dtype}"
        )
    names = None
    if isinstance(qconfig_spec, str):
        qconfig_spec = [qconfig_spec]
    if isinstance(modules_to_not_convert, str):
        modules_to_not_convert = [modules_to_not_convert]
    if isinstance(modules_to_not_convert, Iterable):
        modules_to_not_convert = list(modules_to_not_convert)
    if modules_to_not_convert is not None and (
        not isinstance(modules_to_not_convert, list)
        or not all(isinstance(n, str) for n in modules_to_not_convert)
    ):
        raise TypeError(
            "torchspeed.quant.quantize_dynamic: modules_to_not_convert must be qualified module "
            f"names (str), got {modules_to_not_convert!r}"
        )
    if qconfig_spec is not None:
        spec = list(qconfig_spec)
        for s in spec:
            if isinstance(s, type) and s is not nn.Linear:
                raise ValueError(
                    f"torchspeed.quant.quantize_dynamic: only nn.Linear can be converted, got "
                    f"{s.__name__}"
                )
            if not isinstance(s, (type, str)):
                raise TypeError(
                    "torchspeed.quant.quantize_dynamic: qconfig_spec must hold module types or "
                    f"qualified names, got {s!r}"
                )
        str_names = [s for s in spec if isinstance(s, str)]
        names = str_names if str_names else None
        if not str_names and nn.Linear not in spec:
            return model if inplace else copy.deepcopy(model)
    skip = list(modules_to_not_convert or [])
    if not inplace:
        model = copy.deepcopy(model)
    if type(model) is nn.Linear:
        raise ValueError(
            "torchspeed.quant.quantize_dynamic: model is itself an nn.Linear; use "
            "Int8Linear.from_float(model)"
        )
    targets = []
    # Every place a module is registered (a Linear shared by two parents is converted in both,
    # to one shared Int8Linear, as torch.ao does).
    for name, module in model.named_modules(remove_duplicate=False):
        if type(module) is not nn.Linear or not name or _matches(name, skip):
            continue
        if names is not None and not _matches(name, names):
            continue
        targets.append(name)
    converted = {}
    for name in targets:
        parent_name, _, child = name.rpartition(".")
        parent = model.get_submodule(parent_name) if parent_name else model
        linear = getattr(parent, child)
        if id(linear) not in converted:
            converted[id(linear)] = Int8Linear.from_float(linear)
        setattr(parent, child, converted[id(linear)])
    return model
