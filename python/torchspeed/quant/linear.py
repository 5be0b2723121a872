"""The int8 Linear: per-channel symmetric int8 weights, activations quantized per row at run time,
exact int32 accumulation and a fused fp32 epilogue (scales, bias, optional ReLU).

    qmodel = torchspeed.quant.quantize_dynamic(model)          # swaps every nn.Linear (dynamic.py)
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

import torch
from torch import nn

from .. import _C
from .._native import area_not_built
from ._ops import int8_linear, int8_pack_weight

__all__ = ["Int8Linear", "int8_path", "quantize_weight"]

_FLOAT_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def int8_path() -> str:
    """The int8 Linear's CPU kernel path now: "scalar", "avx2", "avx512", "avx512_vnni" or
    "amx"."""
    query = getattr(_C, "cpu_int8_path", None)
    if query is None:
        raise area_not_built("torchspeed.quant.int8_path", "quant")
    return query()


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
        if not bool(torch.isfinite(w).all()):
            raise ValueError(
                "torchspeed.quant.Int8Linear.from_float: linear.weight must be finite (has NaN or "
                "inf): its per-channel scale would be NaN or inf"
            )
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
        if not isinstance(x, torch.Tensor):
            raise TypeError(
                f"torchspeed.quant.Int8Linear: x must be a tensor, got {type(x).__name__}"
            )
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

    def _load_from_state_dict(
        self, state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys, error_msgs
    ):
        # Checked before any buffer is written (nn.Module's rule copies each present key, then
        # reports): a float nn.Linear state_dict would otherwise be cast into the int8 weight.
        problems = self._state_dict_problems(state_dict, prefix)
        if problems:
            error_msgs.extend(problems)
            return
        self._packed = None
        super()._load_from_state_dict(
            state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys, error_msgs
        )

    def _state_dict_problems(self, state_dict, prefix: str) -> list:
        """Why this layer cannot load ``state_dict`` (nothing is loaded then), or []."""
        where = f"torchspeed.quant.Int8Linear: state_dict[{prefix + 'weight'!r}]"
        w = state_dict.get(prefix + "weight")
        if isinstance(w, torch.Tensor) and w.is_floating_point():
            return [
                f"{where} is a float weight ({w.dtype}): an Int8Linear loads an Int8Linear's "
                "state_dict (int8 weight, float32 weight_scale); convert an nn.Linear with "
                "Int8Linear.from_float(linear) (or quantize_dynamic(model)) instead"
            ]
        expect = {
            "weight": (torch.int8, (self.out_features, self.in_features)),
            "weight_scale": (torch.float32, (self.out_features,)),
            "bias": (torch.float32, (self.out_features,)),
        }
        problems = []
        for name, (dtype, shape) in expect.items():
            key = prefix + name
            if key not in state_dict:
                continue
            v = state_dict[key]
            if name == "bias" and self.bias is None:
                continue  # reported as an unexpected key by nn.Module's rule
            if not isinstance(v, torch.Tensor) or v.dtype != dtype or tuple(v.shape) != shape:
                got = (
                    f"{v.dtype} of shape {list(v.shape)}"
                    if isinstance(v, torch.Tensor)
                    else (type(v).__name__)
                )
                problems.append(
                    f"torchspeed.quant.Int8Linear: state_dict[{key!r}] must be {dtype} of shape "
                    f"{list(shape)}, got {got}"
                )
                continue
            if name == "weight" and bool((v == -128).any()):
                problems.append(
                    f"torchspeed.quant.Int8Linear: state_dict[{key!r}] must hold values in "
                    "[-127, 127] (symmetric int8), got -128"
                )
        return problems

    def extra_repr(self) -> str:
        return (
            f"in_features={self.in_features}, out_features={self.out_features}, "
            f"bias={self.bias is not None}, relu={self.relu}, int8_path={self._path()}"
        )
