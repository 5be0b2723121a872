"""``load_state_dict``: a pruned model's state_dict into a fresh (unpruned) model. The mask
buffers the state_dict holds are created first; every mask entry, the keys and the shapes are
checked before anything changes.
"""

from __future__ import annotations

import collections.abc
from typing import Any, Dict, Mapping, Set, Tuple

import torch
from torch import nn

from .mask import MASK_SUFFIX, _apply, _param
from .optimizer_masks import _check_optimizer, _register_with

__all__ = ["load_state_dict"]


def load_state_dict(
    model: nn.Module, state_dict: Dict[str, torch.Tensor], strict: bool = True, optimizer=None
):
    """``model.load_state_dict`` that first creates the mask buffers the state_dict holds, so a
    pruned model's state_dict loads into a fresh (unpruned) model; the masks are re-applied.

    ``optimizer``: registers every mask of the model with it (as the verbs' ``optimizer=`` does),
    so training a resumed model keeps the pruned weights at zero. Every mask entry (its module,
    weight, dtype uint8 and ceil(numel / 8) bytes) and the optimizer are checked before the model
    changes; an error while loading removes the mask buffers this call created. So are the keys
    (``strict``) and the shapes of the model's own tensors, which torch's ``load_state_dict``
    checks only after it has copied the others: a dense state_dict loaded into a pruned model
    (no mask entries) raises before any weight changes with strict=True, and with strict=False
    loads the weights and keeps the model's masks, applied to them."""
    if not isinstance(model, nn.Module):
        raise TypeError(
            "torchspeed.prune.load_state_dict: model must be an nn.Module, got "
            f"{type(model).__name__}"
        )
    if not isinstance(state_dict, collections.abc.Mapping):
        raise TypeError(
            "torchspeed.prune.load_state_dict: state_dict must be a mapping, got "
            f"{type(state_dict).__name__}"
        )
    if not isinstance(strict, bool):
        raise TypeError(f"torchspeed.prune.load_state_dict: strict must be a bool, got {strict!r}")
    for key in state_dict:
        if not isinstance(key, str):
            raise TypeError(
                f"torchspeed.prune.load_state_dict: state_dict keys must be str, got {key!r}"
            )
    found = []
    for key, value in state_dict.items():
        if not key.endswith(MASK_SUFFIX):
            continue
        path, _, buf = key.rpartition(".")
        try:
            mod = model.get_submodule(path) if path else model
        except AttributeError:
            raise ValueError(
                f"torchspeed.prune.load_state_dict: state_dict[{key!r}]: the model has no "
                f"submodule {path!r}"
            ) from None
        weight = _param(mod, buf[: -len(MASK_SUFFIX)])
        nbytes = (weight.numel() + 7) // 8
        if not isinstance(value, torch.Tensor) or value.dtype != torch.uint8:
            got = value.dtype if isinstance(value, torch.Tensor) else type(value).__name__
            raise ValueError(
                f"torchspeed.prune.load_state_dict: state_dict[{key!r}] must be a uint8 packed "
                f"mask, got {got}"
            )
        if value.numel() != nbytes:
            raise ValueError(
                f"torchspeed.prune.load_state_dict: state_dict[{key!r}] must have "
                f"ceil({weight.numel()} / 8) = {nbytes} bytes, got {value.numel()}"
            )
        found.append((mod, buf, value, weight))
    masked = [w for mod, buf, _, w in found]
    masked += [
        _param(mod, b[: -len(MASK_SUFFIX)])
        for mod in model.modules()
        for b in mod._buffers
        if b.endswith(MASK_SUFFIX)
    ]
    _check_optimizer(optimizer, masked)
    _check_loadable(
        model, state_dict, strict, {f"{k}" for k in state_dict if k.endswith(MASK_SUFFIX)}
    )
    created = []
    for mod, buf, value, weight in found:
        if buf not in mod._buffers:  # on the weight's device, as pruning would have put it
            mod.register_buffer(buf, torch.empty_like(value, device=weight.device))
            created.append((mod, buf))
    try:
        result = model.load_state_dict(state_dict, strict=strict)
    except Exception:
        for mod, buf in created:
            del mod._buffers[buf]
        raise
    for mod in model.modules():
        for buf in list(mod._buffers):
            if buf.endswith(MASK_SUFFIX):
                param = _param(mod, buf[: -len(MASK_SUFFIX)])
                _apply(param, mod._buffers[buf])
                _register_with(optimizer, mod, buf[: -len(MASK_SUFFIX)], param)
    return result


def _check_loadable(
    model: nn.Module, state_dict: Mapping[str, Any], strict: bool, mask_keys: Set[str]
) -> None:
    """What ``model.load_state_dict(state_dict, strict)`` would refuse after copying part of it,
    refused before: missing / unexpected keys (strict) and a value that is not a tensor or whose
    shape differs from the model's (for modules that load with nn.Module's own rule). The mask
    entries (``mask_keys``) become buffers of the model first, so they count as its keys."""
    own: Dict[str, Tuple[nn.Module, torch.Tensor]] = {}
    expected = set(model.state_dict().keys()) | mask_keys
    for prefix, mod in model.named_modules():
        if type(mod)._load_from_state_dict is not nn.Module._load_from_state_dict:
            continue  # a module with its own loading rule (e.g. shapes taken from the file)
        dot = prefix + "." if prefix else ""
        tensors = list(mod._parameters.items()) + [
            (n, b) for n, b in mod._buffers.items() if n not in mod._non_persistent_buffers_set
        ]
        for n, t in tensors:
            if t is not None:
                own[dot + n] = (mod, t)
    errors = []
    if strict:
        missing = sorted(expected - set(state_dict))
        unexpected = sorted(set(state_dict) - expected)
        if unexpected:
            errors.append(
                "Unexpected key(s) in state_dict: " + ", ".join(f'"{k}"' for k in unexpected)
            )
        if missing:
            errors.append("Missing key(s) in state_dict: " + ", ".join(f'"{k}"' for k in missing))
    for key, value in state_dict.items():
        if key not in own:
            continue
        t = own[key][1]
        if not isinstance(value, torch.Tensor):
            errors.append(
                f'While copying the parameter named "{key}", expected torch.Tensor, got '
                f"{type(value).__name__}"
            )
        elif isinstance(t, nn.parameter.UninitializedTensorMixin):
            continue
        elif value.shape != t.shape and not (t.dim() == 0 and value.shape == (1,)):
            errors.append(
                f"size mismatch for {key}: copying a param with shape {value.shape} from "
                f"checkpoint, the shape in current model is {t.shape}"
            )
    if errors:
        raise RuntimeError(
            "torchspeed.prune.load_state_dict: Error(s) in loading state_dict for "
            f"{type(model).__name__} (nothing was loaded):\n\t" + "\n\t".join(errors)
        )
