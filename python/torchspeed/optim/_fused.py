"""Base class of torchspeed's fused optimizers: state layout, AMP, masters, clipping, masks, EMA.

Each subclass names its per-param fp32 state and calls one fused op per (param group, bucket),
where a bucket is the params of a group that share "has an fp32 master" (and, for SGD, "has a
momentum buffer"). Everything else (unscale, inf-skip, clip, mask, EMA) happens inside the op.

A step first validates everything (hyperparameters of every group through the validator the C++
optimizers share, then every op call's arguments through the ops' own validators), and only
then creates state and runs the ops: a step that raises changes nothing.
"""

import math
import numbers
from typing import Any, Dict, Iterable, List, Optional

import torch
from torch.optim import Optimizer

from .. import _C
from .._native import native_op
from ..profile import ranges as _profile_ranges
from ._ops import grad_stats

_LOW_PRECISION = (torch.bfloat16, torch.float16)
_now_ns = _C.profile.now_ns  # the one clock (step_stats["seconds"])
_STEP_NAME_ID = _C.profile.intern("torchspeed.optim.step")
_OPTIMIZER_PHASE = _profile_ranges.PHASE_IDS["optimizer"]


def _zeros_like_param(p: torch.Tensor) -> torch.Tensor:
    """float32 zeros in the param's memory layout (contiguous or e.g. channels_last)."""
    return torch.zeros_like(p, dtype=torch.float32, memory_format=torch.preserve_format)


#: What the ops' validators say of a state laid out unlike its param (csrc/ops/optim_checks.h:
#: float and bf16 states, int8 codes).
_LAID_OUT_UNLIKE = ("must be laid out in memory like params[", "the memory layout of params[")


def _same_memory_order(t: torch.Tensor, p: torch.Tensor) -> bool:
    """Whether dense t holds its elements in p's memory order: both contiguous (any shapes), or
    one shape and one layout (strides of size-1 dims do not matter); ops::laid_out_like in C++."""
    if t.is_contiguous() and p.is_contiguous():
        return True
    return t.shape == p.shape and all(
        a == b for a, b, n in zip(t.stride(), p.stride(), p.shape) if n > 1
    )


def _like_param(value: torch.Tensor, p: torch.Tensor) -> torch.Tensor:
    """A float32 copy of `value` (the param's shape) on the param's device and in its layout."""
    return _zeros_like_param(p).copy_(value)


_KERNEL_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def _pack_bits(keep: torch.Tensor) -> torch.Tensor:
    """A bool tensor packed in memory order (the pack_mask op, built with the optimizers)."""
    return native_op("pack_mask", "optim", "torchspeed.optim.set_mask")(keep)


def _unpack_bits(packed: torch.Tensor, shape) -> torch.Tensor:
    return native_op("unpack_mask", "optim", "torchspeed.optim.set_mask")(packed, list(shape))


def _packed_mask_for(mask: torch.Tensor, p: torch.Tensor) -> torch.Tensor:
    """The bit-packed mask the fused ops read for `p` (uint8 [ceil(numel / 8)], bit i = element i
    of p in memory order) from a {0,1} mask of p's numel (bool/float/int, p's logical order) or a
    packed one (uint8 of ceil(numel / 8) bytes, bit i = element i of p in logical order, the
    layout of torchspeed.prune's mask buffers)."""
    n = p.numel()
    nbytes = (n + 7) // 8
    mask = mask.detach()
    # A packed mask and a dense one coincide for one element: either reading gives the same bit.
    is_packed = mask.dtype == torch.uint8 and mask.numel() == nbytes and (n != 1 or mask.dim() == 1)
    if not is_packed and mask.numel() != n:
        raise ValueError(
            f"torchspeed.optim: mask must have {n} elements like the param (bool or {{0,1}}), or "
            f"be a packed uint8 mask of ceil({n} / 8) = {nbytes} bytes; got {mask.dtype} with "
            f"{mask.numel()} elements"
        )
    if is_packed and p.is_contiguous():
        return mask.to(p.device).contiguous().reshape(-1).clone()
    if is_packed:
        logical = _unpack_bits(mask.to(p.device).contiguous(), p.shape)
    else:
        logical = (mask != 0).reshape(p.shape).to(p.device)
    # Element i of the logical mask masks element i of the param, packed in the param's memory
    # layout (e.g. channels_last): a bool tensor laid out like p, then packed in memory order.
    in_layout = torch.empty_like(p, dtype=torch.bool, memory_format=torch.preserve_format)
    return _pack_bits(in_layout.copy_(logical))


