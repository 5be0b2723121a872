"""The pruning verbs: ``l1_unstructured``, ``global_unstructured``, ``ln_structured``,
``nm_sparse``, ``apply`` (every Linear/Conv of a model) and ``remove``. Each computes every mask
first (a plan), checks it and the optimizer, then stores the masks beside the weights, zeroes the
weights and registers the masks with the optimizer: an error leaves everything as it was.
"""

from __future__ import annotations

import math
import numbers
from typing import Iterable, List, Optional, Tuple, Union

import torch
from torch import nn

from ._ops import magnitude_mask, nm_mask, pack_mask
from .mask import (
    MASK_SUFFIX,
    PRUNABLE,
    _apply,
    _logical,
    _module,
    _pairs,
    _param,
    prunable_parameters,
)
from .optimizer_masks import _check_optimizer, _register_with, _unregister

__all__ = [
    "apply",
    "global_unstructured",
    "l1_unstructured",
    "ln_structured",
    "nm_sparse",
    "remove",
]

_METHODS = ("l1_unstructured", "global_unstructured", "ln_structured", "nm")

Amount = Union[int, float]


def _count(amount: Amount, total: int, what: str = "amount") -> int:
    """torch.nn.utils.prune's rule: int = count (0..total), float in [0, 1] = round(frac * total)."""
    if isinstance(amount, bool) or not isinstance(amount, numbers.Real):
        raise TypeError(f"torchspeed.prune: {what} must be an int or a float, got {amount!r}")
    if isinstance(amount, numbers.Integral):
        if amount < 0 or amount > total:
            raise ValueError(
                f"torchspeed.prune: {what} must be in [0, {total}] as a count, got {amount}"
            )
        return int(amount)
    if not (0.0 <= float(amount) <= 1.0):
        raise ValueError(f"torchspeed.prune: {what} must be in [0, 1] as a fraction, got {amount}")
    return int(round(float(amount) * total))


Plan = List[Tuple[nn.Module, str, torch.Tensor]]


def _commit(plan: Plan, optimizer=None) -> None:
    """Store every (module, name, packed keep mask) of ``plan``: combined with an existing mask
    (pruned stays pruned), the weight zeroed, the mask registered with ``optimizer``. Everything
    is checked first, so an error leaves the model and the optimizer as they were."""
    _check_optimizer(optimizer, [_param(mod, name) for mod, name, _ in plan])
    for mod, name, _ in plan:
        key = name + MASK_SUFFIX
        if key not in mod._buffers and hasattr(mod, key):
            raise ValueError(f"torchspeed.prune: {type(mod).__name__} already has {key!r}")
    for mod, name, keep_packed in plan:
        param = _param(mod, name)
        key = name + MASK_SUFFIX
        old = mod._buffers.get(key)
        if old is not None:
            keep_packed = torch.bitwise_and(keep_packed, old.to(keep_packed.device))
            mod._buffers[key] = keep_packed
        else:
            mod.register_buffer(key, keep_packed)
        _apply(param, keep_packed)
        _register_with(optimizer, mod, name, param)


def l1_unstructured(module: nn.Module, name: str = "weight", amount: Amount = 0.5, optimizer=None):
    """Zero exactly ``amount`` elements of ``module.<name>``: the smallest |w| (ties: the higher
    index goes first). Returns the module."""
    _commit(_plan_l1(module, name, amount), optimizer)
    return module


def _plan_l1(module: nn.Module, name: str, amount: Amount) -> Plan:
    w = _param(module, name)
    k = _count(amount, w.numel())
    return [(module, name, magnitude_mask(_logical(w), k))]


def global_unstructured(
    parameters: Iterable[Tuple[nn.Module, str]], amount: Amount = 0.5, optimizer=None
) -> None:
    """Zero exactly ``amount`` of all the listed tensors' elements together: the globally smallest
    |w| (compared exactly in float64); ties at the threshold go in list order, then index."""
    _commit(_plan_global(parameters, amount), optimizer)


