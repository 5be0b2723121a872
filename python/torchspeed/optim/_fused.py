"""Base class of torchspeed's fused optimizers: state layout, AMP, masters, clipping, masks, EMA.

Each subclass names its per-param fp32 state and calls one fused op per (param group, bucket),
where a bucket is the params of a group that share "has an fp32 master" (and, for SGD, "has a
momentum buffer"). Everything else (unscale, inf-skip, clip, mask, EMA) happens inside the op.
"""

from typing import Any, Dict, Iterable, List, Optional

import torch
from torch.optim import Optimizer

from .. import ops

_LOW_PRECISION = (torch.bfloat16, torch.float16)


def _zeros_like_param(p: torch.Tensor) -> torch.Tensor:
    """float32 zeros in the param's memory layout (contiguous or e.g. channels_last)."""
    return torch.zeros_like(p, dtype=torch.float32, memory_format=torch.preserve_format)


def _like_param(value: torch.Tensor, p: torch.Tensor) -> torch.Tensor:
    """A float32 copy of `value` (the param's shape) on the param's device and in its layout."""
    return _zeros_like_param(p).copy_(value)


_KERNEL_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def _dense(p: torch.Tensor) -> bool:
    """Non-overlapping and dense (contiguous in some memory format), as the ops require."""
    if p.is_contiguous():
        return True
    try:
        from torch._prims_common import is_non_overlapping_and_dense
    except ImportError:  # pragma: no cover - older torch
        return p.is_contiguous(memory_format=torch.channels_last) if p.dim() == 4 else False
    return is_non_overlapping_and_dense(p)


def _accept_torch_only_flags(name: str, foreach, fused, differentiable) -> None:
    # torch.optim arguments that choose an implementation are accepted so that swapping the class
    # is the only change; torchspeed always runs its fused kernels.
    del foreach, fused
    if differentiable:
        raise ValueError(
            f"torchspeed.optim.{name}: differentiable=True is not supported (the fused step is not "
            "differentiable); use torch.optim for higher-order optimization"
        )


