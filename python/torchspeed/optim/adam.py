"""torchspeed.optim.Adam and AdamW: drop-in replacements for torch.optim's, one fused pass."""

from typing import Optional, Tuple, Union

import torch

from . import _lowbit
from ._fused import FusedOptimizer, _accept_torch_only_flags, _arguments


class Adam(_lowbit.LowbitMoments, FusedOptimizer):
    """Adam with torch.optim.Adam's arguments and defaults, updated in one fused pass per group.

    Args are those of torch.optim.Adam (lr, betas, eps, weight_decay, amsgrad, foreach, maximize,
    capturable, differentiable, fused, decoupled_weight_decay) plus master_weights,
    max_grad_norm and ema_decay (see FusedOptimizer). foreach/fused/capturable are accepted and
    ignored: the step is always fused, and on CUDA always capturable (lr and step on the device).

    Low-bit state (keyword-only, per group; CPU kernels and a CUDA kernel not yet run on a GPU,
    docs/OPTIM.md):
        state_dtype: "fp32" (default: float32 moments, torch.optim's state), "bf16" (bfloat16
            moments written back with stochastic rounding: 4 bytes per param instead of 8) or
            "int8" (blockwise int8/uint8 codes with one float32 absmax per block: about 2.03
            bytes per param). Not with amsgrad.
        min_lowbit_numel: tensors with fewer elements keep float32 moments under "int8"
            (default 4096, as bitsandbytes).
        state_block: elements per int8 quantization block, a power of two in [8, 4096]
            (default 256).
    load_state_dict() converts every loaded moment (torch.optim's float32 state, torchspeed's fp32,
    bf16 or int8 state) to its group's state_dtype; torch_state_dict() returns a torch.optim-
    compatible float32 state_dict; state_bytes() counts the state's memory.
    """

    _state_keys = ("exp_avg", "exp_avg_sq")
    _lowbit_moments = _lowbit.ADAM_MOMENTS
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
        state_dtype: str = "fp32",
        min_lowbit_numel: int = _lowbit.DEFAULT_MIN_LOWBIT_NUMEL,
        state_block: int = _lowbit.DEFAULT_STATE_BLOCK,
    ):
        defaults = _arguments(locals())
        _accept_torch_only_flags(type(self).__name__, foreach, fused, differentiable)
        super().__init__(params, defaults)

    def _group_defaults(self, group):
        group.setdefault("amsgrad", False)
        group.setdefault("maximize", False)
        group.setdefault("decoupled_weight_decay", isinstance(self, AdamW))
        super()._group_defaults(group)  # the low-bit options

    def _check_group(self, group, where):
        super()._check_group(group, where)  # the low-bit options
        state_dtype = group.get("state_dtype", "fp32")
        if state_dtype != "fp32" and group.get("amsgrad"):
            prefix = f"{where}." if where else ""
            raise ValueError(
                f"torchspeed.optim.{type(self).__name__}: {prefix}amsgrad needs "
                f"state_dtype='fp32' (the running maximum of the second moment is kept in "
                f"float32), got {state_dtype!r}"
            )

    def _state_keys_for(self, group):
        return self._state_keys + (("max_exp_avg_sq",) if group["amsgrad"] else ())

    def _op_call(self, group, params, states, grads, masters, masks, emas, scalars):
        if states[0]["exp_avg"].dtype != torch.float32:  # a bucket has one format
            return self._lowbit_call(group, params, states, grads, masters, masks, emas, scalars)
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

    def _lowbit_call(self, group, params, states, grads, masters, masks, emas, scalars):
        int8 = states[0]["exp_avg"].dtype == torch.int8
        beta1, beta2 = group["betas"]
        args = (
            params,
            grads,
            [s["exp_avg"] for s in states],
            [s["exp_avg_sq"] for s in states],
            [s["exp_avg_absmax"] for s in states] if int8 else [],
            [s["exp_avg_sq_absmax"] for s in states] if int8 else [],
            masters,
            [s["step"] for s in states],
            masks,
            emas,
        )
        kwargs = dict(
            state_block=group["state_block"],
            beta1=float(beta1),
            beta2=float(beta2),
            eps=float(group["eps"]),
            weight_decay=float(group["weight_decay"]),
            maximize=group["maximize"],
            decoupled_weight_decay=group["decoupled_weight_decay"],
            **scalars,
        )
        return torch.ops.torchspeed.adam_lowbit_step_, args, kwargs, self._no_after


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
        state_dtype: str = "fp32",
        min_lowbit_numel: int = _lowbit.DEFAULT_MIN_LOWBIT_NUMEL,
        state_block: int = _lowbit.DEFAULT_STATE_BLOCK,
    ):
        # Adam's arguments, with the weight decay decoupled.
        super().__init__(params, **_arguments(locals()), decoupled_weight_decay=True)