def _plan_global(parameters: Iterable[Tuple[nn.Module, str]], amount: Amount) -> Plan:
    params = _pairs(parameters, "global_unstructured")
    if not params:
        raise ValueError("torchspeed.prune.global_unstructured: parameters is empty")
    ws = [_param(m, n) for m, n in params]
    total = sum(w.numel() for w in ws)
    k = _count(amount, total)
    if k == 0:
        counts = [0] * len(ws)
    else:
        mags = torch.cat([w.detach().reshape(-1).abs().double().cpu() for w in ws])
        # kthvalue sorts NaN above inf; NaN counts as the largest magnitude (as magnitude_mask).
        threshold = torch.kthvalue(mags, k).values
        below, ties = [], []
        for w in ws:
            a = w.detach().abs().double()
            if bool(threshold.isnan()):
                below.append(int((~a.isnan()).sum()))
                ties.append(int(a.isnan().sum()))
            else:
                t = threshold.to(w.device)
                below.append(int((a < t).sum()))
                ties.append(int((a == t).sum()))
        left = k - sum(below)
        counts = []
        for b, t in zip(below, ties):
            take = min(t, left)
            counts.append(b + take)
            left -= take
    return [
        (module, name, magnitude_mask(_logical(w), c))
        for (module, name), w, c in zip(params, ws, counts)
    ]


def ln_structured(
    module: nn.Module,
    name: str = "weight",
    amount: Amount = 0.5,
    n: Union[int, float, str] = 2,
    dim: int = 0,
    optimizer=None,
):
    """Zero whole slices along ``dim`` (output channels for dim=0): the ``amount`` slices with the
    lowest L-``n`` norm (n = 1, 2, inf, "fro"), as torch.nn.utils.prune.ln_structured chooses."""
    _commit(_plan_ln(module, name, amount, n, dim), optimizer)
    return module


def _plan_ln(
    module: nn.Module, name: str, amount: Amount, n, dim: int, where: str = "ln_structured"
) -> Plan:
    w = _param(module, name)
    if w.dim() < 1:
        raise ValueError("torchspeed.prune.ln_structured: the tensor needs at least one dim")
    d = _check_dim(dim, w.dim(), where)
    order = _check_norm(n, where, "n" if where == "ln_structured" else "norm")
    channels = w.shape[d]
    k = _count(amount, channels)
    other = [i for i in range(w.dim()) if i != d]
    wf = w.detach().float()
    norms = torch.linalg.vector_norm(wf, ord=order, dim=other) if other else wf.abs()
    keep_ch = torch.ones(channels, dtype=torch.bool, device=w.device)
    if k > 0:
        # torch keeps topk(norms, channels - k); prune the complement: the k lowest norms.
        kept = torch.topk(norms, channels - k, largest=True).indices
        keep_ch.zero_()
        keep_ch[kept] = True
    shape = [1] * w.dim()
    shape[d] = channels
    keep = keep_ch.reshape(shape).expand(w.shape).contiguous()
    return [(module, name, pack_mask(keep))]


def _check_dim(dim, ndim: int, where: str) -> int:
    """``dim`` wrapped into [0, ndim) as torch does; IndexError out of [-ndim, ndim - 1]."""
    if isinstance(dim, bool) or not isinstance(dim, numbers.Integral):
        raise TypeError(f"torchspeed.prune.{where}: dim must be an int, got {dim!r}")
    if not -ndim <= dim < ndim:
        raise IndexError(
            f"torchspeed.prune.{where}: dim out of range (expected to be in range of "
            f"[{-ndim}, {ndim - 1}], but got {dim})"
        )
    return int(dim) % ndim


def _check_norm(n, where: str, label: str) -> Union[int, float]:
    """The vector-norm order of ``n``: a number (inf and -inf too, not NaN) or "fro" (2)."""
    if isinstance(n, str):
        if n != "fro":
            raise ValueError(
                f"torchspeed.prune.{where}: {label} must be a number (inf too) or 'fro', got {n!r}"
            )
        return 2
    if isinstance(n, bool) or not isinstance(n, numbers.Real):
        raise TypeError(
            f"torchspeed.prune.{where}: {label} must be a number (inf too) or 'fro', got {n!r}"
        )
    if math.isnan(float(n)):
        raise ValueError(f"torchspeed.prune.{where}: {label} must not be NaN")
    return int(n) if isinstance(n, numbers.Integral) else float(n)


def nm_sparse(module: nn.Module, name: str = "weight", n: int = 2, m: int = 4, optimizer=None):
    """N:M sparsity along the input dimension: keep the n largest |w| of every m consecutive
    elements of each row of ``w.reshape(w.shape[0], -1)`` (a Linear's input features, a Conv's
    (in, *kernel) elements). The row length must be a multiple of m."""
    _commit(_plan_nm(module, name, n, m), optimizer)
    return module


