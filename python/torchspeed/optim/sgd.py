"""torchspeed.optim.SGD: drop-in replacement for torch.optim.SGD, one fused pass."""

from typing import Optional, Union

import torch

from .. import _C
from ._fused import FusedOptimizer, _accept_torch_only_flags, _arguments


class SGD(FusedOptimizer):
    """SGD with momentum, dampening, nesterov and weight decay; torch.optim.SGD's arguments and
    defaults, plus master_weights, max_grad_norm and ema_decay (see FusedOptimizer). The momentum
    buffer is float32 and named "momentum_buffer" as in torch."""

    _uses_step = False
    _hyperparameters = ("momentum", "dampening", "weight_decay")

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
        defaults = _arguments(locals())
        _accept_torch_only_flags("SGD", foreach, fused, differentiable)
        super().__init__(params, defaults)

    def _group_defaults(self, group):
        group.setdefault("nesterov", False)
        group.setdefault("maximize", False)

    def _state_keys_for(self, group):
        return ("momentum_buffer",) if group["momentum"] != 0 else ()

    def _buckets(self, group, params):
        # Params without a momentum buffer yet start it from their grad (first_step=True).
        if group["momentum"] == 0:
            return super()._buckets(group, params)
        out = []
        state_of = self.state  # .get: a step must not add empty entries to the defaultdict
        for bucket in super()._buckets(group, params):
            fresh = [p for p in bucket if state_of.get(p, {}).get("momentum_buffer") is None]
            old = [p for p in bucket if state_of.get(p, {}).get("momentum_buffer") is not None]
            out += [b for b in (fresh, old) if b]
        return out

    def _check_group(self, group, where):
        # torch checks nesterov against the defaults only; in a group, nesterov without momentum
        # is plain SGD, and the kernel needs zero dampening when both are set.
        nesterov = bool(group["nesterov"]) and (not where or group["momentum"] != 0)
        _C.optim.check_nesterov(
            "SGD", nesterov, float(group["momentum"]), float(group["dampening"])
        )

    def _op_call(self, group, params, states, grads, masters, masks, emas, scalars):
        momentum = group["momentum"]
        # The bucket is all fresh or all old (see _buckets); self.state is not committed yet.
        state_of = self.state
        first = momentum != 0 and state_of.get(params[0], {}).get("momentum_buffer") is None
        buffers = [s["momentum_buffer"] for s in states] if momentum != 0 else []
        args = (params, grads, buffers, masters, masks, emas)
        kwargs = dict(
            momentum=float(momentum),
            dampening=float(group["dampening"]),
            weight_decay=float(group["weight_decay"]),
            # As torch.optim.SGD: nesterov only means something with momentum.
            nesterov=bool(group["nesterov"]) and momentum != 0,
            maximize=group["maximize"],
            first_step=first,
            **scalars,
        )
        found_inf = scalars["found_inf"]

        def after():
            # A step skipped by GradScaler must leave fresh buffers fresh: torch starts the
            # buffer from the first grad that is applied. Only the first steps of new params pay
            # this check (a host sync on CUDA).
            if first and found_inf is not None and bool(found_inf.item() != 0):
                for s in states:
                    s["momentum_buffer"] = None

        return torch.ops.torchspeed.sgd_step_, args, kwargs, after
