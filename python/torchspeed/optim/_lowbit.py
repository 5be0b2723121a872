"""Low-bit optimizer moments (``state_dtype="bf16"`` / ``"int8"``): the state layout, the
conversions a load or an export needs, and LowbitMoments, the part of Adam/AdamW, Lion and SGD
that keeps their moments in it (the step itself runs in the fused kernels; the int8 encode /
decode are the native ops lowbit_encode / lowbit_decode, which share the step's element math, so
a loaded state and the step can never disagree).

int8 moments are blockwise: a signed moment (Adam's and Lion's ``exp_avg``, SGD's
``momentum_buffer``) holds int8 codes, an unsigned one (Adam's ``exp_avg_sq``) uint8 codes, and
each has ``<key>_absmax``: one float32 absmax per block of ``state_block`` elements (in the
param's memory order). The maps (kernels/cpu/lowbit_state.h, docs/OPTIM.md) are 8-bit floats
relative to the block's absmax: sign + E4M3 for signed moments, unsigned E5M3 for v.
"""

from typing import Dict, Tuple

import torch

from .._native import native_op
from ._fused import _dense, _same_memory_order

STATE_DTYPES = ("fp32", "bf16", "int8")
#: Moments of tensors with fewer elements stay float32 under state_dtype="int8" (as bitsandbytes'
#: min_8bit_size): their state is small, and their blocks would be mostly padding.
DEFAULT_MIN_LOWBIT_NUMEL = 4096
DEFAULT_STATE_BLOCK = 256
#: An optimizer's low-bit moments: (state key, signed) in its op's order; the first one's dtype
#: is the stored format.
ADAM_MOMENTS = (("exp_avg", True), ("exp_avg_sq", False))


def absmax_key(key: str) -> str:
    """The state key of an int8 moment's per-block absmaxes."""
    return key + "_absmax"


