"""What the doctor's rules read off a run, read defensively: a fact that is missing, None or of an
unexpected type reads as unknown (0, empty, None), never raises, so the report at the end of a long
run cannot crash it. Also the run's objects: models unwrapped, loaders and optimizers described.
"""

from __future__ import annotations

import functools
import math
import shutil
import sys
from typing import Any, List, Optional, Tuple

import torch
import torch.fx
from torch import nn

_TORCHSPEED_OPTIMIZERS = ("Adam", "AdamW", "SGD", "Lion", "LAMB")
_IMAGE_EXTENSIONS = ("jpg", "jpeg", "png")
# Wrappers whose .module is the model (DDP, DataParallel, torchspeed's AccumulatingDDP).
_WRAPPERS = ("DistributedDataParallel", "DataParallel", "AccumulatingDDP")


# ---- reading facts safely ------------------------------------------------------------------
def _num(x: Any, default: float = 0.0) -> float:
    """x as a finite float, else default (None, NaN, inf, a string: unknown)."""
    try:
        v = float(x)
    except (TypeError, ValueError, OverflowError):
        return default
    return v if math.isfinite(v) else default


def _step_s(summary: Any) -> float:
    return max(_num(getattr(summary, "step_median_s", 0.0)), 0.0)


def _share(summary: Any, phase: str) -> float:
    phases = getattr(summary, "phases", None)
    stat = phases.get(phase) if isinstance(phases, dict) else None
    return min(max(_num(getattr(stat, "share", 0.0)), 0.0), 1.0)


def _phase_s(summary: Any, phase: str) -> float:
    """The phase's median time, the number the summary table prints beside it (so an estimate
    quotes the table's statistic); share x step_median_s when the median is unknown."""
    phases = getattr(summary, "phases", None)
    stat = phases.get(phase) if isinstance(phases, dict) else None
    median = _num(getattr(stat, "median_s", None), -1.0)
    if median < 0:
        return _share(summary, phase) * _step_s(summary)
    return min(median, _step_s(summary))


def _counter(facts: Any, key: str) -> int:
    counters = getattr(facts, "counters", None)
    if not isinstance(counters, dict):
        return 0
    return max(int(_num(counters.get(key, 0))), 0)


def _per_step(facts: Any, count: int) -> str:
    steps = int(_num(getattr(facts, "steps", 0)))
    return f"{count} over {steps} steps ({count / steps:.1f} per step)" if steps > 0 else str(count)


def _list(facts: Any, name: str) -> list:
    value = getattr(facts, name, None)
    return list(value) if isinstance(value, (list, tuple)) else []


def _cuda(facts: Any) -> bool:
    return getattr(facts, "device_type", "cpu") == "cuda"


def _pct(x: float) -> str:
    return f"{100.0 * x:.0f}%"


def _ms(s: float) -> str:
    return f"{1e3 * s:.1f} ms"


# ---- the run's objects -----------------------------------------------------------------------
def _unwrap(model: Any) -> Any:
    """The model under DDP / DataParallel / AccumulatingDDP / torch.compile wrappers."""
    for _ in range(8):  # bounded: a wrapper chain, never a cycle
        inner = None
        if type(model).__name__ in _WRAPPERS:
            inner = getattr(model, "module", None)
        if inner is None:
            inner = getattr(model, "_orig_mod", None)  # torch.compile's OptimizedModule
        if not isinstance(inner, nn.Module):
            return model
        model = inner
    return model


def _models(facts: Any) -> List[nn.Module]:
    seen, out = set(), []
    for m in _list(facts, "models"):
        m = _unwrap(m)
        if isinstance(m, nn.Module) and id(m) not in seen:
            seen.add(id(m))
            out.append(m)
    return out


def _modules_of(facts: Any, types: Tuple[type, ...]) -> List[Tuple[str, nn.Module]]:
    out = []
    for model in _models(facts):
        try:
            out += [(n, m) for n, m in model.named_modules() if isinstance(m, types)]
        except Exception:  # a user module with a broken named_modules: no facts from it
            continue
    return out


def _accumulation_k(facts: Any) -> Optional[int]:
    """k of a torchspeed AccumulatingDDP among the models, when it exposes one."""
    for m in _list(facts, "models"):
        if type(m).__name__ == "AccumulatingDDP":
            k = int(_num(getattr(m, "accumulation_steps", 0)))
            if k >= 1:
                return k
    return None


class _Loader:
    """What the data rules need from one loader, read off torch's or torchspeed's object."""

    def __init__(self, name: str, torch_backed: bool):
        self.name = name
        self.torch_backed = torch_backed  # batches come from torch's DataLoader (Python workers)
        self.num_workers: Optional[int] = None
        self.pin_memory: Optional[bool] = None
        self.device_prefetch = False
        self.images = False
        self.decode_scaling: Any = None
        self.image_size: Optional[Tuple[int, int]] = None

    def describe(self) -> str:
        parts = [f"num_workers={self.num_workers}", f"pin_memory={self.pin_memory}"]
        parts.append(f"device prefetch={'yes' if self.device_prefetch else 'no'}")
        if self.images:
            parts.append(f"images {self.image_size}, decode_scaling={self.decode_scaling!r}")
        return f"{self.name} ({', '.join(parts)})"


