"""torchspeed.optim.LAMB: a fused optimizer torch.optim does not ship."""

from typing import Optional, Tuple, Union

import torch

from ._fused import FusedOptimizer, _arguments


class LAMB(FusedOptimizer):
    """LAMB (You et al., "Large Batch Optimization for Deep Learning", 2020) with bias
    correction: ``u = m_hat / (sqrt(v_hat) + eps) + wd * p``, per-tensor trust ratio
    ``||p|| / ||u||`` (1 when either is 0), ``p -= lr * trust * u``."""

    _state_keys = ("exp_avg", "exp_avg_sq")
    _hyperparameters = ("eps", "weight_decay")
    _has_betas = True

    def __init__(
        self,
        params,
        lr: Union[float, torch.Tensor] = 1e-3,
        betas: Tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-6,
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
            [s["exp_avg_sq"] for s in states],
            masters,
            [s["step"] for s in states],
            masks,
            emas,
        )
        kwargs = dict(
            beta1=float(beta1),
            beta2=float(beta2),
            eps=float(group["eps"]),
            weight_decay=float(group["weight_decay"]),
            maximize=group["maximize"],
            **scalars,
        )
        return torch.ops.torchspeed.lamb_step_, args, kwargs, self._no_after
