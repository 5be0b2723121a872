"""Masks registered with optimizers: a torchspeed fused optimizer gets each weight's packed mask
(``set_mask``: applied inside its update pass); a torch.optim optimizer gets a step post-hook that
re-applies the masks after each step. The registry keeps, per optimizer and per weight, every
(module, name) whose mask prunes it, so tied weights and ``remove`` without ``optimizer=`` stay
consistent.
"""

from __future__ import annotations

import weakref
from typing import Dict, Iterable, Optional

import torch
from torch import nn

from .mask import MASK_SUFFIX, _apply


def _check_optimizer(optimizer, params: Iterable[torch.Tensor]) -> None:
    """Raise (before anything is changed) unless ``optimizer`` can take masks for ``params``."""
    if optimizer is None:
        return
    if hasattr(optimizer, "set_mask"):  # torchspeed's fused optimizers
        held = {id(p) for g in optimizer.param_groups for p in g["params"]}
        for p in params:
            if id(p) not in held:
                raise ValueError(
                    "torchspeed.prune: optimizer does not hold the parameter being pruned "
                    f"(shape {tuple(p.shape)}); pass the optimizer that trains it"
                )
        return
    if not isinstance(optimizer, torch.optim.Optimizer):
        raise TypeError(
            f"torchspeed.prune: optimizer must be a torch.optim.Optimizer, got {type(optimizer)}"
        )


# Every optimizer a mask was registered with (weakly: one that is gone needs nothing), so that
# remove() unregisters a mask even when it is called without optimizer=.

_REGISTERED_WITH: weakref.WeakSet = weakref.WeakSet()

_REGISTRY_ATTR = "_torchspeed_prune_registry"


class _Registry:
    """The masks torchspeed.prune registered with one optimizer. Keyed by identity (a tensor's
    ``==`` compares elements, so neither a dict of weak tensor keys nor equality can key it): per
    param, its holders, every (module, name) whose mask buffer prunes it. Tied weights have one
    holder per module; the optimizer applies the AND of their masks (pruned by one holder stays
    pruned), and removing one holder leaves the others' in force."""

    def __init__(self) -> None:
        # id(param) -> [weakref(param), {(id(module), name): weakref(module)}, applied mask]
        self.entries: Dict[int, list] = {}

    def entry(self, param: torch.Tensor) -> Optional[list]:
        e = self.entries.get(id(param))
        if e is not None and e[0]() is not param:  # a freed param's id, reused
            del self.entries[id(param)]
            e = None
        return e

    def combined(self, e: list, param: torch.Tensor) -> Optional[torch.Tensor]:
        """The AND of the live holders' mask buffers (the buffer itself for one holder, so a torch
        optimizer's post-hook reads the live buffer), or None when no holder is left."""
        masks = []
        for key, mod_ref in list(e[1].items()):
            mod = mod_ref()
            buf = None if mod is None else mod._buffers.get(key[1] + MASK_SUFFIX)
            if buf is None:
                del e[1][key]
            else:
                masks.append(buf)
        if not masks:
            return None
        out = masks[0]
        for m in masks[1:]:
            out = torch.bitwise_and(out, m.to(out.device))
        return out


def _registry(optimizer, create: bool) -> Optional[_Registry]:
    reg = optimizer.__dict__.get(_REGISTRY_ATTR)
    if reg is None and create:
        reg = optimizer.__dict__[_REGISTRY_ATTR] = _Registry()
        _REGISTERED_WITH.add(optimizer)
        if not hasattr(optimizer, "set_mask"):
            # torch.optim: a step post-hook re-applies the masks after each step (a separate
            # pass); the fused optimizers apply them inside their update pass instead.
            def reapply(opt, args, kwargs):
                with torch.no_grad():
                    for e in list(reg.entries.values()):
                        p = e[0]()
                        if p is not None and e[2] is not None:
                            _apply(p, e[2])

            optimizer.register_step_post_hook(reapply)
    return reg


def _holds(optimizer, param: torch.Tensor) -> bool:
    return any(p is param for g in optimizer.param_groups for p in g["params"])


def _push(optimizer, reg: _Registry, e: list, param: torch.Tensor) -> None:
    """Hands the optimizer the param's combined mask (None: no holder left, unregistered)."""
    mask = reg.combined(e, param)
    e[2] = mask
    if mask is None:
        del reg.entries[id(param)]
    if hasattr(optimizer, "set_mask"):  # torchspeed's fused optimizers: inside the update pass
        if mask is not None or _holds(optimizer, param):
            optimizer.set_mask(param, mask)


def _register_with(optimizer, module: nn.Module, name: str, param: torch.Tensor) -> None:
    """Registers the mask buffer of ``module.<name>`` (already stored) with ``optimizer``, and
    hands the new mask to every other optimizer it was registered with before (pruning further
    without ``optimizer=`` must not leave an optimizer with the older, denser mask)."""
    key = (id(module), name)
    for opt in list(_REGISTERED_WITH):
        if opt is optimizer:
            continue
        reg = _registry(opt, create=False)
        e = None if reg is None else reg.entry(param)
        if e is not None and key in e[1]:
            _push(opt, reg, e, param)
    if optimizer is None:
        return
    reg = _registry(optimizer, create=True)
    e = reg.entry(param)
    if e is None:
        e = reg.entries[id(param)] = [weakref.ref(param), {}, None]
    e[1][key] = weakref.ref(module)
    _push(optimizer, reg, e, param)


def _unregister(module: nn.Module, name: str, param: torch.Tensor, optimizer=None) -> None:
    """Drops the holder ``module.<name>`` from every optimizer its mask was registered with (and
    from ``optimizer``): each optimizer keeps the masks of the param's other holders (tied
    weights) and forgets the param when none is left. ``optimizer`` given, with no holder
    registered by torchspeed.prune, drops the param's mask as ``optimizer.set_mask(p, None)``."""
    optimizers = list(_REGISTERED_WITH)
    if optimizer is not None and not any(o is optimizer for o in optimizers):
        optimizers.append(optimizer)
    for opt in optimizers:
        reg = _registry(opt, create=False)
        e = None if reg is None else reg.entry(param)
        if e is None:
            if opt is optimizer and hasattr(opt, "set_mask"):
                opt.set_mask(param, None)
            continue
        e[1].pop((id(module), name), None)
        _push(opt, reg, e, param)