def _dense(p: torch.Tensor) -> bool:
    """Non-overlapping and dense (contiguous in some memory format), as the ops require."""
    if p.is_contiguous():
        return True
    try:
        from torch._prims_common import is_non_overlapping_and_dense
    except ImportError:  # pragma: no cover - older torch
        return p.is_contiguous(memory_format=torch.channels_last) if p.dim() == 4 else False
    return is_non_overlapping_and_dense(p)


def _arguments(constructor_locals: Dict[str, Any]) -> Dict[str, Any]:
    """A constructor's arguments by name (its ``locals()`` taken first thing), without self and
    params: every optimizer's defaults are exactly its arguments."""
    return {k: v for k, v in constructor_locals.items() if k not in ("self", "params", "__class__")}


def _accept_torch_only_flags(name: str, foreach, fused, differentiable) -> None:
    # torch.optim arguments that choose an implementation are accepted so that swapping the class
    # is the only change; torchspeed always runs its fused kernels.
    del foreach, fused
    if differentiable:
        raise ValueError(
            f"torchspeed.optim.{name}: differentiable=True is not supported (the fused step is not "
            "differentiable); use torch.optim for higher-order optimization"
        )


def _real(optimizer: str, name: str, value) -> float:
    """`value` as a float, or the error torch.optim raises for it (ValueError for a Tensor where a
    float is expected, TypeError for anything else that is not a real number)."""
    if torch.is_tensor(value):
        raise ValueError(
            f"torchspeed.optim.{optimizer}: {name} must be a float, got a Tensor (only lr may be "
            "a Tensor)"
        )
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(
            f"torchspeed.optim.{optimizer}: {name} must be a float, got {type(value).__name__} "
            f"{value!r}"
        )
    return float(value)


def _check_value(optimizer: str, name: str, value) -> None:
    # The range rules live in C++ (torchspeed/optim/hyperparams.h), shared with the C++ optimizers.
    _C.optim.check_hyperparameter(optimizer, name, _real(optimizer, name, value))


