"""torchspeed.optim.Lion and LAMB: fused optimizers torch.optim does not ship."""

from typing import Optional, Tuple, Union

import torch

from ._fused import FusedOptimizer


def _check_common(name, lr, betas, weight_decay):
    if float(lr) < 0.0:
        raise ValueError(f"torchspeed.optim.{name}: lr must be >= 0, got {float(lr)}")
    for i, b in enumerate(betas):
        if not 0.0 <= float(b) < 1.0:
            raise ValueError(f"torchspeed.optim.{name}: betas[{i}] must be in [0, 1), got {b}")
    if weight_decay < 0.0:
        raise ValueError(f"torchspeed.optim.{name}: weight_decay must be >= 0, got {weight_decay}")


class Lion(FusedOptimizer):
    """Lion (Chen et al., "Symbolic Discovery of Optimization Algorithms", 2023):
    ``p *= 1 - lr*wd; p -= lr * sign(lerp(m, g, 1 - beta1)); m = lerp(m, g, 1 - beta2)``."""

    _state_keys = ("exp_avg",)

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
        _check_common("Lion", lr, betas, weight_decay)
        defaults = dict(
            lr=lr,
            betas=betas,
            weight_decay=weight_decay,
            maximize=maximize,
            master_weights=master_weights,
            max_grad_norm=max_grad_norm,
            ema_decay=ema_decay,
        )
        super().__init__(params, defaults)

    def _fused_step(self, group, params, grad_scale, found_inf, clip_coef):
        states, grads, masters, masks, emas = self._common_lists(group, params)
        beta1, beta2 = group["betas"]
        torch.ops.torchspeed.lion_step_(
            params,
            grads,
            [s["exp_avg"] for s in states],
            masters,
            [s["step"] for s in states],
            masks,
            emas,
            beta1=float(beta1),
            beta2=float(beta2),
            weight_decay=float(group["weight_decay"]),
            maximize=group["maximize"],
            **self._scalars(group, grad_scale, found_inf, clip_coef),
        )


class LAMB(FusedOptimizer):
    """LAMB (You et al., "Large Batch Optimization for Deep Learning", 2020) with bias
    correction: ``u = m_hat / (sqrt(v_hat) + eps) + wd * p``, per-tensor trust ratio
    ``||p|| / ||u||`` (1 when either is 0), ``p -= lr * trust * u``."""

    _state_keys = ("exp_avg", "exp_avg_sq")

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
        _check_common("LAMB", lr, betas, weight_decay)
        defaults = dict(
            lr=lr,
            betas=betas,
            eps=eps,
            weight_decay=weight_decay,
            maximize=maximize,
            master_weights=master_weights,
            max_grad_norm=max_grad_norm,
            ema_decay=ema_decay,
        )
        super().__init__(params, defaults)

    def _fused_step(self, group, params, grad_scale, found_inf, clip_coef):
        states, grads, masters, masks, emas = self._common_lists(group, params)
        beta1, beta2 = group["betas"]
        torch.ops.torchspeed.lamb_step_(
            params,
            grads,
            [s["exp_avg"] for s in states],
            [s["exp_avg_sq"] for s in states],
            masters,
            [s["step"] for s in states],
            masks,
            emas,
            beta1=float(beta1),
            beta2=float(beta2),
            eps=float(group["eps"]),
            weight_decay=float(group["weight_decay"]),
            maximize=group["maximize"],
            **self._scalars(group, grad_scale, found_inf, clip_coef),
        )