def _check_nm(n, m, where: str) -> None:
    for label, v in (("n", n), ("m", m)):
        if isinstance(v, bool) or not isinstance(v, numbers.Integral):
            raise TypeError(f"torchspeed.prune.{where}: {label} must be an int, got {v!r}")
    if not 1 <= m <= 256:
        raise ValueError(f"torchspeed.prune.{where}: m must be in [1, 256], got {m}")
    if not 0 <= n <= m:
        raise ValueError(f"torchspeed.prune.{where}: n must be in [0, m={m}], got {n}")


def _plan_nm(module: nn.Module, name: str, n: int, m: int) -> Plan:
    _check_nm(n, m, "nm_sparse")
    w = _param(module, name)
    if w.dim() > 1:
        rows = w.reshape(w.shape[0], math.prod(w.shape[1:]))  # also when w has no elements
    else:
        rows = w.reshape(1, -1)
    return [(module, name, nm_mask(_logical(rows), int(n), int(m)))]


def apply(
    model: nn.Module,
    method: str = "l1_unstructured",
    amount: Amount = 0.5,
    *,
    n: int = 2,
    m: int = 4,
    norm: Union[int, float, str] = 2,
    dim: int = 0,
    types=PRUNABLE,
    optimizer=None,
) -> nn.Module:
    """Prune every Linear/Conv weight of ``model`` with one method:
    "l1_unstructured" (per tensor), "global_unstructured" (one threshold across all of them),
    "ln_structured" (output channels by L-``norm``, along ``dim``), "nm" (n:m along the input)."""
    _module(model, "apply", "model")
    if not isinstance(method, str):
        raise TypeError(f"torchspeed.prune.apply: method must be a str, got {method!r}")
    if method not in _METHODS:
        raise ValueError(
            f"torchspeed.prune.apply: method must be one of {_METHODS}, got {method!r}"
        )
    targets = prunable_parameters(model, types)
    # Every layer's mask is computed (and checked) before any layer changes.
    plan: Plan = []
    if method == "global_unstructured":
        plan = _plan_global(targets, amount)
    for mod, name in targets if method != "global_unstructured" else []:
        if method == "l1_unstructured":
            plan += _plan_l1(mod, name, amount)
        elif method == "ln_structured":
            plan += _plan_ln(mod, name, amount, norm, dim, "apply")
        else:
            plan += _plan_nm(mod, name, n, m)
    _commit(plan, optimizer)
    return model


def remove(module: nn.Module, name: Optional[str] = None, optimizer=None) -> nn.Module:
    """Drop the mask of ``module.<name>`` (or, with name None, every mask in ``module`` and its
    submodules); the zeros stay in the weight (as torch's remove makes pruning permanent).

    Every optimizer the mask was registered with (``optimizer=`` of the verbs, ``apply``,
    ``load_state_dict``, ``GradualPruner``) forgets it, with or without ``optimizer=`` here; a
    weight shared by several modules (tied weights) stays masked by the other modules' masks.
    ``optimizer``: checked like the verbs' (a fused optimizer must hold the weight), and its mask
    for the weight is dropped even when torchspeed.prune did not register it."""
    if not isinstance(module, nn.Module):
        raise TypeError(
            f"torchspeed.prune.remove: module must be an nn.Module, got {type(module).__name__}"
        )
    if name is not None and not isinstance(name, str):
        raise TypeError(f"torchspeed.prune.remove: name must be a str or None, got {name!r}")
    mods = [module] if name is not None else list(module.modules())
    todo = []
    for mod in mods:
        names = (
            [name]
            if name is not None
            else [b[: -len(MASK_SUFFIX)] for b in list(mod._buffers) if b.endswith(MASK_SUFFIX)]
        )
        for nm in names:
            if nm + MASK_SUFFIX not in mod._buffers:
                raise ValueError(
                    f"torchspeed.prune.remove: {type(mod).__name__}.{nm} is not pruned"
                )
            todo.append((mod, nm))
    params = [_param(mod, nm) for mod, nm in todo]
    _check_optimizer(optimizer, params)
    for (mod, nm), param in zip(todo, params):
        del mod._buffers[nm + MASK_SUFFIX]
        _unregister(mod, nm, param, optimizer)
    return module
