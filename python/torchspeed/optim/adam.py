"""torchspeed.optim.Adam and AdamW: drop-in replacements for torch.optim's, one fused pass."""

from typing import Optional, Tuple, Union

import torch

from ._fused import FusedOptimizer, _accept_torch_only_flags


class Adam(FusedOptimizer):
    """Adam with torch.optim.Adam's arguments and defaults, updated in one fused pass per group.

    Args are those of torch.optim.Adam (lr, betas, eps, weight_decay, amsgrad, foreach, maximize,
    capturable, differentiable, fused, decoupled_weight_decay) plus master_weights,
    max_grad_norm and ema_decay (see FusedOptimizer). foreach/fused/capturable are accepted and
    ignored: the step is always fused, and on CUDA always capturable (lr and step on the device).
    Moments are float32 whatever the param dtype.
    """

    _state_keys = ("exp_avg", "exp_avg_sq")
    _hyperparameters = ("eps", "weight_decay")
    _has_betas = True
    _tensor_lr_foreach_error = True

    def __init__(
        self,
        params,
        lr: Union[float, torch.Tensor] = 1e-3,
        betas: Tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        weight_decay: float = 0.0,
        amsgrad: bool = False,
        *,
        foreach: Optional[bool] = None,
        maximize: bool = False,
        capturable: bool = False,
        differentiable: bool = False,
        fused: Optional[bool] = None,
        decoupled_weight_decay: bool = False,
        master_weights: Optional[bool] = None,
        max_grad_norm: Optional[float] = None,
        ema_decay: Optional[float] = None,
    ):
        _accept_torch_only_flags(type(self).__name__, foreach, fused, differentiable)
        defaults = dict(
            lr=lr,
            betas=betas,
            eps=eps,
            weight_decay=weight_decay,
            amsgrad=amsgrad,
            maximize=maximize,
            foreach=foreach,
            capturable=capturable,
            differentiable=differentiable,
            fused=fused,
            decoupled_weight_decay=decoupled_weight_decay,
            master_weights=master_weights,
            max_grad_norm=max_grad_norm,
            ema_decay=ema_decay,
        )
        super().__init__(params, defaults)

    def _group_defaults(self, group):
        group.setdefault("amsgrad", False)
        group.setdefault("maximize", False)
        group.setdefault("decoupled_weight_decay", isinstance(self, AdamW))

    def _state_keys_for(self, group):
        return self._state_keys + (("max_exp_avg_sq",) if group["amsgrad"] else ())

    def _op_call(self, group, params, states, grads, masters, masks, emas, scalars):
        amsgrad = group["amsgrad"]
        beta1, beta2 = group["betas"]
        args = (
            params,
            grads,
            [s["exp_avg"] for s in states],
            [s["exp_avg_sq"] for s in states],
            [s["max_exp_avg_sq"] for s in states] if amsgrad else [],
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
            amsgrad=amsgrad,
            maximize=group["maximize"],
            decoupled_weight_decay=group["decoupled_weight_decay"],
            **scalars,
        )
        return torch.ops.torchspeed.adam_step_, args, kwargs, self._no_after


class AdamW(Adam):
    """AdamW (decoupled weight decay), torch.optim.AdamW's arguments and defaults; see Adam."""

    def __init__(
        self,
        params,
        lr: Union[float, torch.Tensor] = 1e-3,
        betas: Tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        weight_decay: float = 1e-2,
        amsgrad: bool = False,
        *,
        maximize: bool = False,
        foreach: Optional[bool] = None,
        capturable: bool = False,
        differentiable: bool = False,
        fused: Optional[bool] = None,
        master_weights: Optional[bool] = None,
        max_grad_norm: Optional[float] = None,
        ema_decay: Optional[float] = None,
    ):
        super().__init__(
            params,
            lr,
            betas,
            eps,
            weight_decay,
            amsgrad,
            foreach=foreach,
            maximize=maximize,
            capturable=capturable,
            differentiable=differentiable,
            fused=fused,
            decoupled_weight_decay=True,
            master_weights=master_weights,
            max_grad_norm=max_grad_norm,
            ema_decay=ema_decay,
        )
