"""The int8 Linear: per-channel symmetric int8 weights, activations quantized per row at run time,
exact int32 accumulation and a fused fp32 epilogue (scales, bias, optional ReLU).

    qmodel = torchspeed.quant.quantize_dynamic(model)          # swaps every nn.Linear, a copy
    layer = torchspeed.quant.Int8Linear.from_float(linear)     # one layer
    with torch.no_grad():
        y = qmodel(x)                                          # x float32 / bfloat16 / float16

On CPU the weight is packed once for the int8 kernel path the CPU takes (``int8_path()``: scalar,
avx2, avx512, avx512_vnni or amx; ``TORCHSPEED_CPU_ISA`` forces one) and the packed buffer is cached on the
module (rebuilt after a load, a device move or a path change); the state_dict holds the plain
int8 [N, K] weight, its float32 scale and the float32 bias, so it is portable across machines.
On CUDA the kernels take the plain weight. Inference only: no gradient flows through the layer
(a clear error if x requires grad while autograd is recording).
"""

from __future__ import annotations

import copy
from typing import Iterable, Optional

import torch
from torch import nn

from torchspeed._native import native_op

__all__ = ["Int8Linear", "quantize_dynamic", "int8_pack_weight", "int8_linear", "int8_path"]

_FLOAT_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def _op(name: str):
    return native_op(name, "quant")


def int8_path() -> str:
    """The int8 Linear's CPU kernel path now: "scalar", "avx2", "avx512", "avx512_vnni" or
    "amx"."""
    from torchspeed import _C

    return _C.cpu_int8_path()


def int8_pack_weight(w: torch.Tensor) -> torch.Tensor:
    """Packs an int8 [N, K] weight (values in [-127, 127]) for the current CPU int8 path."""
    return _op("int8_pack_weight")(w)


def int8_linear(
    x: torch.Tensor,
    packed_w: torch.Tensor,
    w_scale: torch.Tensor,
    bias: Optional[torch.Tensor] = None,
    relu: bool = False,
) -> torch.Tensor:
    """``act(float(q(x) @ w.T) * (x_scale * w_scale) + bias)`` in x's dtype, x quantized per row.

    packed_w: ``int8_pack_weight(w)`` on CPU, the int8 [N, K] weight itself on CUDA."""
    return _op("int8_linear")(x, packed_w, w_scale, bias, relu)


def quantize_weight(w: torch.Tensor):
    """Per-output-channel symmetric int8: ``scale = absmax / 127`` (1 for an all-zero channel),
    ``q = clamp(round_half_even(w * (1 / scale)), -127, 127)``. Returns (q int8, scale float32)."""
    w = w.detach().float()
    absmax = w.abs().amax(dim=1)
    scale = torch.where(absmax == 0, torch.ones_like(absmax), absmax / 127.0)
    q = torch.clamp(torch.round(w * (1.0 / scale)[:, None]), -127, 127).to(torch.int8)
    return q.contiguous(), scale.contiguous()


class Int8Linear(nn.Module):
    """``nn.Linear`` with an int8 weight (per output channel) and per-row dynamic activation
    quantization; ``relu=True`` fuses a ReLU into the epilogue. Buffers (the state_dict): ``weight``
    int8 [out, in], ``weight_scale`` float32 [out], ``bias`` float32 [out] or None."""

    def __init__(
        self,
        in_features: int,
        out_features: int,
        bias: bool = True,
        relu: bool = False,
        device=None,
    ) -> None:
        super().__init__()
        for name, v in (("in_features", in_features), ("out_features", out_features)):
            if isinstance(v, bool) or not isinstance(v, int):
                raise TypeError(
                    f"torchspeed.quant.Int8Linear: {name} must be an int, got {type(v).__name__}"
                )
            if v < 1:
                raise ValueError(f"torchspeed.quant.Int8Linear: {name} must be >= 1, got {v}")
        self.in_features = int(in_features)
        self.out_features = int(out_features)
        self.relu = bool(relu)
        self.register_buffer(
            "weight", torch.zeros(out_features, in_features, dtype=torch.int8, device=device)
        )
        self.register_buffer(
            "weight_scale", torch.ones(out_features, dtype=torch.float32, device=device)
        )
        if bias:
            self.register_buffer(
                "bias", torch.zeros(out_features, dtype=torch.float32, device=device)
            )
        else:
            self.bias = None
        self._packed = None  # (key, packed uint8 buffer), not in the state_dict

    @classmethod
    def from_float(cls, linear: nn.Linear, relu: bool = False) -> Int8Linear:
        """Quantizes ``linear``'s weight per output channel; the bias stays float32."""
        if not isinstance(linear, nn.Linear):
            raise TypeError(
                f"torchspeed.quant.Int8Linear.from_float: expected an nn.Linear, got "
                f"{type(linear).__name__}"
            )
        w = linear.weight
        m = cls(linear.in_features, linear.out_features, linear.bias is not None, relu, w.device)
        q, scale = quantize_weight(w)
        with torch.no_grad():
            m.weight.copy_(q)
            m.weight_scale.copy_(scale)
            if linear.bias is not None:
                m.bias.copy_(linear.bias.detach().float())
        return m

    def _path(self) -> str:
        return int8_path() if self.weight.device.type == "cpu" else self.weight.device.type

    def _packed_weight(self) -> torch.Tensor:
        w = self.weight
        if w.device.type != "cpu":
            return w.contiguous()
        if torch.compiler.is_compiling():
            # Traced: the packed buffer is a constant of the graph (packed here if not yet); a
            # later path change is caught by the op's header check, which names the fix.
            if self._packed is None:
                return int8_pack_weight(w.contiguous())
            return self._packed[1]
        key = (int8_path(), w.data_ptr(), w._version, tuple(w.shape))
        if self._packed is None or self._packed[0] != key:
            self._packed = (key, int8_pack_weight(w.contiguous()))
        return self._packed[1]

    def repack(self) -> None:
        """Packs the weight again now. Needed only after an edit that autograd's version counter
        does not see (through ``weight.data``); in-place ops, ``load_state_dict``, ``.to()`` and a
        path change (``TORCHSPEED_CPU_ISA``) are detected by themselves."""
        self._packed = None
        if self.weight.device.type == "cpu":
            self._packed_weight()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.requires_grad and torch.is_grad_enabled():
            raise RuntimeError(
                "torchspeed.quant.Int8Linear is inference-only (no gradient through the int8 "
                "kernels): run it under torch.no_grad() / torch.inference_mode(), or detach x"
            )
        if x.dtype not in _FLOAT_DTYPES:
            raise TypeError(
                f"torchspeed.quant.Int8Linear: x must be float32, bfloat16 or float16, got "
                f"{x.dtype}"
            )
        return int8_linear(
            x.contiguous(), self._packed_weight(), self.weight_scale, self.bias, self.relu
        )

    def _apply(self, fn, *args, **kwargs):
        self._packed = None  # a device move (or any buffer transform) repacks at the next call
        out = super()._apply(fn, *args, **kwargs)
        # model.half() / .to(torch.bfloat16) casts float buffers; the kernels take fp32 scales
        # and bias (x and the output follow the input's dtype instead).
        self.weight_scale = self.weight_scale.float()
        if self.bias is not None:
            self.bias = self.bias.float()
        return out

    def _load_from_state_dict(self, *args, **kwargs):
        self._packed = None
        return super()._load_from_state_dict(*args, **kwargs)

    def extra_repr(self) -> str:
        return (
            f"in_features={self.in_features}, out_features={self.out_features}, "
            f"bias={self.bias is not None}, relu={self.relu}, int8_path={self._path()}"
        )