class FusedOptimizer(Optimizer):
    """Shared machinery; see the subclasses for the user-facing arguments.

    Extra arguments over torch.optim (all keyword-only, all per param group):
        master_weights: keep fp32 master copies of bfloat16/float16 params and update those
            (default None = on for low-precision params). The rounded master is written to the
            param after each step. Masters are saved in state_dict().
        max_grad_norm: clip the global gradient norm (over all groups, after AMP unscaling) to
            this value in the same pass that checks for inf/NaN (default None = off).
        ema_decay: keep an fp32 EMA copy of every param, updated inside the step (default None).
    """

    # GradScaler hands the step `grad_scale` and `found_inf` tensors instead of unscaling.
    _step_supports_amp_scaling = True
    _state_keys: tuple = ()  # fp32 per-param state tensors, created as zeros
    _uses_step = True

    def __init__(self, params, defaults: Dict[str, Any]):
        defaults.setdefault("master_weights", None)
        defaults.setdefault("max_grad_norm", None)
        defaults.setdefault("ema_decay", None)
        super().__init__(params, defaults)
        self._masks: Dict[torch.Tensor, torch.Tensor] = {}
        self.step_stats = {"steps": 0, "skipped": 0, "seconds": 0.0}

    def __getstate__(self):
        # torch's Optimizer pickles defaults, state and param_groups; masks and stats travel too,
        # so a deepcopy or an unpickled optimizer steps like the original.
        state = super().__getstate__()
        state["_masks"] = self._masks
        state["step_stats"] = self.step_stats
        return state

    def __setstate__(self, state):
        state = dict(state)
        masks = state.pop("_masks", {})
        step_stats = state.pop("step_stats", {"steps": 0, "skipped": 0, "seconds": 0.0})
        super().__setstate__(state)
        self._masks = masks
        self.step_stats = step_stats
        for group in self.param_groups:
            for key in ("master_weights", "max_grad_norm", "ema_decay"):
                group.setdefault(key, None)
            self._group_defaults(group)

    def _group_defaults(self, group: Dict[str, Any]) -> None:
        """Fill keys a torch.optim state_dict's groups may lack."""

    # ---- pruning masks -------------------------------------------------------------------------
    def set_mask(self, param: torch.Tensor, mask: Optional[torch.Tensor]) -> None:
        """Apply a {0,1} mask to `param` inside every step (the param stays zero where mask == 0).

        Pass None to remove it. The mask must have param's number of elements.
        """
        if mask is None:
            self._masks.pop(param, None)
            return
        if mask.numel() != param.numel():
            raise ValueError(
                f"torchspeed.optim: mask must have {param.numel()} elements like the param, "
                f"got {mask.numel()}"
            )
        # Element i of the mask (in the param's logical order) masks element i of the param,
        # stored in the param's memory layout (e.g. channels_last).
        self._masks[param] = _like_param(mask.detach().reshape(param.shape), param)

    # ---- state ---------------------------------------------------------------------------------
    def _wants_master(self, group, p: torch.Tensor) -> bool:
        mw = group["master_weights"]
        return p.dtype in _LOW_PRECISION and (mw is None or bool(mw))

    def _init_state(self, group, p: torch.Tensor) -> Dict[str, Any]:
        state = self.state[p]
        if not state:
            if self._uses_step:
                state["step"] = torch.zeros((), dtype=torch.float32, device=p.device)
            for key in self._state_keys_for(group):
                state[key] = _zeros_like_param(p)
        if self._wants_master(group, p) and "master" not in state:
            # Rebuilt from the param when absent (e.g. loaded from a torch.optim state_dict).
            state["master"] = _like_param(p.detach(), p)
        if group["ema_decay"] is not None and "ema" not in state:
            state["ema"] = _like_param(state.get("master", p).detach(), p)
        return state

    def _state_keys_for(self, group) -> tuple:
        return self._state_keys

    def load_state_dict(self, state_dict: Dict[str, Any]) -> None:
        """Loads torchspeed's or torch.optim's state_dict. torch casts floating state to the param
        dtype; fp32 moments and masters are restored here without that downcast."""
        saved_state = state_dict["state"]
        super().load_state_dict(state_dict)
        index_to_param = {}
        for saved_group, group in zip(state_dict["param_groups"], self.param_groups):
            index_to_param.update(zip(saved_group["params"], group["params"]))
        for index, saved in saved_state.items():
            p = index_to_param.get(index)
            if p is None:
                continue
            state = self.state[p]
            for key, value in saved.items():
                if not torch.is_tensor(value):
                    continue
                if key == "step":
                    state[key] = value.detach().to(device=p.device, dtype=torch.float32)
                    state[key] = state[key].clone().reshape(())
                elif value.numel() == p.numel():
                    state[key] = _like_param(value.detach().reshape(p.shape), p)
                else:
                    # A mismatched shape is kept as is: the step then names it in its error.
                    state[key] = value.detach().to(device=p.device, dtype=torch.float32).clone()

    # ---- step ----------------------------------------------------------------------------------
    def _grads_with_params(self):
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is not None:
                    yield group, p

    def _clip_coef(self, grad_scale: Optional[torch.Tensor]) -> Optional[torch.Tensor]:
        max_norms = {g["max_grad_norm"] for g in self.param_groups if g["max_grad_norm"]}
        if not max_norms:
            return None
        if len(max_norms) > 1:
            raise ValueError(
                "torchspeed.optim: max_grad_norm clips the global norm and must be the same in "
                f"every param group, got {sorted(max_norms)}"
            )
        grads = [p.grad for _, p in self._grads_with_params()]
        if not grads:
            return None
        norm = ops.grad_stats(grads).total_norm
        if grad_scale is not None:
            norm = norm / grad_scale.to(norm.device)  # norm of the unscaled grads
        # torch.nn.utils.clip_grad_norm_'s formula, kept on the device (no sync on CUDA).
        return torch.clamp(max_norms.pop() / (norm + 1e-6), max=1.0).reshape(1)

    @torch.no_grad()
    def step(self, closure=None):
        """One fused update of every param with a gradient. Under torch.amp.GradScaler the
        unscale and the inf/NaN skip happen inside the kernels."""
        import time

        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        start = time.perf_counter()
        grad_scale = getattr(self, "grad_scale", None)
        found_inf = getattr(self, "found_inf", None)
        calls = []
        for index, group in enumerate(self.param_groups):
            params = [p for p in group["params"] if p.grad is not None]
            if params:
                calls += [(index, group, bucket) for bucket in self._buckets(group, params)]
        if len(calls) > 1:
            # Each op checks its own arguments before it changes anything. With several calls
            # (groups, master/no-master buckets), check all of them first, so that a bad later
            # group cannot leave the earlier ones updated.
            for index, group, bucket in calls:
                self._check_call(index, group, bucket)
        clip_coef = self._clip_coef(grad_scale)
        for _, group, bucket in calls:
            self._fused_step(group, bucket, grad_scale, found_inf, clip_coef)
        self.step_stats["steps"] += 1
        if found_inf is not None and found_inf.device.type == "cpu" and found_inf.item() != 0:
            self.step_stats["skipped"] += 1
        self.step_stats["seconds"] += time.perf_counter() - start
        return loss

    def _check_call(self, group_index: int, group, params: List[torch.Tensor]) -> None:
        """What the op would reject, checked in Python before any op of the step runs."""
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
        self._check_group(group)

    def _check_group(self, group) -> None:
        """Group-level hyperparameters the op would reject (subclasses)."""

    def _buckets(self, group, params: List[torch.Tensor]) -> Iterable[List[torch.Tensor]]:
        """Splits a group's params into those with an fp32 master and those without."""
        mw = group["master_weights"]
        if mw is not None and not mw:
            return [params]
        with_master, without = [], []
        for p in params:
            (with_master if p.dtype in _LOW_PRECISION else without).append(p)
        return [b for b in (with_master, without) if b]

    def _common_lists(self, group, params):
        # Hot path (runs every step for every param): one dict lookup per param once state exists.
        state_of = self.state
        wants_master = self._wants_master(group, params[0])  # shared by a bucket
        need_ema = group["ema_decay"] is not None
        states = []
        for p in params:
            s = state_of.get(p)
            if not s or (wants_master and "master" not in s) or (need_ema and "ema" not in s):
                s = self._init_state(group, p)
            states.append(s)
        grads = [p.grad for p in params]
        masters = [s["master"] for s in states] if wants_master else []
        masks = []
        if self._masks and any(p in self._masks for p in params):
            # Params without a mask in a bucket where others have one get an all-ones mask.
            masks = [self._masks.get(p, torch.ones_like(p, dtype=torch.float32)) for p in params]
        emas = [s["ema"] for s in states] if need_ema else []
        return states, grads, masters, masks, emas

    def _scalars(self, group, grad_scale, found_inf, clip_coef) -> Dict[str, Any]:
        lr = group["lr"]
        lr_tensor = None
        if torch.is_tensor(lr):
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

    def _fused_step(self, group, params, grad_scale, found_inf, clip_coef) -> None:
        raise NotImplementedError
