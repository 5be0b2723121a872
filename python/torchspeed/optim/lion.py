"""torchspeed.optim.Lion: a fused optimizer torch.optim does not ship."""

from typing import Optional, Tuple, Union

import torch

from . import _lowbit
from ._fused import FusedOptimizer, _arguments


class Lion(_lowbit.LowbitMoments, FusedOptimizer):
    """Lion (Chen et al., "Symbolic Discovery of Optimization Algorithms", 2023):
    ``p *= 1 - lr*wd; p -= lr * sign(lerp(m, g, 1 - beta1)); m = lerp(m, g, 1 - beta2)``.

    Low-bit state (keyword-only, per group; CPU kernels for now), as Adam's (docs/OPTIM.md):
        state_dtype: "fp32" (default: a float32 moment ``exp_avg``, 4 bytes per param), "bf16"
            (bfloat16, written back with stochastic rounding: 2 bytes) or "int8" (blockwise int8
            codes of the signed map, also rounded stochastically, with one float32 absmax per
            block in ``exp_avg_absmax``: about 1.02 bytes).
        min_lowbit_numel: tensors with fewer elements keep a float32 moment under "int8"
            (default 4096).
        state_block: elements per int8 quantization block, a power of two in [8, 4096]
            (default 256).
    load_state_dict() converts every loaded moment to its group's state_dtype;
    torch_state_dict() returns the state with a float32 exp_avg; state_bytes() counts it.
    """

    _state_keys = ("exp_avg",)
    _lowbit_moments = (("exp_avg", True),)
    _has_betas = True

    def __init__(
        self,
        params,
        lr: Union[float, torch.Tensor] = 1e-4,
        betas: Tuple[float, float] = (0.9, 0.99),
        weight_decay: float = 0.0,
        *,
        maximize: bool = False,
        master_weights: Optional[bool] = None,
        max_grad_norm: Optional[float] = None,
        ema_decay: Optional[float] = None,
        state_dtype: str = "fp32",
        min_lowbit_numel: int = _lowbit.DEFAULT_MIN_LOWBIT_NUMEL,
        state_block: int = _lowbit.DEFAULT_STATE_BLOCK,
    ):
        super().__init__(params, _arguments(locals()))

    def _op_call(self, group, params, states, grads, masters, masks, emas, scalars):
        beta1, beta2 = group["betas"]
        moments = [s["exp_avg"] for s in states]
        steps = [s["step"] for s in states]
        kwargs = dict(
            beta1=float(beta1),
            beta2=float(beta2),
            weight_decay=float(group["weight_decay"]),
            maximize=group["maximize"],
            **scalars,
        )
        if moments[0].dtype == torch.float32:  # a bucket has one format
            args = (params, grads, moments, masters, steps, masks, emas)
            return torch.ops.torchspeed.lion_step_, args, kwargs, self._no_after
        absmaxes = [s["exp_avg_absmax"] for s in states] if moments[0].dtype == torch.int8 else []
        args = (params, grads, moments, absmaxes, masters, steps, masks, emas)
        kwargs["state_block"] = group["state_block"]
        return torch.ops.torchspeed.lion_lowbit_step_, args, kwargs, self._no_after
