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

    def __setstate__(self, state):
        super().__setstate__(state)
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
        self._masks[param] = mask.detach().to(device=param.device, dtype=torch.float32).contiguous()

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
                state[key] = torch.zeros(p.shape, dtype=torch.float32, device=p.device)
        if self._wants_master(group, p) and "master" not in state:
            # Rebuilt from the param when absent (e.g. loaded from a torch.optim state_dict).
            state["master"] = p.detach().to(torch.float32).clone()
        if group["ema_decay"] is not None and "ema" not in state:
            state["ema"] = (state.get("master", p)).detach().to(torch.float32).clone()
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
                if torch.is_tensor(value):
                    state[key] = value.detach().to(device=p.device, dtype=torch.float32).clone()
                    if key == "step":
                        state[key] = state[key].reshape(())

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
        clip_coef = self._clip_coef(grad_scale)
        for group in self.param_groups:
            params = [p for p in group["params"] if p.grad is not None]
            if not params:
                continue
            for bucket in self._buckets(group, params):
                self._fused_step(group, bucket, grad_scale, found_inf, clip_coef)
        self.step_stats["steps"] += 1
        if found_inf is not None and found_inf.device.type == "cpu" and found_inf.item() != 0:
            self.step_stats["skipped"] += 1
        self.step_stats["seconds"] += time.perf_counter() - start
        return loss

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
            lr_tensor = lr.detach().to(dtype=torch.float32).reshape(1)
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