def _matches(name: str, names) -> bool:
    return any(name == n or name.startswith(n + ".") for n in names)


def quantize_dynamic(
    model: nn.Module,
    qconfig_spec: Optional[Iterable] = None,
    dtype: torch.dtype = torch.qint8,
    inplace: bool = False,
    modules_to_not_convert: Optional[Iterable[str]] = None,
) -> nn.Module:
    """Swaps ``nn.Linear`` modules (nested ones too) for ``Int8Linear``, like
    ``torch.ao.quantization.quantize_dynamic(model, {nn.Linear}, dtype=torch.qint8)``.

    qconfig_spec: None (every nn.Linear), or a set of module types (only ``nn.Linear`` is
    supported) and/or qualified module names (convert only those, and the Linears inside them).
    modules_to_not_convert: qualified names whose modules (and their children) stay float.
    Subclasses of nn.Linear (e.g. MultiheadAttention's out_proj) are left alone. inplace=False
    converts a deep copy."""
    if dtype not in (torch.qint8, torch.int8):
        raise ValueError(
            f"torchspeed.quant.quantize_dynamic: only dtype=torch.qint8 is supported, got {dtype}"
        )
    names = None
    if isinstance(qconfig_spec, str):
        qconfig_spec = [qconfig_spec]
    if isinstance(modules_to_not_convert, str):
        modules_to_not_convert = [modules_to_not_convert]
    if qconfig_spec is not None:
        spec = list(qconfig_spec)
        for s in spec:
            if isinstance(s, type) and s is not nn.Linear:
                raise ValueError(
                    f"torchspeed.quant.quantize_dynamic: only nn.Linear can be converted, got "
                    f"{s.__name__}"
                )
            if not isinstance(s, (type, str)):
                raise TypeError(
                    "torchspeed.quant.quantize_dynamic: qconfig_spec must hold module types or "
                    f"qualified names, got {s!r}"
                )
        str_names = [s for s in spec if isinstance(s, str)]
        names = str_names if str_names else None
        if not str_names and nn.Linear not in spec:
            return model if inplace else copy.deepcopy(model)
    skip = list(modules_to_not_convert or [])
    if not inplace:
        model = copy.deepcopy(model)
    if type(model) is nn.Linear:
        raise ValueError(
            "torchspeed.quant.quantize_dynamic: model is itself an nn.Linear; use "
            "Int8Linear.from_float(model)"
        )
    targets = []
    # Every place a module is registered (a Linear shared by two parents is converted in both,
    # to one shared Int8Linear, as torch.ao does).
    for name, module in model.named_modules(remove_duplicate=False):
        if type(module) is not nn.Linear or not name or _matches(name, skip):
            continue
        if names is not None and not _matches(name, names):
            continue
        targets.append(name)
    converted = {}
    for name in targets:
        parent_name, _, child = name.rpartition(".")
        parent = model.get_submodule(parent_name) if parent_name else model
        linear = getattr(parent, child)
        if id(linear) not in converted:
            converted[id(linear)] = Int8Linear.from_float(linear)
        setattr(parent, child, converted[id(linear)])
    return model
