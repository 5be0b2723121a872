"""Low-bit optimizer moments (``state_dtype="bf16"`` / ``"int8"``): the state layout, and the
conversions a load or an export needs (the step itself runs in the fused kernels).

int8 moments are blockwise: ``exp_avg`` holds int8 codes, ``exp_avg_sq`` uint8 codes, and
``exp_avg_absmax`` / ``exp_avg_sq_absmax`` one float32 absmax per block of ``state_block``
elements (in the param's memory order). The maps (kernels/cpu/lowbit_state.h) are

    m = sign(c) * (|c| / 127) ** 2 * absmax        (int8 c in [-127, 127])
    v = (c / 255) ** 4 * absmax                    (uint8 c in [0, 255])

and quantizing picks the nearest code in the root domain. The functions below compute exactly
what the kernels compute (float32, IEEE-rounded, the same operation order), so a converted state
steps on from the codes the kernel itself would have written.
"""

from typing import Dict

import torch

STATE_DTYPES = ("fp32", "bf16", "int8")
#: Moments of tensors with fewer elements stay float32 under state_dtype="int8" (as bitsandbytes'
#: min_8bit_size): their state is small, and their blocks would be mostly padding.
DEFAULT_MIN_LOWBIT_NUMEL = 4096
DEFAULT_STATE_BLOCK = 256
ABSMAX_KEYS = ("exp_avg_absmax", "exp_avg_sq_absmax")


def check_state_dtype(optimizer: str, value) -> str:
    if not isinstance(value, str):
        raise TypeError(
            f"torchspeed.optim.{optimizer}: state_dtype must be one of {STATE_DTYPES}, got "
            f"{type(value).__name__} {value!r}"
        )
    if value not in STATE_DTYPES:
        raise ValueError(
            f"torchspeed.optim.{optimizer}: state_dtype must be one of {STATE_DTYPES}, got "
            f"{value!r}"
        )
    return value


def check_positive_int(optimizer: str, name: str, value, power_of_two=False, at_most=None):
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(
            f"torchspeed.optim.{optimizer}: {name} must be an int, got {type(value).__name__} "
            f"{value!r}"
        )
    bad = value < 0 or (power_of_two and (value < 8 or value & (value - 1)))
    if bad or (at_most is not None and value > at_most):
        rule = "a power of two in [8, 4096]" if power_of_two else "an int >= 0"
        raise ValueError(f"torchspeed.optim.{optimizer}: {name} must be {rule}, got {value}")


def format_of(state_dtype: str, numel: int, min_lowbit_numel: int) -> str:
    """The format a param's moments get: int8 only from min_lowbit_numel elements on."""
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


def _blocks(flat: torch.Tensor, block: int) -> torch.Tensor:
    pad = (-flat.numel()) % block
    return torch.nn.functional.pad(flat, (0, pad)).reshape(-1, block)


def _inverse(absmax: torch.Tensor) -> torch.Tensor:
    ok = (absmax > 0) & torch.isfinite(absmax)
    return torch.where(ok, 1.0 / torch.where(ok, absmax, torch.ones_like(absmax)), 0.0)


def _reciprocal(x: float) -> torch.Tensor:
    """1 / x rounded once to float32, as the kernels' constant 1.f / x is."""
    return torch.ones((), dtype=torch.float32) / torch.tensor(x, dtype=torch.float32)


def _without_nan(b: torch.Tensor) -> torch.Tensor:
    """NaN lanes as 0 (the kernels' max skips them); inf stays inf."""
    return torch.where(torch.isnan(b), torch.zeros_like(b), b)


def dequantize_m(codes: torch.Tensor, absmax: torch.Tensor, block: int) -> torch.Tensor:
    """float32 first moment (flat, memory order) from int8 codes and per-block absmax."""
    t = _blocks(_flat(codes).float(), block) * _reciprocal(127.0)
    return (t * t.abs() * absmax.reshape(-1, 1)).reshape(-1)[: codes.numel()]


def dequantize_v(codes: torch.Tensor, absmax: torch.Tensor, block: int) -> torch.Tensor:
    t = _blocks(_flat(codes).float(), block) * _reciprocal(255.0)
    t2 = t * t
    return (t2 * t2 * absmax.reshape(-1, 1)).reshape(-1)[: codes.numel()]


def quantize_m(m: torch.Tensor, block: int):
    """(int8 codes, float32 absmax) of a float32 first moment given flat in memory order."""
    b = _blocks(m.float(), block)
    absmax = _without_nan(b.abs()).amax(1)
    q = torch.round(torch.sqrt(b.abs() * _inverse(absmax).reshape(-1, 1)) * 127.0) * torch.sign(b)
    q = q.nan_to_num(-127.0).clamp(-127.0, 127.0)
    return q.reshape(-1)[: m.numel()].to(torch.int8), absmax


def quantize_v(v: torch.Tensor, block: int):
    b = _blocks(v.float(), block)
    absmax = _without_nan(b).amax(1).clamp_min(0.0)
    inv_root = _inverse(torch.sqrt(absmax)).reshape(-1, 1)
    q = torch.round(torch.sqrt(torch.sqrt(b) * inv_root) * 255.0)
    q = q.nan_to_num(0.0).clamp(0.0, 255.0)
    return q.reshape(-1)[: v.numel()].to(torch.uint8), absmax


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
