"""torchspeed.optim.SGD: drop-in replacement for torch.optim.SGD, one fused pass."""

from typing import Optional, Union

import torch

from ._fused import FusedOptimizer, _accept_torch_only_flags, _zeros_like_param


class SGD(FusedOptimizer):
    """SGD with momentum, dampening, nesterov and weight decay; torch.optim.SGD's arguments and
    defaults, plus master_weights, max_grad_norm and ema_decay (see FusedOptimizer). The momentum
    buffer is float32 and named "momentum_buffer" as in torch."""

    _uses_step = False

    def __init__(
        self,
        params,
        lr: Union[float, torch.Tensor] = 1e-3,
        momentum: float = 0.0,
        dampening: float = 0.0,
        weight_decay: float = 0.0,
        nesterov: bool = False,
        *,
        maximize: bool = False,
        foreach: Optional[bool] = None,
        differentiable: bool = False,
        fused: Optional[bool] = None,
        master_weights: Optional[bool] = None,
        max_grad_norm: Optional[float] = None,
        ema_decay: Optional[float] = None,
    ):
        _accept_torch_only_flags("SGD", foreach, fused, differentiable)
        if float(lr) < 0.0:
            raise ValueError(f"torchspeed.optim.SGD: lr must be >= 0, got {float(lr)}")
        if momentum < 0.0:
            raise ValueError(f"torchspeed.optim.SGD: momentum must be >= 0, got {momentum}")
        if weight_decay < 0.0:
            raise ValueError(f"torchspeed.optim.SGD: weight_decay must be >= 0, got {weight_decay}")
        if nesterov and (momentum <= 0 or dampening != 0):
            raise ValueError(
                "torchspeed.optim.SGD: nesterov requires a momentum and zero dampening"
            )
        defaults = dict(
            lr=lr,
            momentum=momentum,
            dampening=dampening,
            weight_decay=weight_decay,
            nesterov=nesterov,
            maximize=maximize,
            foreach=foreach,
            differentiable=differentiable,
            fused=fused,
            master_weights=master_weights,
            max_grad_norm=max_grad_norm,
            ema_decay=ema_decay,
        )
        super().__init__(params, defaults)

    def _group_defaults(self, group):
        group.setdefault("nesterov", False)
        group.setdefault("maximize", False)

    def _buckets(self, group, params):
        # Params without a momentum buffer yet start it from their grad (first_step=True).
        if group["momentum"] == 0:
            return super()._buckets(group, params)
        out = []
        for bucket in super()._buckets(group, params):
            fresh = [p for p in bucket if self.state[p].get("momentum_buffer") is None]
            old = [p for p in bucket if self.state[p].get("momentum_buffer") is not None]
            out += [b for b in (fresh, old) if b]
        return out

    def _check_group(self, group):
        if group["nesterov"] and group["momentum"] != 0 and group["dampening"] != 0:
            raise RuntimeError(
                "torchspeed.optim.SGD: nesterov requires zero dampening, got dampening "
                f"{group['dampening']} in a param group"
            )

    def _fused_step(self, group, params, grad_scale, found_inf, clip_coef):
        momentum = group["momentum"]
        first = momentum != 0 and any(self.state[p].get("momentum_buffer") is None for p in params)
        states, grads, masters, masks, emas = self._common_lists(group, params)
        buffers = []
        if momentum != 0:
            for p, s in zip(params, states):
                if s.get("momentum_buffer") is None:
                    s["momentum_buffer"] = _zeros_like_param(p)
                buffers.append(s["momentum_buffer"])
        try:
            torch.ops.torchspeed.sgd_step_(
                params,
                grads,
                buffers,
                masters,
                masks,
                emas,
                momentum=float(momentum),
                dampening=float(group["dampening"]),
                weight_decay=float(group["weight_decay"]),
                # As torch.optim.SGD: nesterov only means something with momentum.
                nesterov=bool(group["nesterov"]) and momentum != 0,
                maximize=group["maximize"],
                first_step=first,
                **self._scalars(group, grad_scale, found_inf, clip_coef),
            )
        except Exception:
            if first:
                self._drop_buffers(states)
            raise
        # A step skipped by GradScaler must leave fresh buffers fresh: torch starts the buffer
        # from the first grad that is applied. Only the first steps of new params pay this check
        # (a host sync on CUDA).
        if first and found_inf is not None and bool(found_inf.item() != 0):
            self._drop_buffers(states)

    @staticmethod
    def _drop_buffers(states):
        # Buckets are split by fresh/old (see _buckets), so every buffer here was just created.
        for s in states:
            s["momentum_buffer"] = None
