"""Magnitude pruning with bit-packed masks applied in place (issue 12, part 1).

    import torchspeed.prune as prune
    prune.l1_unstructured(model.fc1, "weight", amount=0.5)       # exactly half of fc1.weight zeroed
    prune.nm_sparse(model.fc2, "weight", n=2, m=4)               # 2:4 along the input dim
    prune.global_unstructured([(model.fc1, "weight"), (model.fc2, "weight")], amount=0.8)
    prune.apply(model, method="l1_unstructured", amount=0.5, optimizer=opt)   # every Linear/Conv
    prune.sparsity(model)                                        # {"fc1.weight": 0.5, ..., "total": ...}
    prune.remove(model)                                          # drop the masks, keep the zeros

Unlike torch.nn.utils.prune, the weight stays a plain Parameter holding zeros (no ``weight_orig``
and no forward pre-hook: forward costs nothing and deepcopy works), and the mask is a buffer
``<name>_mask_packed`` (uint8, 1 bit per element, 1/32 of an fp32 weight's bytes) saved in the
state_dict; ``load_state_dict(model, sd)`` loads it into a fresh model. With ``optimizer=`` a
torchspeed fused optimizer keeps the pruned elements at exactly zero inside its update pass (it
reads the packed bits); a torch.optim optimizer gets a step post-hook that re-applies the mask.

``amount``: an int is a count of elements (of channels for ln_structured), a float in [0, 1] a
fraction of them (rounded, as torch does). It is the sparsity of the whole tensor after the call
(torch's iterative PruningContainer instead prunes a fraction of what is left); elements pruned
earlier stay pruned. Masks are in the tensor's logical (row-major) order.
"""

from __future__ import annotations

import math
import numbers
import weakref
from typing import Dict, Iterable, List, Optional, Tuple, Union

import torch
from torch import nn

from ._ops import apply_mask_, magnitude_mask, nm_mask, pack_mask, unpack_mask
from .schedule import GradualPruner, cubic_sparsity
from .semi_structured import to_semi_structured

__all__ = [
    "GradualPruner",
    "apply",
    "apply_mask_",
    "cubic_sparsity",
    "get_mask",
    "global_unstructured",
    "is_pruned",
    "l1_unstructured",
    "ln_structured",
    "load_state_dict",
    "magnitude_mask",
    "nm_mask",
    "nm_sparse",
    "pack_mask",
    "prunable_parameters",
    "remove",
    "sparsity",
    "to_semi_structured",
    "unpack_mask",
]

MASK_SUFFIX = "_mask_packed"
PRUNABLE = (nn.Linear, nn.Conv1d, nn.Conv2d, nn.Conv3d)
_METHODS = ("l1_unstructured", "global_unstructured", "ln_structured", "nm")

Amount = Union[int, float]


# ---- helpers ------------------------------------------------------------------------------------
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


def _param(module: nn.Module, name: str) -> torch.Tensor:
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
    packed = module._buffers.get(name + MASK_SUFFIX)
    if packed is None:
        return None
    return unpack_mask(packed, _param(module, name).shape)


def _logical(w: torch.Tensor) -> torch.Tensor:
    """w in logical order (the ops read memory order; contiguous makes them the same)."""
    return w.detach().contiguous()


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


def _register_with(optimizer, param: torch.Tensor, packed: Optional[torch.Tensor]) -> None:
    if optimizer is None:
        return
    if hasattr(optimizer, "set_mask"):  # torchspeed's fused optimizers: inside the update pass
        optimizer.set_mask(param, packed)
        return
    _check_optimizer(optimizer, [param])
    # torch.optim: a step post-hook re-applies the masks after each step (a separate pass).
    masks = optimizer.__dict__.get("_torchspeed_prune_masks")
    if masks is None:
        masks = optimizer.__dict__["_torchspeed_prune_masks"] = weakref.WeakKeyDictionary()

        def reapply(opt, args, kwargs):
            with torch.no_grad():
                for p, m in list(masks.items()):
                    _apply(p, m)

        optimizer.register_step_post_hook(reapply)
    if packed is None:
        masks.pop(param, None)
    else:
        masks[param] = packed


def _apply(param: torch.Tensor, packed: torch.Tensor) -> None:
    with torch.no_grad():
        if param.is_contiguous():
            apply_mask_(param.data, packed)
        else:
            param.data.masked_fill_(~unpack_mask(packed, param.shape), 0)


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
        _register_with(optimizer, param, keep_packed)


# ---- the verbs ----------------------------------------------------------------------------------
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
    params = list(parameters)
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


def _plan_ln(module: nn.Module, name: str, amount: Amount, n, dim: int) -> Plan:
    w = _param(module, name)
    if w.dim() < 1:
        raise ValueError("torchspeed.prune.ln_structured: the tensor needs at least one dim")
    d = dim % w.dim()
    channels = w.shape[d]
    k = _count(amount, channels)
    other = [i for i in range(w.dim()) if i != d]
    order = 2 if n == "fro" else n
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


def prunable_parameters(model: nn.Module, types=PRUNABLE) -> List[Tuple[nn.Module, str]]:
    """(module, "weight") for every Linear/Conv (or ``types``) in ``model``."""
    return [
        (mod, "weight")
        for mod in model.modules()
        if isinstance(mod, types) and isinstance(getattr(mod, "weight", None), torch.Tensor)
    ]


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
            plan += _plan_ln(mod, name, amount, norm, dim)
        else:
            plan += _plan_nm(mod, name, n, m)
    _commit(plan, optimizer)
    return model


def remove(module: nn.Module, name: Optional[str] = None, optimizer=None) -> nn.Module:
    """Drop the mask of ``module.<name>`` (or, with name None, every mask in ``module`` and its
    submodules); the zeros stay in the weight (as torch's remove makes pruning permanent)."""
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
    _check_optimizer(optimizer, [_param(mod, nm) for mod, nm in todo])
    for mod, nm in todo:
        del mod._buffers[nm + MASK_SUFFIX]
        _register_with(optimizer, _param(mod, nm), None)
    return module


def is_pruned(module: nn.Module) -> bool:
    """True when ``module`` or a submodule holds a torchspeed.prune mask."""
    return any(b.endswith(MASK_SUFFIX) for mod in module.modules() for b in mod._buffers)


def sparsity(module: nn.Module, types=PRUNABLE) -> Dict[str, float]:
    """Fraction of zeros of every Linear/Conv weight (by qualified name) and ``"total"``."""
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


def load_state_dict(
    model: nn.Module, state_dict: Dict[str, torch.Tensor], strict: bool = True, optimizer=None
):
    """``model.load_state_dict`` that first creates the mask buffers the state_dict holds, so a
    pruned model's state_dict loads into a fresh (unpruned) model; the masks are re-applied.

    ``optimizer``: registers every mask of the model with it (as the verbs' ``optimizer=`` does),
    so training a resumed model keeps the pruned weights at zero. Every mask entry (its module,
    weight, dtype uint8 and ceil(numel / 8) bytes) and the optimizer are checked before the model
    changes; an error while loading removes the mask buffers this call created."""
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
                _register_with(optimizer, param, mod._buffers[buf])
    return result


def _targets(model_or_params) -> List[Tuple[nn.Module, str]]:
    if isinstance(model_or_params, nn.Module):
        return prunable_parameters(model_or_params)
    return [(m, n) for m, n in model_or_params]
