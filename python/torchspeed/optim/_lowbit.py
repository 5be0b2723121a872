"""Low-bit optimizer moments (``state_dtype="bf16"`` / ``"int8"``): the state layout, and the
conversions a load or an export needs (the step itself runs in the fused kernels; the int8
encode / decode are the native ops lowbit_encode / lowbit_decode, which share the step's element
math, so a loaded state and the step can never disagree).

int8 moments are blockwise: ``exp_avg`` holds int8 codes, ``exp_avg_sq`` uint8 codes, and
``exp_avg_absmax`` / ``exp_avg_sq_absmax`` one float32 absmax per block of ``state_block``
elements (in the param's memory order). The maps (kernels/cpu/lowbit_state.h, docs/OPTIM.md)
are 8-bit floats relative to the block's absmax: sign + E4M3 for m, unsigned E5M3 for v.
"""

from typing import Dict

import torch

from .._native import native_op

STATE_DTYPES = ("fp32", "bf16", "int8")
#: Moments of tensors with fewer elements stay float32 under state_dtype="int8" (as bitsandbytes'
#: min_8bit_size): their state is small, and their blocks would be mostly padding.
DEFAULT_MIN_LOWBIT_NUMEL = 4096
DEFAULT_STATE_BLOCK = 256
ABSMAX_KEYS = ("exp_avg_absmax", "exp_avg_sq_absmax")


def _op(name: str):
    return native_op(name, "optim")


def check_options(optimizer: str, state_dtype, min_lowbit_numel, state_block, prefix=""):
    """Validates the state options through the one C++ validator (torchspeed::lowbit_state_format,
    also used by the C++ Options); only the Python types are checked here."""
    for name, value, kind in (
        ("state_dtype", state_dtype, "a str"),
        ("min_lowbit_numel", min_lowbit_numel, "an int"),
        ("state_block", state_block, "an int"),
    ):
        if isinstance(value, bool) or not isinstance(value, str if kind == "a str" else int):
            raise TypeError(
                f"torchspeed.optim.{optimizer}: {prefix}{name} must be {kind}, got "
                f"{type(value).__name__} {value!r}"
            )
    try:
        _op("lowbit_state_format")(state_dtype, 0, min_lowbit_numel, state_block)
    except ValueError as e:
        raise ValueError(f"torchspeed.optim.{optimizer}: {prefix}{_message(e)}") from None
    return state_dtype


def _message(e: Exception) -> str:
    """The C++ check's message without its op prefix and C++ context lines."""
    text = str(e).splitlines()[0]
    return text.split(": ", 1)[1] if text.startswith("torchspeed.") else text


def format_of(state_dtype: str, numel: int, min_lowbit_numel: int) -> str:
    """The format a param's moments get: int8 only from min_lowbit_numel elements on (options
    already checked by check_options; plain Python here, as the step runs it under torch.compile
    and the op returns a str, which Dynamo cannot trace)."""
    if state_dtype == "int8" and numel < min_lowbit_numel:
        return "fp32"
    return state_dtype


def stored_format(state: Dict) -> str:
    """The format of a param's stored moments."""
    m = state.get("exp_avg")
    if m is None or m.dtype == torch.float32:
        return "fp32"
    return "bf16" if m.dtype == torch.bfloat16 else "int8"


def _flat(t: torch.Tensor) -> torch.Tensor:
    """The elements in memory order (a dense tensor: any memory format)."""
    return t.as_strided((t.numel(),), (1,))


def dequantize_m(codes: torch.Tensor, absmax: torch.Tensor, block: int) -> torch.Tensor:
    """float32 first moment (flat, memory order) from int8 codes and per-block absmax: the native
    lowbit_decode, the step's own map."""
    return _op("lowbit_decode")(_flat(codes), absmax.contiguous(), block)


def dequantize_v(codes: torch.Tensor, absmax: torch.Tensor, block: int) -> torch.Tensor:
    return _op("lowbit_decode")(_flat(codes), absmax.contiguous(), block)


def quantize_m(m: torch.Tensor, block: int):
    """(int8 codes, float32 absmax) of a float32 first moment given flat in memory order: the
    native lowbit_encode, the step's own quantizer."""
    return _op("lowbit_encode")(m.float().contiguous(), True, block)


def quantize_v(v: torch.Tensor, block: int):
    return _op("lowbit_encode")(v.float().contiguous(), False, block)


def _laid_out(flat: torch.Tensor, p: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """A tensor of `dtype` laid out like p whose memory holds `flat` (memory order)."""
    out = torch.empty_like(p, dtype=dtype, memory_format=torch.preserve_format)
    _flat(out).copy_(flat.to(device=p.device, dtype=dtype))
    return out


def moments_fp32(state: Dict, p: torch.Tensor, block: int):
    """(exp_avg, exp_avg_sq) as float32 tensors laid out like p, from any stored format."""
    fmt = stored_format(state)
    m, v = state["exp_avg"], state["exp_avg_sq"]
    if fmt == "int8":
        m = _laid_out(dequantize_m(m, state["exp_avg_absmax"], block), p, torch.float32)
        v = _laid_out(dequantize_v(v, state["exp_avg_sq_absmax"], block), p, torch.float32)
        return m, v
    return m.float(), v.float()


def to_format(state: Dict, p: torch.Tensor, fmt: str, block: int) -> Dict:
    """A copy of `state` whose moments are stored in `fmt` (zeros when absent). bf16 from fp32
    rounds to nearest; int8 quantizes as the kernel does."""
    state = dict(state)
    if state.get("exp_avg") is None or state.get("exp_avg_sq") is None:
        m = torch.zeros_like(p, dtype=torch.float32, memory_format=torch.preserve_format)
        v = m.clone()
    elif stored_format(state) == fmt and (
        fmt != "int8" or state["exp_avg_absmax"].numel() == -(-p.numel() // block)
    ):
        return state
    else:
        m, v = moments_fp32(state, p, block)
    for key in ABSMAX_KEYS:
        state.pop(key, None)
    if fmt == "fp32":
        state["exp_avg"], state["exp_avg_sq"] = m, v
    elif fmt == "bf16":
        state["exp_avg"] = m.to(torch.bfloat16)
        state["exp_avg_sq"] = v.to(torch.bfloat16)
    else:
        qm, am = quantize_m(_flat(m), block)
        qv, av = quantize_v(_flat(v), block)
        state["exp_avg"] = _laid_out(qm, p, torch.int8)
        state["exp_avg_sq"] = _laid_out(qv, p, torch.uint8)
        state["exp_avg_absmax"] = am.to(p.device)
        state["exp_avg_sq_absmax"] = av.to(p.device)
    return state