def _loader_info(loader: Any) -> Optional[_Loader]:
    if isinstance(loader, _Loader):  # the record of a loader that is gone
        return loader
    prefetch = False
    for _ in range(4):  # DevicePrefetcher(DataLoader(...)): look through the prefetcher
        if type(loader).__name__ == "DevicePrefetcher" and hasattr(loader, "iterable"):
            dev = getattr(loader, "device", None)
            prefetch = prefetch or getattr(dev, "type", None) == "cuda"
            loader = loader.iterable
        else:
            break
    info: Optional[_Loader] = None
    torch_loader = None
    if isinstance(loader, torch.utils.data.DataLoader):
        info, torch_loader = _Loader("torch.utils.data.DataLoader", True), loader
    elif type(loader).__module__.startswith("torchspeed.") and hasattr(loader, "native"):
        if getattr(loader, "native", False):
            info = _Loader("torchspeed.data.DataLoader (native source)", False)
            opts = getattr(loader, "options", None)
            nw = getattr(opts, "num_workers", None)
            info.num_workers = int(nw) if isinstance(nw, int) else None
            pin = getattr(opts, "pin_memory", None)
            info.pin_memory = bool(pin) if pin is not None else None
            io = getattr(getattr(loader, "dataset", None), "image_options", None)
            fields = getattr(getattr(loader, "dataset", None), "fields", None) or []
            alternatives = [a for f in fields if isinstance(f, str) for a in f.lower().split(";")]
            # No fields = every recognised field of the sample, images included.
            if io is not None and (not fields or any(a in _IMAGE_EXTENSIONS for a in alternatives)):
                info.images = True
                info.decode_scaling = getattr(io, "decode_scaling", None)
                h, w = getattr(io, "height", None), getattr(io, "width", None)
                info.image_size = (h, w) if isinstance(h, int) and isinstance(w, int) else None
        else:
            torch_loader = getattr(loader, "_torch_loader", None)
            if isinstance(torch_loader, torch.utils.data.DataLoader):
                info = _Loader("torchspeed.data.DataLoader (delegating to torch's)", True)
        dev = getattr(loader, "device", None)
        prefetch = prefetch or getattr(dev, "type", None) == "cuda"
    if info is None:
        return None
    if torch_loader is not None:
        nw = getattr(torch_loader, "num_workers", None)
        info.num_workers = int(nw) if isinstance(nw, int) else None
        pin = getattr(torch_loader, "pin_memory", None)
        info.pin_memory = bool(pin) if pin is not None else None
    info.device_prefetch = prefetch
    return info


def _loaders(facts: Any) -> List[_Loader]:
    out = []
    for x in _list(facts, "loaders"):
        try:
            info = _loader_info(x)
        except Exception:  # an exotic loader object: no facts from it
            info = None
        if info is not None:
            out.append(info)
    return out


def _optimizer_kind(opt: Any) -> Optional[str]:
    """'torchspeed', 'fused', 'foreach', 'for-loop' or 'default' (torch picks: foreach on CUDA,
    for-loop on CPU); None for an object that is not a torch.optim.Optimizer."""
    if not isinstance(opt, torch.optim.Optimizer):
        return None
    if type(opt).__module__.startswith("torchspeed."):
        return "torchspeed"
    defaults = getattr(opt, "defaults", None)
    defaults = defaults if isinstance(defaults, dict) else {}
    groups = [g for g in (getattr(opt, "param_groups", None) or []) if isinstance(g, dict)] or [{}]
    fused = [g.get("fused", defaults.get("fused")) for g in groups]
    if all(bool(f) for f in fused):
        return "fused"
    foreach = defaults.get("foreach")
    if foreach is None:
        return "default"
    return "foreach" if foreach else "for-loop"


@functools.cache
def compile_unavailable(device_type: str) -> str:
    """Why torch.compile (inductor) cannot compile a model on this device here, "" when it can:
    no torch.compile, a Python dynamo does not support, or on the CPU no C++ compiler for
    inductor's kernels (it compiles C++ at the first step). Checked once per process."""
    if not hasattr(torch, "compile"):
        return f"torch {torch.__version__} has no torch.compile"
    try:
        import torch._dynamo as dynamo

        if not dynamo.is_dynamo_supported():
            v = sys.version_info
            return f"torch.compile does not support Python {v.major}.{v.minor} in this torch"
    except Exception as e:  # noqa: BLE001 (an import that fails is the answer)
        return f"torch._dynamo failed to import ({type(e).__name__}: {e})"
    if device_type == "cpu":
        try:
            from torch._inductor import cpp_builder

            cxx = cpp_builder.get_cpp_compiler()
        except Exception as e:  # noqa: BLE001
            return f"inductor found no C++ compiler for the CPU ({type(e).__name__}: {e})"
        if not shutil.which(str(cxx)):
            return f"inductor's C++ compiler {cxx!r} is not on PATH (set CXX)"
    return ""
