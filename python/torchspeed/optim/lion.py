"""torchspeed.optim.Lion: a fused optimizer torch.optim does not ship."""

from typing import Optional, Tuple, Union

import torch

from ._fused import FusedOptimizer, _arguments


class Lion(FusedOptimizer):
    """Lion (Chen et al., "Symbolic Discovery of Optimization Algorithms", 2023):
    ``p *= 1 - lr*wd; p -= lr * sign(lerp(m, g, 1 - beta1)); m = lerp(m, g, 1 - beta2)``."""

    _state_keys = ("exp_avg",)
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
    ):
        super().__init__(params, _arguments(locals()))

    def _op_call(self, group, params, states, grads, masters, masks, emas, scalars):
        beta1, beta2 = group["betas"]
        args = (
            params,
            grads,
            [s["exp_avg"] for s in states],
            masters,
            [s["step"] for s in states],
            masks,
            emas,
        )
        kwargs = dict(
            beta1=float(beta1),
            beta2=float(beta2),
            weight_decay=float(group["weight_decay"]),
            maximize=group["maximize"],
            **scalars,
        )
        return torch.ops.torchspeed.lion_step_, args, kwargs, self._no_after