ABSMAX_KEYS = tuple(absmax_key(k) for k, _ in ADAM_MOMENTS)


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
    # Past int64 the op's schema refuses a value without naming it ("Expected a value of type
    # 'int' ... found type 'int'"); the range rules themselves are the validator's.
    for name, value in (("min_lowbit_numel", min_lowbit_numel), ("state_block", state_block)):
        if not -(2**63) <= value < 2**63:
            raise ValueError(
                f"torchspeed.optim.{optimizer}: {prefix}{name} must fit in int64, got {value}"
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


def stored_format(state: Dict, key: str = "exp_avg") -> str:
    """The format of a param's stored moments (`key`: its optimizer's first moment)."""
    m = state.get(key)
    if m is None or m.dtype == torch.float32:
        return "fp32"
    return "bf16" if m.dtype == torch.bfloat16 else "int8"


def _flat(t: torch.Tensor) -> torch.Tensor:
    """The elements in memory order (a dense tensor: any memory format)."""
    return t.as_strided((t.numel(),), (1,))


def dequantize(codes: torch.Tensor, absmax: torch.Tensor, block: int) -> torch.Tensor:
    """float32 moment (flat, memory order) from int8 (signed map) or uint8 (unsigned map) codes
    and per-block absmax: the native lowbit_decode, the step's own map."""
    return _op("lowbit_decode")(_flat(codes), absmax.contiguous(), block)


dequantize_m = dequantize_v = dequantize


def quantize(x: torch.Tensor, signed: bool, block: int):
    """(codes, float32 absmax) of a float32 moment given flat in memory order: int8 codes of the
    signed map, or uint8 of the unsigned one; the native lowbit_encode, the step's own quantizer."""
    return _op("lowbit_encode")(x.float().contiguous(), signed, block)


def quantize_m(m: torch.Tensor, block: int):
    return quantize(m, True, block)


def quantize_v(v: torch.Tensor, block: int):
    return quantize(v, False, block)


def _laid_out(flat: torch.Tensor, p: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """A tensor of `dtype` laid out like p whose memory holds `flat` (memory order)."""
    out = torch.empty_like(p, dtype=dtype, memory_format=torch.preserve_format)
    _flat(out).copy_(flat.to(device=p.device, dtype=dtype))
    return out


def moments_fp32(state: Dict, p: torch.Tensor, block: int, moments=ADAM_MOMENTS) -> Tuple:
    """The moments (in `moments`' order) as float32 tensors laid out like p, from any stored
    format."""
    fmt = stored_format(state, moments[0][0])
    if fmt != "int8":
        return tuple(state[key].float() for key, _ in moments)
    return tuple(
        _laid_out(dequantize(state[key], state[absmax_key(key)], block), p, torch.float32)
        for key, _ in moments
    )


def to_format(state: Dict, p: torch.Tensor, fmt: str, block: int, moments=ADAM_MOMENTS) -> Dict:
    """A copy of `state` whose moments are stored in `fmt` (zeros when absent). bf16 from fp32
    rounds to nearest; int8 quantizes as the kernel does."""
    state = dict(state)
    first = moments[0][0]
    if any(state.get(key) is None for key, _ in moments):
        zeros = torch.zeros_like(p, dtype=torch.float32, memory_format=torch.preserve_format)
        values = [zeros] + [zeros.clone() for _ in moments[1:]]
    elif stored_format(state, first) == fmt and (
        fmt != "int8" or state[absmax_key(first)].numel() == -(-p.numel() // block)
    ):
        return state
    else:
        values = moments_fp32(state, p, block, moments)
    for key, _ in moments:
        state.pop(absmax_key(key), None)
    for (key, signed), value in zip(moments, values):
        if fmt == "fp32":
            state[key] = value
        elif fmt == "bf16":
            state[key] = value.to(torch.bfloat16)
        else:
            codes, absmax = quantize(_flat(value), signed, block)
            state[key] = _laid_out(codes, p, torch.int8 if signed else torch.uint8)
            state[absmax_key(key)] = absmax.to(p.device)
    return state


class LowbitMoments:
    """The low-bit state of a fused optimizer (a mixin before FusedOptimizer in the bases):
    the options state_dtype / min_lowbit_numel / state_block per group (checked by the one C++
    validator), one op call per stored format, the state created and loaded in the group's
    format, and torch_state_dict(). The subclass names its moments in `_lowbit_moments` and
    calls its low-bit op in _op_call when a bucket's moments are not float32."""

    _lowbit_moments: tuple = ()  # ((state key, signed), ...) in the op's order
    # The optimizer's own state format is kept by a load; the loaded moments are converted to it.
    _kept_on_load = ("state_dtype", "min_lowbit_numel", "state_block")
    _has_lowbit_state = False  # set once a param's moments are bf16 / int8

    def _lowbit_active(self, group) -> bool:
        """Whether the group has moments at all (SGD without momentum has none)."""
        return True

    def _group_defaults(self, group):
        group.setdefault("state_dtype", "fp32")
        group.setdefault("min_lowbit_numel", DEFAULT_MIN_LOWBIT_NUMEL)
        group.setdefault("state_block", DEFAULT_STATE_BLOCK)
        super()._group_defaults(group)

    def _check_group(self, group, where):
        check_options(
            type(self).__name__,
            group.get("state_dtype", "fp32"),
            group.get("min_lowbit_numel", DEFAULT_MIN_LOWBIT_NUMEL),
            group.get("state_block", DEFAULT_STATE_BLOCK),
            f"{where}." if where else "",
        )
        super()._check_group(group, where)

    def _format_for(self, group, p) -> str:
        """The format new (or converted) moments of p get under its group's settings."""
        return format_of(group["state_dtype"], p.numel(), group["min_lowbit_numel"])

    def _stored_or_new_format(self, group, p) -> str:
        """The format of p's moments: as stored, or the group's for new ones."""
        first = self._lowbit_moments[0][0]
        s = self.state.get(p)  # .get: a step must not add empty entries to the defaultdict
        if s and s.get(first) is not None:
            return stored_format(s, first)
        return self._format_for(group, p)

    def _buckets(self, group, params):
        buckets = super()._buckets(group, params)
        if not self._lowbit_active(group) or (
            group["state_dtype"] == "fp32" and not self._has_lowbit_state
        ):
            return buckets
        # One op call per stored format (a param keeps the format its moments have; new ones get
        # the group's).
        out = []
        for bucket in buckets:
            by_format = {}
            for p in bucket:
                fmt = self._stored_or_new_format(group, p)
                if fmt == "int8":
                    self._check_stored_blocks(group, p)
                by_format.setdefault(fmt, []).append(p)
            out += list(by_format.values())
        return out

    def _check_stored_blocks(self, group, p):
        """A group's state_block changed under its stored int8 state would reach the op as an
        absmax of the wrong length: say which option and how to change it."""
        s = self.state.get(p)
        absmax = s.get(absmax_key(self._lowbit_moments[0][0])) if s else None
        block = group["state_block"]
        if absmax is None or absmax.numel() == -(-p.numel() // block):
            return
        index = next(i for i, g in enumerate(self.param_groups) if g is group)
        position = next(j for j, q in enumerate(group["params"]) if q is p)
        raise ValueError(
            f"torchspeed.optim.{type(self).__name__}: param_groups[{index}].state_block must be "
            f"the block of its params' stored int8 state, got {block}: "
            f"param_groups[{index}].params[{position}] holds {absmax.numel()} blocks of its "
            f"{p.numel()} elements (ceil({p.numel()} / {block}) = {-(-p.numel() // block)}); "
            "to change state_block, take sd = opt.state_dict(), set it, then "
            "opt.load_state_dict(sd)"
        )

    def _bucket_state_keys(self, group, p):
        keys = super()._bucket_state_keys(group, p)
        if not self._lowbit_active(group) or self._stored_or_new_format(group, p) != "int8":
            return keys
        return keys + tuple(absmax_key(k) for k, _ in self._lowbit_moments)

    def _new_state(self, group, p, old):
        old = dict(old) if old else {}
        if self._lowbit_active(group) and old.get(self._lowbit_moments[0][0]) is None:
            fmt = self._format_for(group, p)
            if fmt != "fp32":
                self._has_lowbit_state = True
                old = to_format(old, p, fmt, group["state_block"], self._lowbit_moments)
        return super()._new_state(group, p, old)

    def __setstate__(self, state):
        super().__setstate__(state)
        first = self._lowbit_moments[0][0]
        self._has_lowbit_state = any(
            stored_format(s, first) != "fp32" for s in self.state.values() if s
        )

    def _load_value(self, key, value, p, where):
        absmaxes = tuple(absmax_key(k) for k, _ in self._lowbit_moments)
        if torch.is_tensor(value) and (
            key in absmaxes
            or (
                any(key == k for k, _ in self._lowbit_moments)
                and value.dtype in (torch.int8, torch.uint8, torch.bfloat16)
            )
        ):
            # Low-bit moments and their absmaxes: dtypes and sizes are checked with the whole
            # state (_load_state), which also lays int8 codes out like the param.
            if value.layout != torch.strided or not _dense(value):
                value = value.contiguous()
            if key in absmaxes:
                return value.detach().to(p.device).clone().reshape(-1)
            if value.numel() != p.numel():
                raise ValueError(
                    f"torchspeed.optim.{type(self).__name__}: {where}['{key}'] must have "
                    f"{p.numel()} elements like its param, got {value.numel()} (shape "
                    f"{tuple(value.shape)})"
                )
            if value.dtype == torch.bfloat16:
                # Per element: the values go to the same logical positions in p's layout.
                out = torch.empty_like(p, dtype=value.dtype, memory_format=torch.preserve_format)
                return out.copy_(value.detach().reshape(p.shape))
            # int8 codes keep their own layout: their blocks run over its memory order.
            return value.detach().to(p.device).clone(memory_format=torch.preserve_format)
        return super()._load_value(key, value, p, where)

    def _saved_block(self, saved, where, own: int) -> int:
        """The state_block the int8 codes of a loaded state were made with: their saved group's
        (`own`, the optimizer's, when the group does not record one)."""
        block = (saved or {}).get("state_block", own)
        check_options(type(self).__name__, "int8", DEFAULT_MIN_LOWBIT_NUMEL, block, f"{where}.")
        return block

    def _load_state(self, group, p, values, where, saved=None, saved_where=""):
        """A loaded state converted to its group's format (see load_state_dict). `saved`: the
        state_dict's group of p, which records the state_block of int8 codes."""
        values = super()._load_state(group, p, values, where)
        name = type(self).__name__
        keys = [k for k, _ in self._lowbit_moments]
        first = values.get(keys[0])
        block = group["state_block"]
        if any(absmax_key(k) in values for k in keys) or (
            torch.is_tensor(first) and first.dtype == torch.int8
        ):
            saved_block = self._saved_block(saved, saved_where, block)
            self._check_int8_state(name, values, p, where, saved_block)
            values = self._int8_laid_out(values, p, saved_block, block)
        elif all(torch.is_tensor(values.get(k)) for k in keys):
            dtypes = [values[k].dtype for k in keys]
            if len(set(dtypes)) > 1:
                raise ValueError(
                    f"torchspeed.optim.{name}: {where}: {' and '.join(keys)} must have one "
                    f"format, got {' and '.join(str(d) for d in dtypes)}"
                )
        if not self._lowbit_active(group) or any(values.get(k) is None for k in keys):
            return values
        fmt = self._format_for(group, p)
        if fmt == "int8" and stored_format(values, keys[0]) != "int8":
            self._check_quantizable(name, values, where)
        if fmt != "fp32":
            self._has_lowbit_state = True
        return to_format(values, p, fmt, block, self._lowbit_moments)

    def _int8_laid_out(self, values, p, saved_block, block) -> Dict:
        """A checked int8 state with its codes laid out like p: copied when they already run over
        p's memory order in blocks of `block`, else decoded (in their own memory order, blocks of
        `saved_block`) to float32 moments laid out like p, which the group's format then takes."""
        copied = saved_block == block and all(
            _same_memory_order(values[k], p) for k, _ in self._lowbit_moments
        )
        values = dict(values)
        for key, _ in self._lowbit_moments:
            codes = values[key]
            if copied:
                values[key] = _laid_out(_flat(codes), p, codes.dtype)
                continue
            flat = dequantize(codes, values.pop(absmax_key(key)), saved_block)
            if codes.shape == p.shape:
                # Decoded in the codes' memory order, then moved to the same logical positions.
                values[key] = torch.zeros_like(
                    p, dtype=torch.float32, memory_format=torch.preserve_format
                ).copy_(_laid_out(flat, codes, torch.float32))
            else:
                values[key] = _laid_out(flat, p, torch.float32)
        return values

    def _check_quantizable(self, name, values, where):
        """float moments that are about to be quantized to int8: lowbit_encode maps NaN to the
        largest code and a negative unsigned moment to 0, so they would come back changed."""
        for key, signed in self._lowbit_moments:
            t = values[key]
            bad = ~torch.isfinite(t) if signed else ~(torch.isfinite(t) & (t >= 0))
            if bool(bad.any()):
                rule = "finite" if signed else "finite and >= 0"
                raise ValueError(
                    f"torchspeed.optim.{name}: {where}['{key}'] must be {rule} to be quantized "
                    f"to int8 (state_dtype='int8'), got {t.reshape(-1)[bad.reshape(-1)][0].item()}"
                    f" at {int(bad.reshape(-1).nonzero()[0])} (in memory order)"
                )

    def _check_int8_state(self, name, values, p, where, block):
        blocks = -(-p.numel() // block)
        want = {}
        for key, signed in self._lowbit_moments:
            want[key] = (torch.int8 if signed else torch.uint8, p.numel())
        for key, _ in self._lowbit_moments:
            want[absmax_key(key)] = (torch.float32, blocks)
        for key, (dtype, numel) in want.items():
            t = values.get(key)
            if not torch.is_tensor(t) or t.dtype != dtype or t.numel() != numel:
                got = f"{t.dtype} with {t.numel()} elements" if torch.is_tensor(t) else repr(t)
                raise ValueError(
                    f"torchspeed.optim.{name}: {where}['{key}'] of an int8 state must be {dtype} "
                    f"with {numel} elements (state_block {block}), got {got}"
                )
        for key, _ in self._lowbit_moments:
            a = values[absmax_key(key)]
            if not bool(torch.isfinite(a).all()) or bool((a < 0).any()):
                raise ValueError(
                    f"torchspeed.optim.{name}: {where}['{absmax_key(key)}'] must hold finite "
                    f"values >= 0 (one absmax per block), got min {a.min().item()} max "
                    f"{a.max().item()}"
                )

    def _torch_state(self, state: Dict) -> Dict:
        """One param's exported state, after its moments are float32 (subclasses drop keys)."""
        return state

    def torch_state_dict(self):
        """The state_dict with float32 moments (dequantized from bf16 / int8), no absmax entries
        and no low-bit group keys: torch.optim's format for Adam/AdamW and SGD (load it into
        torch.optim to leave torchspeed), and what a torchspeed optimizer of any state_dtype
        loads (converting it to its own)."""
        sd = self.state_dict()
        first = self._lowbit_moments[0][0]
        owner = {}
        for saved, group in zip(sd["param_groups"], self.param_groups):
            owner.update((i, (p, group)) for i, p in zip(saved["params"], group["params"]))
            for key in self._kept_on_load:
                saved.pop(key, None)
        for index, s in list(sd["state"].items()):
            if s.get(first) is None or stored_format(s, first) == "fp32":
                continue
            # torch's state_dict shares each param's state dict with the optimizer: copy it.
            s = dict(s)
            p, group = owner[index]
            if stored_format(s, first) == "int8":
                self._check_stored_blocks(group, p)
            values = moments_fp32(s, p, group["state_block"], self._lowbit_moments)
            for (key, _), value in zip(self._lowbit_moments, values):
                s[key] = value
                s.pop(absmax_key(key), None)
            sd["state"][index] = self._torch_state(s)
        return sd