class FusedOptimizer(Optimizer):
    """Shared machinery; see the subclasses for the user-facing arguments.

    Extra arguments over torch.optim (all keyword-only, all per param group):
        master_weights: keep fp32 master copies of bfloat16/float16 params and update those
            (default None = on for low-precision params). The rounded master is written to the
            param after each step. Masters are saved in state_dict().
        max_grad_norm: clip the norm of the group's gradients (after AMP unscaling) to this value
            in the same pass that checks for inf/NaN, as torch.nn.utils.clip_grad_norm_ applied
            to the group's params would (default None = off; 0 zeroes the grads, as torch does).
        ema_decay: keep an fp32 EMA copy of every param, updated inside the step (default None).

    Hyperparameters are validated when the optimizer is built, when a group is added, when a
    state_dict is loaded and at every step (so a value changed in param_groups is checked before
    anything is written). A param listed twice in a group is updated twice, one update after the
    other, as torch.optim does (torch warns about it); params that share memory are updated one
    after the other in list order.
    """

    # GradScaler hands the step `grad_scale` and `found_inf` tensors instead of unscaling.
    _step_supports_amp_scaling = True
    _state_keys: tuple = ()  # fp32 per-param state tensors, created as zeros
    _uses_step = True
    _hyperparameters: tuple = ("weight_decay",)  # real-valued, besides lr, betas and the extras
    _has_betas = False
    _tensor_lr_foreach_error = False  # torch.optim.Adam* reject a Tensor lr with foreach=True
    # Group keys a load keeps from the optimizer (the state is converted to them), see
    # load_state_dict.
    _kept_on_load: tuple = ()

    def __init__(self, params, defaults: Dict[str, Any]):
        defaults.setdefault("master_weights", None)
        defaults.setdefault("max_grad_norm", None)
        defaults.setdefault("ema_decay", None)
        self._check_hyperparameters(defaults, "")
        super().__init__(params, defaults)
        self._masks: Dict[torch.Tensor, torch.Tensor] = {}  # param -> packed uint8 mask
        # param -> its strides when its mask was packed (in its memory order then)
        self._mask_strides: Dict[torch.Tensor, tuple] = {}
        self._no_mask: Dict[torch.device, torch.Tensor] = {}  # empty uint8: "no mask" in a bucket
        self.step_stats = {"steps": 0, "skipped": 0, "seconds": 0.0}

    def __getstate__(self):
        # torch's Optimizer pickles defaults, state and param_groups; masks and stats travel too,
        # so a deepcopy or an unpickled optimizer steps like the original.
        state = super().__getstate__()
        state["_masks"] = self._masks
        state["_mask_strides"] = self._mask_strides
        state["step_stats"] = self.step_stats
        return state

    def __setstate__(self, state):
        state = dict(state)
        masks = state.pop("_masks", {})
        mask_strides = state.pop("_mask_strides", {})
        step_stats = state.pop("step_stats", {"steps": 0, "skipped": 0, "seconds": 0.0})
        super().__setstate__(state)
        # Masks pickled before they were bit-packed (dense float32) are packed now.
        self._masks = {
            p: m if m.dtype == torch.uint8 else _packed_mask_for(m, p) for p, m in masks.items()
        }
        # Pickled without them: packed in the layout the params have now.
        self._mask_strides = {p: mask_strides.get(p, p.stride()) for p in self._masks}
        self._no_mask = {}
        self.step_stats = step_stats
        for group in self.param_groups:
            for key in ("master_weights", "max_grad_norm", "ema_decay"):
                group.setdefault(key, None)
            self._group_defaults(group)

    def _group_defaults(self, group: Dict[str, Any]) -> None:
        """Fill keys a torch.optim state_dict's groups may lack."""

    # ---- hyperparameters -----------------------------------------------------------------------
    def add_param_group(self, param_group: Dict[str, Any]) -> None:
        """torch.optim's add_param_group, after validating the group's hyperparameters (with the
        optimizer's defaults for those it does not set)."""
        if isinstance(param_group, dict) and hasattr(self, "param_groups"):
            merged = {**self.defaults, **param_group}
            self._check_hyperparameters(merged, f"param_groups[{len(self.param_groups)}]")
        super().add_param_group(param_group)

    def _check_hyperparameters(self, group: Dict[str, Any], where: str, at_step=False) -> None:
        """Raises ValueError/TypeError naming the argument when a hyperparameter of `group` is
        out of range or of the wrong type. On the step path a CUDA lr tensor's value is not read
        (that would synchronise); its size is."""
        name = type(self).__name__
        prefix = f"{where}." if where else ""
        lr = group["lr"]
        if torch.is_tensor(lr):
            if lr.numel() != 1:
                raise ValueError(
                    f"torchspeed.optim.{name}: {prefix}lr: Tensor lr must be 1-element, got "
                    f"{lr.numel()} elements"
                )
            if not (lr.is_floating_point() or lr.dtype in (torch.int32, torch.int64)):
                raise ValueError(
                    f"torchspeed.optim.{name}: {prefix}lr must be a float Tensor, got {lr.dtype}"
                )
            if (
                self._tensor_lr_foreach_error
                and not at_step
                and group.get("foreach")
                and not group.get("capturable")
            ):
                raise ValueError(
                    f"torchspeed.optim.{name}: lr as a Tensor is not supported for "
                    "capturable=False and foreach=True (as in torch.optim)"
                )
            if not at_step or lr.device.type == "cpu":
                _C.optim.check_hyperparameter(name, prefix + "lr", float(lr))
        else:
            _check_value(name, prefix + "lr", lr)
        if self._has_betas:
            self._check_betas(group, prefix, at_step)
        for key in self._hyperparameters:
            _check_value(name, prefix + key, group[key])
        for key in ("max_grad_norm", "ema_decay"):
            if group.get(key) is not None:
                _check_value(name, prefix + key, group[key])
        self._check_group(group, where)

    def _check_betas(self, group: Dict[str, Any], prefix: str, at_step: bool) -> None:
        """A pair of floats, or (as torch.optim accepts) a pair of one-element float Tensors,
        each in [0, 1). A Tensor beta's value is read at each step (so an in-place change to it
        takes effect); on the step path a CUDA beta's value is checked by the op's use only."""
        name = type(self).__name__
        betas = group["betas"]
        if not isinstance(betas, (tuple, list)) or len(betas) != 2:
            raise ValueError(
                f"torchspeed.optim.{name}: {prefix}betas must be a pair of floats (or of "
                f"one-element Tensors), got {betas!r}"
            )
        tensors = [torch.is_tensor(b) for b in betas]
        if any(tensors) and not all(tensors):
            raise ValueError(
                f"torchspeed.optim.{name}: {prefix}betas must be either both floats or both "
                f"Tensors (as in torch.optim), got {betas!r}"
            )
        for i, b in enumerate(betas):
            if not torch.is_tensor(b):
                _check_value(name, f"{prefix}betas[{i}]", b)
                continue
            if b.numel() != 1 or not b.is_floating_point():
                raise ValueError(
                    f"torchspeed.optim.{name}: {prefix}betas[{i}] must be a one-element float "
                    f"Tensor, got {b.dtype} with {b.numel()} elements"
                )
            if (
                self._tensor_lr_foreach_error
                and not at_step
                and group.get("foreach")
                and not group.get("capturable")
            ):
                raise ValueError(
                    f"torchspeed.optim.{name}: betas[{i}] as a Tensor is not supported for "
                    "capturable=False and foreach=True (as in torch.optim)"
                )
            if not at_step or b.device.type == "cpu":
                _C.optim.check_hyperparameter(name, f"{prefix}betas[{i}]", float(b))

    def _check_group(self, group, where: str) -> None:
        """Cross-field rules of a group (subclasses); `where` is "" for the defaults."""

    # ---- pruning masks -------------------------------------------------------------------------
    def set_mask(self, param: torch.Tensor, mask: Optional[torch.Tensor]) -> None:
        """Keep `param` at exactly zero where `mask` is 0, inside every step's update pass.

        `mask`: bool or {0,1} with param's number of elements (its logical order), or a bit-packed
        uint8 mask of ceil(numel / 8) bytes (torchspeed.prune's format: bit j of byte b is element
        8b + j of the param in logical order). It is stored packed (1/32 of an fp32 param's bytes)
        and the fused kernels read the bits directly: no dense mask, no separate masking pass.
        Pass None to remove it. Elements already nonzero where the mask is 0 become 0 at the next
        step (torchspeed.prune zeroes them when it registers the mask).
        """
        if not isinstance(param, torch.Tensor) or not any(
            param is q for g in self.param_groups for q in g["params"]
        ):
            raise ValueError(
                "torchspeed.optim.set_mask: param must be one of this optimizer's parameters, got "
                + (
                    f"a tensor of shape {tuple(param.shape)}"
                    if isinstance(param, torch.Tensor)
                    else repr(type(param))
                )
            )
        if mask is None:
            self._masks.pop(param, None)
            self._mask_strides.pop(param, None)
            return
        if not isinstance(mask, torch.Tensor):
            raise TypeError(
                f"torchspeed.optim.set_mask: mask must be a torch.Tensor or None, got {type(mask)}"
            )
        self._masks[param] = _packed_mask_for(mask, param)
        self._mask_strides[param] = param.stride()

    def _mask_of(self, p: torch.Tensor) -> Optional[torch.Tensor]:
        """p's packed mask in p's memory order now: packed again when p's memory format changed
        since (model.to(memory_format=torch.channels_last) after the mask was set)."""
        packed = self._masks.get(p)
        if packed is None:
            return None
        was = self._mask_strides.get(p, p.stride())
        if was != p.stride():
            old = torch.empty_strided(p.shape, was, dtype=torch.bool, device=p.device)
            old.as_strided((p.numel(),), (1,)).copy_(_unpack_bits(packed, (p.numel(),)))
            packed = self._masks[p] = _packed_mask_for(old, p)
            self._mask_strides[p] = p.stride()
        return packed

    # ---- state ---------------------------------------------------------------------------------
    def _wants_master(self, group, p: torch.Tensor) -> bool:
        mw = group["master_weights"]
        return p.dtype in _LOW_PRECISION and (mw is None or bool(mw))

    def _state_keys_for(self, group) -> tuple:
        return self._state_keys

    def _bucket_state_keys(self, group, p: torch.Tensor) -> tuple:
        """The state keys a bucket whose first param is `p` needs (a bucket has one format)."""
        return self._state_keys_for(group)

    def _new_state(self, group, p: torch.Tensor, old) -> Dict[str, Any]:
        """A copy of `old` (or a fresh state) with every entry this group's step needs; `old`
        itself and self.state are not touched (the step commits it after validating)."""
        state = dict(old) if old else {}
        if self._uses_step and state.get("step") is None:
            state["step"] = torch.zeros((), dtype=torch.float32, device=p.device)
        for key in self._state_keys_for(group):
            if state.get(key) is None:
                state[key] = _zeros_like_param(p)
        if self._wants_master(group, p) and state.get("master") is None:
            # Rebuilt from the param when absent (e.g. loaded from a torch.optim state_dict).
            state["master"] = _like_param(p.detach(), p)
        if group["ema_decay"] is not None and state.get("ema") is None:
            state["ema"] = _like_param(state.get("master", p).detach(), p)
        return state

    def _load_value(self, key: str, value, p: torch.Tensor, where: str):
        """One saved state entry converted for `p`, or ValueError naming it."""
        name = type(self).__name__
        if key == "step":
            # torch < 1.12 saved the step as a plain number; torch itself converts it.
            if torch.is_tensor(value):
                if value.numel() != 1:
                    raise ValueError(
                        f"torchspeed.optim.{name}: {where}['step'] must be a number or a "
                        f"one-element tensor, got shape {tuple(value.shape)}"
                    )
                step = value.detach().to(device=p.device, dtype=torch.float32).clone().reshape(())
            elif isinstance(value, bool) or not isinstance(value, numbers.Real):
                raise ValueError(
                    f"torchspeed.optim.{name}: {where}['step'] must be a number or a one-element "
                    f"tensor, got {type(value).__name__}"
                )
            else:
                step = torch.tensor(float(value), dtype=torch.float32, device=p.device)
            # A count: a NaN or negative one would turn every later update into NaN or noise.
            count = float(step)
            if not (math.isfinite(count) and count >= 0):
                raise ValueError(
                    f"torchspeed.optim.{name}: {where}['step'] must be a finite number >= 0 (the "
                    f"steps taken), got {count}"
                )
            return step
        if not torch.is_tensor(value):
            return value
        if not (value.is_floating_point() and value.layout == torch.strided):
            raise ValueError(
                f"torchspeed.optim.{name}: {where}['{key}'] must be a dense floating tensor, got "
                f"{value.dtype} {value.layout}"
            )
        if value.numel() != p.numel():
            raise ValueError(
                f"torchspeed.optim.{name}: {where}['{key}'] must have {p.numel()} elements like "
                f"its param, got {value.numel()} (shape {tuple(value.shape)})"
            )
        return _like_param(value.detach().reshape(p.shape), p)

    def _load_state(
        self, group, p: torch.Tensor, values: Dict[str, Any], where: str, saved=None, saved_where=""
    ):
        """One param's loaded state, after each entry's conversion: the subclass may convert it
        as a whole (Adam: to the group's state format; `saved` is the state_dict's group of p,
        `saved_where` its name). Moments need their step count (bias correction, seeds)."""
        if (
            self._uses_step
            and values.get("step") is None
            and any(values.get(k) is not None for k in self._state_keys)
        ):
            raise ValueError(
                f"torchspeed.optim.{type(self).__name__}: {where}['step'] must be a number or a "
                f"one-element tensor beside the moments, got none"
            )
        return values

    def load_state_dict(self, state_dict: Dict[str, Any]) -> None:
        """Loads torchspeed's or torch.optim's state_dict. Everything is validated and converted
        first (hyperparameters, state sizes, an int `step` from old checkpoints); the optimizer
        changes only when all of it is good. torch casts floating state to the param dtype; fp32
        moments and masters are restored here without that downcast."""
        as_saved = state_dict["param_groups"]  # before the kept keys: the state's own format
        if self._kept_on_load:
            # The optimizer's own state format is kept; the loaded moments are converted to it.
            state_dict = dict(state_dict)
            state_dict["param_groups"] = [
                {**saved, **{k: group[k] for k in self._kept_on_load}}
                for saved, group in zip(state_dict["param_groups"], self.param_groups)
            ] + list(state_dict["param_groups"][len(self.param_groups) :])
        saved_groups = state_dict["param_groups"]
        if len(saved_groups) != len(self.param_groups):
            raise ValueError("loaded state dict has a different number of parameter groups")
        for i, saved in enumerate(saved_groups):
            merged = {**self.defaults, **{k: v for k, v in saved.items() if k != "params"}}
            self._check_hyperparameters(merged, f"state_dict param_groups[{i}]")
        index_to_param = {}
        index_to_group = {}
        index_to_saved = {}
        for i, (saved_group, group) in enumerate(zip(saved_groups, self.param_groups)):
            if len(saved_group["params"]) != len(group["params"]):
                raise ValueError(
                    "loaded state dict contains a parameter group that doesn't match the size "
                    "of optimizer's group"
                )
            index_to_param.update(zip(saved_group["params"], group["params"]))
            merged = {**self.defaults, **{k: v for k, v in saved_group.items() if k != "params"}}
            index_to_group.update((index, merged) for index in saved_group["params"])
            saved_as = (as_saved[i], f"state_dict param_groups[{i}]")
            index_to_saved.update((index, saved_as) for index in saved_group["params"])
        converted = {}
        for index, saved in state_dict["state"].items():
            p = index_to_param.get(index)
            if p is None:
                continue
            where = f"state_dict state[{index!r}]"
            values = {k: self._load_value(k, v, p, where) for k, v in saved.items()}
            saved_group, saved_where = index_to_saved[index]
            converted[p] = self._load_state(
                index_to_group[index], p, values, where, saved_group, saved_where
            )
        # torch's load_state_dict goes through __setstate__: keep the masks
        masks, mask_strides = self._masks, self._mask_strides
        super().load_state_dict(state_dict)
        self._masks, self._mask_strides = masks, mask_strides
        for p, values in converted.items():
            # Replaced, not updated: a conversion may drop entries (int8 absmaxes -> fp32).
            self.state[p].clear()
            self.state[p].update(values)

    def state_bytes(self) -> int:
        """Bytes of optimizer state held for all params: moments (and their absmaxes), masters,
        EMA copies and step counts. Per param under Adam/AdamW: 8 with float32 moments, 4 with
        bf16, about 2.03 with int8 (blocks of 256); half that under Lion and SGD with momentum
        (one moment); docs/OPTIM.md."""
        return sum(_state_nbytes(s) for s in self.state.values() if s)

    # ---- step ----------------------------------------------------------------------------------
    def _clip_coef(self, group, grad_scale: Optional[torch.Tensor]) -> Optional[torch.Tensor]:
        """torch.nn.utils.clip_grad_norm_(group's params, max_grad_norm)'s coefficient, kept on
        the device (no sync on CUDA); each group is clipped by the norm of its own grads."""
        max_norm = group["max_grad_norm"]
        if max_norm is None:
            return None
        grads = [p.grad for p in group["params"] if p.grad is not None]
        if not grads:
            return None
        norm = grad_stats(grads).total_norm
        if grad_scale is not None:
            norm = norm / grad_scale.to(norm.device)  # norm of the unscaled grads
        return torch.clamp(float(max_norm) / (norm + 1e-6), max=1.0).reshape(1)

    @torch.no_grad()
    def step(self, closure=None):
        """One fused update of every param with a gradient. Under torch.amp.GradScaler the
        unscale and the inf/NaN skip happen inside the kernels."""
        if torch.compiler.is_compiling():
            return self._fused_step(closure)
        # The optimizer phase of torchspeed.profile's step breakdown (a closure's forward and
        # backward inside it count as theirs: the innermost phase wins).
        _profile_ranges._enter(_STEP_NAME_ID, _OPTIMIZER_PHASE)
        try:
            return self._fused_step(closure)
        finally:
            _profile_ranges._exit(_STEP_NAME_ID, _OPTIMIZER_PHASE)

    def _fused_step(self, closure):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        # Timing and the host-side validators (pybind functions) stay out of a torch.compile
        # trace, which cannot follow them; there the ops' Meta kernels check every call.
        compiling = torch.compiler.is_compiling()
        start = 0 if compiling else _now_ns()
        grad_scale = getattr(self, "grad_scale", None)
        found_inf = getattr(self, "found_inf", None)
        if not compiling:
            for index, group in enumerate(self.param_groups):
                self._check_hyperparameters(group, f"param_groups[{index}]", at_step=True)
        calls = []
        for index, group in enumerate(self.param_groups):
            params = [p for p in group["params"] if p.grad is not None]
            if params:
                calls += [(index, group, bucket) for bucket in self._buckets(group, params)]
        if len(calls) > 1 and not compiling:
            # Friendly positions for the common mistakes before the ops' own validators run.
            for index, group, bucket in calls:
                self._check_call(index, group, bucket)
        if compiling:
            self._run_calls(calls, grad_scale, found_inf, compiling)
        else:
            try:
                self._run_calls(calls, grad_scale, found_inf, compiling)
            except RuntimeError as e:
                # A param whose memory format changed after its state was made (model.to(
                # memory_format=torch.channels_last) mid-run, as torch.optim allows): the ops
                # validate before they write, so nothing changed; the state follows, and again.
                if not any(m in str(e) for m in _LAID_OUT_UNLIKE) or not (
                    self._follow_param_layouts()
                ):
                    raise
                self._run_calls(calls, grad_scale, found_inf, compiling)
        self.step_stats["steps"] += 1
        if found_inf is not None and found_inf.device.type == "cpu" and found_inf.item() != 0:
            self.step_stats["skipped"] += 1
        if not compiling:
            self.step_stats["seconds"] += (_now_ns() - start) / 1e9  # the profiler's clock
        return loss

    def _follow_param_layouts(self) -> bool:
        """Each state held in another memory order than its param (the param's memory format
        changed after the state was made) converted as load_state_dict converts a loaded one:
        the same logical positions in the param's layout (int8 codes decoded and coded again).
        True when one was."""
        changed = False
        for gi, group in enumerate(self.param_groups):
            for pi, p in enumerate(group["params"]):
                s = self.state.get(p)
                if not s or all(
                    _same_memory_order(t, p)
                    for t in s.values()
                    if torch.is_tensor(t) and t.shape == p.shape
                ):
                    continue
                where = f"state of param_groups[{gi}].params[{pi}]"
                values = {k: self._load_value(k, v, p, where) for k, v in s.items()}
                values = self._load_state(group, p, values, where)
                s.clear()
                s.update(values)
                changed = True
        return changed

    def _run_calls(self, calls, grad_scale, found_inf, compiling: bool) -> None:
        """The step's op calls: validated (all of them) before the first writes."""
        staged: Dict[torch.Tensor, Dict[str, Any]] = {}
        prepared = []
        coefs: Dict[int, Optional[torch.Tensor]] = {}
        for index, group, bucket in calls:
            if index not in coefs:
                coefs[index] = self._clip_coef(group, grad_scale)
            scalars = self._scalars(group, grad_scale, found_inf, coefs[index])
            prepared.append(self._prepare(group, bucket, staged, scalars))
        if len(prepared) == 1:
            # The op validates all its arguments before it writes; new state is kept only if
            # the op ran.
            op, args, kwargs, after = prepared[0]
            op(*args, **kwargs)
            self.state.update(staged)
            after()
        elif prepared:
            if not compiling:
                for op, args, kwargs, _after in prepared:
                    _validate_only(op, args, kwargs)
            self.state.update(staged)
            for op, args, kwargs, after in prepared:
                op(*args, **kwargs)
                after()

    def _check_call(self, group_index: int, group, params: List[torch.Tensor]) -> None:
        """What the op would reject about params and grads, with the param's position."""
        device = params[0].device
        for p in params:
            g = p.grad
            problem = None
            if p.dtype not in _KERNEL_DTYPES:
                problem = "{where} must be float32, bfloat16 or float16, got " + str(p.dtype)
            elif g.layout != torch.strided:
                problem = (
                    "the grad of {where} must be dense; sparse gradients are not supported, "
                    f"got layout {g.layout}"
                )
            elif g.dtype not in _KERNEL_DTYPES:
                problem = "the grad of {where} must be float32, bfloat16 or float16, got " + str(
                    g.dtype
                )
            elif p.device != device or g.device != device:
                problem = (
                    f"{{where}} and its grad must be on {device} like the other params of the "
                    f"group, got {p.device} and {g.device}"
                )
            elif g.shape != p.shape:
                problem = (
                    f"the grad of {{where}} must have the param's shape {tuple(p.shape)}, got "
                    f"{tuple(g.shape)}"
                )
            elif not _dense(p):
                problem = (
                    f"{{where}} must be contiguous in some memory format, got strides {p.stride()}"
                )
            if problem is not None:
                # The position is looked up only for the error (this loop is on the step path).
                index = next(i for i, q in enumerate(group["params"]) if q is p)
                where = f"param_groups[{group_index}].params[{index}]"
                raise RuntimeError(
                    f"torchspeed.optim.{type(self).__name__}: " + problem.format(where=where)
                )

    def _buckets(self, group, params: List[torch.Tensor]) -> Iterable[List[torch.Tensor]]:
        """Splits a group's params into those with an fp32 master and those without."""
        mw = group["master_weights"]
        if mw is not None and not mw:
            return [params]
        with_master, without = [], []
        for p in params:
            (with_master if p.dtype in _LOW_PRECISION else without).append(p)
        return [b for b in (with_master, without) if b]

    def _prepare(self, group, params, staged, scalars):
        """(op, args, kwargs, after) of one op call; new or completed state goes to `staged`."""
        # Hot path (runs every step for every param): one dict lookup per param once state exists.
        state_of = self.state
        wants_master = self._wants_master(group, params[0])  # shared by a bucket
        need_ema = group["ema_decay"] is not None
        keys = self._bucket_state_keys(group, params[0])
        keys += ("master",) * wants_master + ("ema",) * need_ema
        states = []
        for p in params:
            s = staged.get(p) if staged else None
            if s is None:
                s = state_of.get(p)
                if not s or _missing(s, keys):
                    s = staged[p] = self._new_state(group, p, s)
            states.append(s)
        grads = [p.grad for p in params]
        masters = [s["master"] for s in states] if wants_master else []
        masks = []
        if self._masks and any(p in self._masks for p in params):
            # Params without a mask in a bucket where others have one get an empty tensor (none).
            dev = params[0].device
            none = self._no_mask.get(dev)
            if none is None:
                none = self._no_mask[dev] = torch.empty(0, dtype=torch.uint8, device=dev)
            masks = [self._mask_of(p) if p in self._masks else none for p in params]
        emas = [s["ema"] for s in states] if need_ema else []
        return self._op_call(group, params, states, grads, masters, masks, emas, scalars)

    def _scalars(self, group, grad_scale, found_inf, clip_coef) -> Dict[str, Any]:
        lr = group["lr"]
        lr_tensor = None
        if not torch.is_tensor(lr) and torch.compiler.is_compiling():
            lr_tensor, lr = _traced_lr(lr, group["params"][0].device), 0.0
        elif torch.is_tensor(lr):
            # On the params' device, as the op requires (a CPU lr with CUDA params is allowed).
            device = group["params"][0].device
            lr_tensor = lr.detach().to(device=device, dtype=torch.float32).reshape(1)
            lr = 0.0
        return dict(
            lr=float(lr),
            lr_tensor=lr_tensor,
            grad_scale=None if grad_scale is None else grad_scale.reshape(1).float(),
            found_inf=None if found_inf is None else found_inf.reshape(1).float(),
            clip_coef=clip_coef,
            ema_decay=float(group["ema_decay"] or 0.0),
        )

    @staticmethod
    def _no_after() -> None:
        pass

    def _op_call(self, group, params, states, grads, masters, masks, emas, scalars):
        """(op, args, kwargs, after): the fused op, its arguments, and what runs after it."""
        raise NotImplementedError


