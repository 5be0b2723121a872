"""torchspeed.optim.SGD: drop-in replacement for torch.optim.SGD, one fused pass."""

from typing import Optional, Union

import torch

from .. import _C
from . import _lowbit
from ._fused import FusedOptimizer, _accept_torch_only_flags, _arguments


class SGD(_lowbit.LowbitMoments, FusedOptimizer):
    """SGD with momentum, dampening, nesterov and weight decay; torch.optim.SGD's arguments and
    defaults, plus master_weights, max_grad_norm and ema_decay (see FusedOptimizer). The momentum
    buffer is float32 and named "momentum_buffer" as in torch.

    Low-bit momentum buffer (keyword-only, per group, with momentum != 0; CPU kernels for now),
    as Adam's state_dtype (docs/OPTIM.md): "fp32" (default, 4 bytes per param), "bf16" (2 bytes,
    stochastic rounding) or "int8" (blockwise codes of the signed map with one float32 absmax per
    block in ``momentum_buffer_absmax``: about 1.02 bytes); min_lowbit_numel (4096) and
    state_block (256) as Adam's. A low-bit buffer comes with a float32 ``step`` count per param
    (it seeds bf16's stochastic rounding); torch_state_dict() drops it and returns
    torch.optim.SGD's state with a float32 momentum_buffer.
    """

    _uses_step = False
    _hyperparameters = ("momentum", "dampening", "weight_decay")
    _lowbit_moments = (("momentum_buffer", True),)

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
        state_dtype: str = "fp32",
        min_lowbit_numel: int = _lowbit.DEFAULT_MIN_LOWBIT_NUMEL,
        state_block: int = _lowbit.DEFAULT_STATE_BLOCK,
    ):
        defaults = _arguments(locals())
        _accept_torch_only_flags("SGD", foreach, fused, differentiable)
        super().__init__(params, defaults)

    def _group_defaults(self, group):
        group.setdefault("nesterov", False)
        group.setdefault("maximize", False)
        super()._group_defaults(group)  # the low-bit options

    def _lowbit_active(self, group) -> bool:
        return group["momentum"] != 0

    def _state_keys_for(self, group):
        return ("momentum_buffer",) if group["momentum"] != 0 else ()

    def _bucket_state_keys(self, group, p):
        keys = super()._bucket_state_keys(group, p)
        if self._lowbit_active(group) and self._stored_or_new_format(group, p) != "fp32":
            keys += ("step",)
        return keys

    def _new_state(self, group, p, old):
        state = super()._new_state(group, p, old)
        if _lowbit.stored_format(state, "momentum_buffer") != "fp32" and state.get("step") is None:
            state["step"] = torch.zeros((), dtype=torch.float32, device=p.device)
        return state

    def _load_state(self, group, p, values, where, saved=None, saved_where=""):
        values = super()._load_state(group, p, values, where, saved, saved_where)
        if _lowbit.stored_format(values, "momentum_buffer") == "fp32":
            values.pop("step", None)  # only a low-bit buffer has one (torch.optim.SGD's state)
        return values

    def _torch_state(self, state):
        state.pop("step", None)
        return state

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
        super()._check_group(group, where)  # the low-bit options
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
        lowbit = bool(buffers) and buffers[0].dtype != torch.float32  # a bucket has one format
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
        if lowbit:
            int8 = buffers[0].dtype == torch.int8
            absmaxes = [s["momentum_buffer_absmax"] for s in states] if int8 else []
            steps = [s["step"] for s in states]
            args = (params, grads, buffers, absmaxes, masters, steps, masks, emas)
            kwargs["state_block"] = group["state_block"]
            op = torch.ops.torchspeed.sgd_lowbit_step_
        else:
            args = (params, grads, buffers, masters, masks, emas)
            op = torch.ops.torchspeed.sgd_step_
        found_inf = scalars["found_inf"]

        def after():
            # A step skipped by GradScaler must leave fresh buffers fresh: torch starts the
            # buffer from the first grad that is applied. Only the first steps of new params pay
            # this check (a host sync on CUDA).
            if first and found_inf is not None and bool(found_inf.item() != 0):
                for s in states:
                    s["momentum_buffer"] = None

        return op, args, kwargs, after
