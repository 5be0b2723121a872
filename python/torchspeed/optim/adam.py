"""torchspeed.optim.Adam and AdamW: drop-in replacements for torch.optim's, one fused pass."""

from typing import Optional, Tuple, Union

import torch

from . import _lowbit
from ._fused import FusedOptimizer, _accept_torch_only_flags, _arguments


class Adam(FusedOptimizer):
    """Adam with torch.optim.Adam's arguments and defaults, updated in one fused pass per group.

    Args are those of torch.optim.Adam (lr, betas, eps, weight_decay, amsgrad, foreach, maximize,
    capturable, differentiable, fused, decoupled_weight_decay) plus master_weights,
    max_grad_norm and ema_decay (see FusedOptimizer). foreach/fused/capturable are accepted and
    ignored: the step is always fused, and on CUDA always capturable (lr and step on the device).

    Low-bit state (keyword-only, per group; CPU kernels for now, docs/OPTIM.md):
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
    _hyperparameters = ("eps", "weight_decay")
    _has_betas = True
    _tensor_lr_foreach_error = True
    _kept_on_load = ("state_dtype", "min_lowbit_numel", "state_block")

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
        group.setdefault("state_dtype", "fp32")
        group.setdefault("min_lowbit_numel", _lowbit.DEFAULT_MIN_LOWBIT_NUMEL)
        group.setdefault("state_block", _lowbit.DEFAULT_STATE_BLOCK)

    def _check_group(self, group, where):
        name = type(self).__name__
        prefix = f"{where}." if where else ""
        state_dtype = _lowbit.check_options(
            name,
            group.get("state_dtype", "fp32"),
            group.get("min_lowbit_numel", _lowbit.DEFAULT_MIN_LOWBIT_NUMEL),
            group.get("state_block", _lowbit.DEFAULT_STATE_BLOCK),
            prefix,
        )
        if state_dtype != "fp32" and group.get("amsgrad"):
            raise ValueError(
                f"torchspeed.optim.{name}: {prefix}amsgrad needs state_dtype='fp32' (the running "
                f"maximum of the second moment is kept in float32), got {state_dtype!r}"
            )

    def _state_keys_for(self, group):
        return self._state_keys + (("max_exp_avg_sq",) if group["amsgrad"] else ())

    # ---- low-bit state ---------------------------------------------------------------------------
    def _format_for(self, group, p) -> str:
        """The format new (or converted) moments of p get under its group's settings."""
        return _lowbit.format_of(group["state_dtype"], p.numel(), group["min_lowbit_numel"])

    def _buckets(self, group, params):
        buckets = super()._buckets(group, params)
        if group["state_dtype"] == "fp32" and not self._has_lowbit_state:
            return buckets
        # One op call per stored format (a param keeps the format its moments have; new ones get
        # the group's).
        state_of = self.state
        out = []
        for bucket in buckets:
            by_format = {}
            for p in bucket:
                s = state_of.get(p)
                fmt = (
                    _lowbit.stored_format(s)
                    if s and s.get("exp_avg") is not None
                    else self._format_for(group, p)
                )
                by_format.setdefault(fmt, []).append(p)
            out += list(by_format.values())
        return out

    def _bucket_state_keys(self, group, p):
        keys = super()._bucket_state_keys(group, p)
        s = self.state.get(p)
        fmt = _lowbit.stored_format(s) if s else self._format_for(group, p)
        return keys + _lowbit.ABSMAX_KEYS if fmt == "int8" else keys

    def _new_state(self, group, p, old):
        old = dict(old) if old else {}
        if old.get("exp_avg") is None:
            fmt = self._format_for(group, p)
            if fmt != "fp32":
                self._has_lowbit_state = True
                old = _lowbit.to_format(old, p, fmt, group["state_block"])
        return super()._new_state(group, p, old)

    def __setstate__(self, state):
        super().__setstate__(state)
        self._has_lowbit_state = any(
            _lowbit.stored_format(s) != "fp32" for s in self.state.values() if s
        )

    def _load_value(self, key, value, p, where):
        if torch.is_tensor(value) and (
            key in _lowbit.ABSMAX_KEYS
            or (
                key in ("exp_avg", "exp_avg_sq")
                and value.dtype in (torch.int8, torch.uint8, torch.bfloat16)
            )
        ):
            # Low-bit moments and their absmaxes: sizes are checked with the whole state
            # (_load_state); codes are copied in memory order, laid out like the param.
            if value.layout != torch.strided or not value.is_contiguous():
                value = value.contiguous()
            if key in _lowbit.ABSMAX_KEYS:
                return value.detach().to(p.device).float().clone().reshape(-1)
            if value.numel() != p.numel():
                raise ValueError(
                    f"torchspeed.optim.{type(self).__name__}: {where}['{key}'] must have "
                    f"{p.numel()} elements like its param, got {value.numel()} (shape "
                    f"{tuple(value.shape)})"
                )
            return _lowbit._laid_out(value.detach().reshape(-1), p, value.dtype)
        return super()._load_value(key, value, p, where)

    def _load_state(self, group, p, values, where):
        """A loaded state converted to its group's format (see load_state_dict)."""
        name = type(self).__name__
        if any(k in values for k in _lowbit.ABSMAX_KEYS) or (
            torch.is_tensor(values.get("exp_avg")) and values["exp_avg"].dtype == torch.int8
        ):
            self._check_int8_state(name, values, p, where, group["state_block"])
        elif torch.is_tensor(values.get("exp_avg")) and torch.is_tensor(values.get("exp_avg_sq")):
            if values["exp_avg"].dtype != values["exp_avg_sq"].dtype:
                raise ValueError(
                    f"torchspeed.optim.{name}: {where}: exp_avg and exp_avg_sq must have one "
                    f"format, got {values['exp_avg'].dtype} and {values['exp_avg_sq'].dtype}"
                )
        if values.get("exp_avg") is None or values.get("exp_avg_sq") is None:
            return values
        fmt = self._format_for(group, p)
        if fmt != "fp32":
            self._has_lowbit_state = True
        return _lowbit.to_format(values, p, fmt, group["state_block"])

    @staticmethod
    def _check_int8_state(name, values, p, where, block):
        blocks = -(-p.numel() // block)
        want = {
            "exp_avg": (torch.int8, p.numel()),
            "exp_avg_sq": (torch.uint8, p.numel()),
            "exp_avg_absmax": (torch.float32, blocks),
            "exp_avg_sq_absmax": (torch.float32, blocks),
        }
        for key, (dtype, numel) in want.items():
            t = values.get(key)
            if not torch.is_tensor(t) or t.dtype != dtype or t.numel() != numel:
                got = f"{t.dtype} with {t.numel()} elements" if torch.is_tensor(t) else repr(t)
                raise ValueError(
                    f"torchspeed.optim.{name}: {where}['{key}'] of an int8 state must be {dtype} "
                    f"with {numel} elements (state_block {block}), got {got}"
                )
        for key in _lowbit.ABSMAX_KEYS:
            a = values[key]
            if not bool(torch.isfinite(a).all()) or bool((a < 0).any()):
                raise ValueError(
                    f"torchspeed.optim.{name}: {where}['{key}'] must hold finite values >= 0 "
                    f"(one absmax per block), got min {a.min().item()} max {a.max().item()}"
                )

    def torch_state_dict(self):
        """A torch.optim.Adam/AdamW-compatible state_dict: float32 exp_avg and exp_avg_sq
        (dequantized from bf16 / int8), no absmax entries, no low-bit group keys. Load it into
        torch.optim.AdamW to leave torchspeed, or into a torchspeed optimizer of any state_dtype
        (which converts it to its own)."""
        sd = self.state_dict()
        owner = {}
        for saved, group in zip(sd["param_groups"], self.param_groups):
            owner.update((i, (p, group)) for i, p in zip(saved["params"], group["params"]))
            for key in self._kept_on_load:
                saved.pop(key, None)
        for index, s in list(sd["state"].items()):
            if s.get("exp_avg") is None or _lowbit.stored_format(s) == "fp32":
                continue
            # torch's state_dict shares each param's state dict with the optimizer: copy it.
            s = sd["state"][index] = dict(s)
            p, group = owner[index]
            s["exp_avg"], s["exp_avg_sq"] = _lowbit.moments_fp32(s, p, group["state_block"])
            for key in _lowbit.ABSMAX_KEYS:
                s.pop(key, None)
        return sd

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