def _traced_lr(lr: float, device: torch.device) -> torch.Tensor:
    """A float lr as the one-element tensor the ops take, when torch.compile traces the step.

    Passed to the op as a float, the lr is a constant of the graph that dynamo guards on: a
    scheduler that writes a new float every step recompiled the step every step. Made a tensor
    here, the float can become a symbolic input: after one recompile (dynamo then marks the
    changed float dynamic) every further lr value runs the same graph. The lr is then rounded to
    float32 (the ops' lr_tensor), as with a Tensor lr, where the eager step derives its step size
    from the double: the compiled step equals the eager one bitwise when the lr is a float32 value
    (e.g. 2**-10), and otherwise differs by that rounding (a relative 3e-8 of the lr; measured
    7e-9 on params after Adam steps with lr 1e-3)."""
    return torch.full((1,), lr, dtype=torch.float32, device=device)


def _state_nbytes(state: Dict[str, Any]) -> int:
    return sum(t.numel() * t.element_size() for t in state.values() if torch.is_tensor(t))


def _missing(state: Dict[str, Any], keys: tuple) -> bool:
    # A loop, not `None in map(...)`: `in` would compare tensors with == None.
    for key in keys:
        if state.get(key) is None:
            return True
    return False


# The ops' Meta kernels run exactly the validators the CPU and CUDA kernels run first, and write
# nothing: redispatching a prepared call to them checks it on the real tensors without running it.
_VALIDATE_ONLY = torch._C.DispatchKeySet(torch._C.DispatchKey.Meta)


def _validate_only(op, args, kwargs) -> None:
    """Raises what `op(*args, **kwargs)` would raise about its arguments, and changes nothing."""
    op.default.redispatch(_VALIDATE_ONLY, *args, **kwargs)
