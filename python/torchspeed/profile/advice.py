"""The doctor: ranked advice from a run's step breakdown (breakdown_rules) and static lints read off
its modules, optimizers, loaders and hook counters (lint); advise() combines and ranks them.

    findings = advise(summarize(history), facts)   # largest estimated gain first

Every rule reads its facts defensively: a fact that is missing, None or of an unexpected type
makes that rule quiet, never raise, so the report at the end of a long run cannot crash it.
"""

from __future__ import annotations

import math
import os
import statistics
import warnings
from typing import Any, Dict, List, Optional, Sequence, Tuple

import torch
import torch.fx
from torch import nn

from .summary import PHASES, Finding, RunFacts, StepSummary

# ---- thresholds -----------------------------------------------------------------------------
# TraceML's step diagnostics (profiler.md §1, "Other systems"): input / H2D / residual warn at
# 10 % of the step and are critical at 20 %, and only with >= 2 ms of absolute time, so a large
# share of a sub-millisecond step (noise, nothing to win) stays quiet.
WARN_SHARE = 0.10
CRITICAL_SHARE = 0.20
MIN_PHASE_S = 0.002
# Acceptance criterion C10 (profiler.md §5): no input-bound finding when the input wait is under
# 5 %; the deleted TensorBoard plugin's DataLoader rule fired at 5 % too. A hard floor under every
# share rule, whatever the other thresholds are set to.
NEVER_BELOW_SHARE = 0.05
# AMP pays off only when the step is mostly compute: a 30 % floor (project brief) keeps it off
# input-, copy- or comm-bound steps, where the other rules have the larger gain anyway.
AMP_MIN_COMPUTE_SHARE = 0.30
# Launch-bound: modules this cheap on the host (< 20 µs per call: a handful of kernel launches)
# with the GPU idle much of the step mean the GPU waits for launches. Figure from the brief.
LAUNCH_BOUND_HOST_S_PER_CALL = 20e-6
# GPU idle share from CUDA events (HTA reports idle time as a diagnosis; the deleted TB plugin
# advised at GPU utilization < 50 %, i.e. idle > 50 %: our critical). 30 % = warning (brief).
GPU_IDLE_HIGH_SHARE = 0.30
GPU_IDLE_CRITICAL_SHARE = 0.50
# Straggler: the slowest rank's median step against the other ranks' median step (TraceML and
# HTA name a culprit rank). 1.1x is the brief's figure; 1.25x critical is our choice.
STRAGGLER_RATIO = 1.10
STRAGGLER_CRITICAL_RATIO = 1.25
# Peak memory below a quarter of the device (brief): room to at least double the batch. The TB
# plugin advised a bigger batch too, from low GPU utilization.
BATCH_MEMORY_FRACTION = 0.25

# ---- promises: what each fix is assumed to do to its phase (the estimate's arithmetic) --------
# Prefetching workers leave 10 % of the data wait: the loader runs ahead and the step waits only
# for the occasional late batch. Planning figure (project brief), not measured in this repo;
# bench/RESULTS.md "Loader" shows torchspeed's C++ threads at 2x torch's images/s per core.
DATA_WAIT_WITH_WORKERS = 0.10
# A torch for-loop or foreach optimizer replaced by a fused one: x0.4 of the optimizer phase.
# Conservative: bench/RESULTS.md "Fused AdamW step" measured x0.27 (ResNet-50, 55.7-60.0 ms ->
# 16.4 ms) and x0.20 (GPT-2 small) on CPU.
OPT_LOOP_TO_FUSED = 0.4
# torch's fused=True replaced by torchspeed's: x0.8. Same bench: x0.96-1.04 for a few large
# tensors (both bandwidth-bound), x0.46 for 10,000 small tensors; 0.8 is a middle figure.
OPT_TORCH_FUSED_TO_TORCHSPEED = 0.8
# Pinned memory + non_blocking + a device prefetch a batch ahead hides the copy behind compute,
# leaving 20 % of it (the part that still contends for memory bandwidth). Planning figure (brief).
H2D_OVERLAPPED = 0.2
# torchspeed.dist.AccumulatingDDP all-reduces once per k micro-steps: comm per step / k.
# k = 4 is the suggestion when no k is known (a common accumulation depth; the loss of overlap
# per micro-step is small against a 4x cut).
ACCUM_K = 4
# AMP: bf16/fp16 tensor cores run matmul/conv several times faster than fp32, the rest of the
# step less; x0.5 of forward+backward on GPU, x0.7 on a CPU with native bf16 (AVX-512 BF16 / AMX).
# Planning figures (brief), not measured in this repo.
AMP_CUDA = 0.5
AMP_CPU_BF16 = 0.7
# cudnn.benchmark picks the fastest conv algorithm per shape once; with fixed shapes that saves
# ~10 % of forward+backward on conv nets. Planning figure (brief).
CUDNN_BENCHMARK = 0.9
# CUDA graphs / torch.compile(mode="reduce-overhead") replay a step's launches at once: x0.5 of
# forward+backward when launch-bound. Planning figure (brief).
LAUNCH_BOUND_GRAPHS = 0.5
# An unexplained host stall (a .item(), a sync) found and removed: half the idle time back.
# Planning figure (brief): the stall is unknown, so only part of it is claimed.
GPU_IDLE_STALL = 0.5

_SEVERITY_ORDER = {"critical": 0, "warning": 1, "info": 2}
_LABEL = {
    "data_wait": "data wait",
    "h2d": "host-to-device copy",
    "forward": "forward",
    "backward": "backward",
    "optimizer": "optimizer step",
    "comm": "communication",
    "other": "other (unattributed)",
}
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
    """The phase's time in a median step: share x step_median_s (shares sum to 1, medians don't)."""
    return _share(summary, phase) * _step_s(summary)


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


def _severity(share: float, seconds: float) -> Optional[str]:
    """The TraceML rule: warning at >= 10 % and >= 2 ms, critical at >= 20 %; never under 5 %."""
    if share < NEVER_BELOW_SHARE or share < WARN_SHARE or seconds < MIN_PHASE_S:
        return None
    return "critical" if share >= CRITICAL_SHARE else "warning"


def _phase_title(summary: Any, phase: str) -> str:
    return (
        f"{_LABEL[phase]} is {_pct(_share(summary, phase))} of the step "
        f"({_ms(_phase_s(summary, phase))} of {_ms(_step_s(summary))})"
    )


def _estimated(
    rule: str,
    severity: str,
    title: str,
    fix: str,
    detail: str,
    step_s: float,
    saved_s: Optional[float],
) -> Finding:
    """A breakdown finding; saved_s None = no honest estimate (est_step_s None, gain 0)."""
    if saved_s is None or step_s <= 0:
        return Finding(rule, severity, title, fix, detail, None, 0.0, "breakdown")
    saved_s = min(max(saved_s, 0.0), step_s)
    return Finding(rule, severity, title, fix, detail, step_s - saved_s, saved_s, "breakdown")


def _lint(rule: str, severity: str, title: str, fix: str, detail: str = "") -> Finding:
    return Finding(rule, severity, title, fix, detail, None, 0.0, "lint")


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


def _optimizer_factor(kind: str) -> float:
    if kind == "torchspeed":
        return 1.0
    return OPT_TORCH_FUSED_TO_TORCHSPEED if kind == "fused" else OPT_LOOP_TO_FUSED


# ---- breakdown rules -------------------------------------------------------------------------
def _data_wait(summary: Any, facts: Any) -> List[Finding]:
    step, share, t = _step_s(summary), _share(summary, "data_wait"), _phase_s(summary, "data_wait")
    sev = _severity(share, t)
    if sev is None:
        return []
    loaders = _loaders(facts)
    saved = t * (1.0 - DATA_WAIT_WITH_WORKERS)
    seen = "; ".join(x.describe() for x in loaders) or "no loader was seen by the hooks"
    detail = f"loaders: {seen}."
    cores = os.cpu_count() or 1
    no_workers = [x for x in loaders if x.torch_backed and x.num_workers == 0]
    native_images = [x for x in loaders if not x.torch_backed and x.images]
    unpinned = [x for x in loaders if x.torch_backed and x.pin_memory is False]
    if no_workers:
        fix = (
            "load in background workers: torchspeed.data.DataLoader(..., num_workers=N) (or "
            f"torch's DataLoader(num_workers=N)), N up to the free cores ({cores} here)"
        )
    elif native_images:
        x = native_images[0]
        fix = (
            f"more C++ decode threads: torchspeed.data.DataLoader(..., num_workers="
            f"{max(2 * (x.num_workers or 1), 2)}) (now {x.num_workers}), and for small outputs "
            'WebDataset(..., decode_scaling="fast") (1.2-1.7x images/s at <= 112 px, '
            "bench/RESULTS.md)"
        )
    elif _cuda(facts) and unpinned:
        x = unpinned[0]
        fix = (
            f"pin_memory=True and .to(device, non_blocking=True), and more workers: "
            f"DataLoader(..., num_workers={max(2 * (x.num_workers or 1), 2)}) "
            f"(now {x.num_workers})"
        )
    elif loaders:
        x = loaders[0]
        more = f"num_workers={max(2 * (x.num_workers or 1), 2)}) (now {x.num_workers})"
        if x.torch_backed:
            fix = (
                f"more workers: DataLoader(..., {more}, or torchspeed.data.DataLoader over a "
                "native source (WebDataset / NpySource / TensorSource: C++ threads, no Python "
                "per sample)"
            )
        else:
            fix = f"more C++ threads: torchspeed.data.DataLoader(..., {more}"
    else:
        fix = "prefetch batches in workers: torchspeed.data.DataLoader(..., num_workers=N)"
    detail += (
        f" Estimate: prefetching workers leave {_pct(DATA_WAIT_WITH_WORKERS)} of the data wait "
        f"({_ms(t)} -> {_ms(t * DATA_WAIT_WITH_WORKERS)})."
    )
    return [
        _estimated("data_wait", sev, _phase_title(summary, "data_wait"), fix, detail, step, saved)
    ]


def _optimizer(summary: Any, facts: Any) -> List[Finding]:
    step, share, t = _step_s(summary), _share(summary, "optimizer"), _phase_s(summary, "optimizer")
    sev = _severity(share, t)
    if sev is None:
        return []
    opts = [(o, _optimizer_kind(o)) for o in _list(facts, "optimizers")]
    opts = [(o, k) for o, k in opts if k is not None]
    title = _phase_title(summary, "optimizer")
    if not opts:
        fix = "a fused optimizer: torchspeed.optim.AdamW / SGD / Adam / Lion / LAMB (drop-in)"
        detail = (
            "No optimizer was seen by the hooks, so its implementation and the gain are unknown."
        )
        return [_estimated("optimizer", sev, title, fix, detail, step, None)]
    kinds = ", ".join(f"{type(o).__module__}.{type(o).__name__} ({k})" for o, k in opts)
    if all(k == "torchspeed" for _, k in opts):
        fix = (
            "already torchspeed's fused optimizer: amortize the step over more samples (a larger "
            "batch, or torchspeed.dist.AccumulatingDDP(model, k=...) to step every k micro-steps)"
        )
        return [_estimated("optimizer", "info", title, fix, f"optimizers: {kinds}.", step, None)]
    slow = [o for o, k in opts if k != "torchspeed"]
    names = sorted(
        {type(o).__name__ if type(o).__name__ in _TORCHSPEED_OPTIMIZERS else "AdamW" for o in slow}
    )
    fix = (
        " / ".join(f"torchspeed.optim.{n}" for n in names)
        + " (drop-in, fused: one kernel per bucket of params)"
    )
    # Several optimizers: assume the phase splits evenly between them (their times are not known).
    factor = sum(_optimizer_factor(k) for _, k in opts) / len(opts)
    detail = (
        f"optimizers: {kinds}. Estimate: x{OPT_LOOP_TO_FUSED} for a for-loop/foreach torch "
        f"optimizer, x{OPT_TORCH_FUSED_TO_TORCHSPEED} for torch fused=True (bench/RESULTS.md); "
        f"here x{factor:.2f} ({_ms(t)} -> {_ms(t * factor)})."
    )
    return [_estimated("optimizer", sev, title, fix, detail, step, t * (1.0 - factor))]


def _h2d(summary: Any, facts: Any) -> List[Finding]:
    step, share, t = _step_s(summary), _share(summary, "h2d"), _phase_s(summary, "h2d")
    sev = _severity(share, t)
    if sev is None:
        return []
    fix = (
        "pin_memory=True and .to(device, non_blocking=True), copied a batch ahead: "
        "torchspeed.data.DevicePrefetcher(loader, device) or torchspeed.data.DataLoader(..., "
        "device=...)"
    )
    loaders = _loaders(facts)
    detail = (
        f"pageable copies: {_per_step(facts, _counter(facts, 'h2d_pageable'))}; blocking copies: "
        f"{_per_step(facts, _counter(facts, 'h2d_blocking'))}; loaders: "
        f"{'; '.join(x.describe() for x in loaders) or 'none seen'}. Estimate: an overlapped copy "
        f"leaves {_pct(H2D_OVERLAPPED)} of it ({_ms(t)} -> {_ms(t * H2D_OVERLAPPED)})."
    )
    saved = t * (1.0 - H2D_OVERLAPPED)
    return [_estimated("h2d", sev, _phase_title(summary, "h2d"), fix, detail, step, saved)]


def _comm(summary: Any, facts: Any) -> List[Finding]:
    step, share, t = _step_s(summary), _share(summary, "comm"), _phase_s(summary, "comm")
    sev = _severity(share, t)
    if sev is None:
        return []
    k_now = _accumulation_k(facts)
    k_new = 2 * k_now if k_now else ACCUM_K
    ratio = (k_now or 1) / k_new  # comm per step goes from 1/k_now to 1/k_new of a sync per step
    if k_now:
        fix = (
            f"a larger k: torchspeed.dist.AccumulatingDDP(model, accumulation_steps={k_new}) "
            f"(now {k_now})"
        )
    else:
        fix = (
            "all-reduce every k micro-steps: "
            f"torchspeed.dist.AccumulatingDDP(model, accumulation_steps={k_new}) "
            "(or a larger batch per rank)"
        )
    world = int(_num(getattr(summary, "world_size", 1), 1))
    detail = (
        f"world_size={world}, ddp={bool(getattr(facts, 'ddp', False))}. Estimate: comm / "
        f"{k_new / (k_now or 1):g} ({_ms(t)} -> {_ms(t * ratio)})."
    )
    title = _phase_title(summary, "comm")
    return [_estimated("comm", sev, title, fix, detail, step, t * (1.0 - ratio))]


def _compute(summary: Any) -> Tuple[float, float]:
    return (
        _share(summary, "forward") + _share(summary, "backward"),
        _phase_s(summary, "forward") + _phase_s(summary, "backward"),
    )


def _low_precision_model(facts: Any) -> bool:
    """A model whose floating-point parameters are all bf16/fp16 (no autocast needed)."""
    for model in _models(facts):
        try:
            dtypes = {p.dtype for p in model.parameters() if p.is_floating_point()}
        except Exception:  # a user module with a broken parameters(): no facts from it
            continue
        if dtypes and dtypes <= {torch.bfloat16, torch.float16}:
            return True
    return False


def _amp(summary: Any, facts: Any) -> List[Finding]:
    if getattr(facts, "autocast_used", False) is not False:  # used, or unknown: quiet
        return []
    cuda, cpu_bf16 = _cuda(facts), bool(getattr(facts, "bf16_capable_cpu", False))
    if not cuda and not (getattr(facts, "device_type", None) == "cpu" and cpu_bf16):
        return []
    if _low_precision_model(facts):  # model.bfloat16() / .half(): already runs in 16 bits
        return []
    step = _step_s(summary)
    share, t = _compute(summary)
    if share < AMP_MIN_COMPUTE_SHARE or t < MIN_PHASE_S:
        return []
    factor = AMP_CUDA if cuda else AMP_CPU_BF16
    where = "cuda" if cuda else "cpu"
    title = (
        f"forward+backward are {_pct(share)} of the step ({_ms(t)} of {_ms(step)}) in full "
        "precision: no torch.autocast was seen"
    )
    fix = f'with torch.autocast("{where}", dtype=torch.bfloat16): around forward and loss'
    if cuda:
        fix += " (or float16 with torch.amp.GradScaler)"
    detail = (
        f"device={where}{', CPU with native bf16' if not cuda else ''}. Estimate: x{factor} of "
        f"forward+backward ({_ms(t)} -> {_ms(t * factor)})."
    )
    return [_estimated("amp", "warning", title, fix, detail, step, t * (1.0 - factor))]


def _cudnn_benchmark(summary: Any, facts: Any) -> List[Finding]:
    if not _cuda(facts) or getattr(facts, "fixed_input_shapes", None) is not True:
        return []
    if getattr(facts, "cudnn_benchmark", True) is not False:
        return []
    convs = _modules_of(facts, (nn.modules.conv._ConvNd,))
    step = _step_s(summary)
    share, t = _compute(summary)
    if not convs or share < WARN_SHARE or t < MIN_PHASE_S:
        return []
    title = (
        f"cudnn.benchmark is off with fixed input shapes and {len(convs)} convolutions "
        f"(forward+backward {_ms(t)}, {_pct(share)} of the step)"
    )
    fix = "torch.backends.cudnn.benchmark = True before the first step"
    detail = (
        f"convs e.g. {', '.join(n or '(root)' for n, _ in convs[:3])}. Estimate: x{CUDNN_BENCHMARK}"
        f" of forward+backward ({_ms(t)} -> {_ms(t * CUDNN_BENCHMARK)})."
    )
    return [
        _estimated("cudnn_benchmark", "info", title, fix, detail, step, t * (1 - CUDNN_BENCHMARK))
    ]


def _idle(facts: Any) -> Optional[float]:
    x = getattr(facts, "gpu_idle_share", None)
    if x is None:
        return None
    v = _num(x, -1.0)
    return min(v, 1.0) if v >= 0 else None


def _launch_bound(summary: Any, facts: Any) -> List[Finding]:
    idle = _idle(facts)
    per_call = _num(getattr(facts, "host_s_per_module_call", None), -1.0)
    if not _cuda(facts) or idle is None or idle < GPU_IDLE_HIGH_SHARE:
        return []
    if not 0.0 < per_call < LAUNCH_BOUND_HOST_S_PER_CALL:
        return []
    step = _step_s(summary)
    share, t = _compute(summary)
    if t < MIN_PHASE_S:
        return []
    sev = "critical" if idle >= GPU_IDLE_CRITICAL_SHARE else "warning"
    title = (
        f"launch-bound: the GPU is idle {_pct(idle)} of the step while modules take "
        f"{1e6 * per_call:.1f} µs each on the host"
    )
    fix = (
        'torch.compile(model, mode="reduce-overhead") (CUDA graphs) or '
        "torch.cuda.make_graphed_callables: replay the step's many small kernels in one launch"
    )
    calls = _counter(facts, "module_calls")
    detail = (
        f"module calls: {_per_step(facts, calls)}. Estimate: x{LAUNCH_BOUND_GRAPHS} of "
        f"forward+backward ({_ms(t)} -> {_ms(t * LAUNCH_BOUND_GRAPHS)})."
    )
    saved = t * (1.0 - LAUNCH_BOUND_GRAPHS)
    return [_estimated("launch_bound", sev, title, fix, detail, step, saved)]


def _gpu_idle(summary: Any, facts: Any, explained: Sequence[Finding]) -> List[Finding]:
    idle = _idle(facts)
    if idle is None or idle < GPU_IDLE_HIGH_SHARE:
        return []
    rules = {f.rule for f in explained}
    if "launch_bound" in rules:
        return []
    # Data wait and a blocking copy idle the GPU for a known reason; their rules already say so.
    blamed = [p for p in ("data_wait", "h2d") if p in rules]
    unexplained = idle - sum(_share(summary, p) for p in blamed)
    step = _step_s(summary)
    if unexplained < GPU_IDLE_HIGH_SHARE or unexplained * step < MIN_PHASE_S:
        return []
    sev = "critical" if unexplained >= GPU_IDLE_CRITICAL_SHARE else "warning"
    title = f"the GPU is idle {_pct(idle)} of the step ({_ms(idle * step)} of {_ms(step)})"
    if blamed:
        title += f", {_pct(unexplained)} of it not explained by {' or '.join(blamed)}"
    fix = (
        "find the host stall: a .item(), .cpu(), .tolist() or print of a CUDA tensor, or "
        "torch.cuda.synchronize(), in the step makes the host wait; move it out or do it every N "
        "steps"
    )
    detail = (
        f"Estimate: half of the unexplained idle time back (x{GPU_IDLE_STALL}: "
        f"{_ms(unexplained * step)} -> {_ms(unexplained * step * GPU_IDLE_STALL)})."
    )
    saved = unexplained * step * (1.0 - GPU_IDLE_STALL)
    return [_estimated("gpu_idle", sev, title, fix, detail, step, saved)]


def _straggler(summary: Any) -> List[Finding]:
    ranks = getattr(summary, "ranks", None)
    if not isinstance(ranks, (list, tuple)) or len(ranks) < 2:
        return []
    # With synchronous collectives every rank's step takes as long as the slowest rank's: the
    # others wait, and that wait shows up in their communication phase. So ranks are compared by
    # their busy time, the step minus communication (a missing rank reads as 0 s: never slowest).
    busy = [max(_step_s(r) - _phase_s(r, "comm"), 0.0) for r in ranks]
    slow = max(range(len(busy)), key=lambda i: busy[i])
    others = [i for i in range(len(ranks)) if i != slow and busy[i] > 0]
    if not others:
        return []
    # The other ranks' median, not all ranks': with 2 ranks the median of all would average the
    # straggler itself in.
    typical = statistics.median(busy[i] for i in others)
    ratio = busy[slow] / typical
    if ratio < STRAGGLER_RATIO:
        return []
    work = [p for p in PHASES if p != "comm"]
    excess = {
        p: _phase_s(ranks[slow], p) - statistics.median(_phase_s(ranks[i], p) for i in others)
        for p in work
    }
    phase = max(work, key=lambda p: excess[p])
    gap = busy[slow] - typical
    sev = "critical" if ratio >= STRAGGLER_CRITICAL_RATIO else "warning"
    title = (
        f"rank {slow} is a straggler: it works {ratio:.2f}x as long per step as the other ranks "
        f"({_ms(busy[slow])} vs {_ms(typical)} outside communication), most of it in "
        f"{_LABEL[phase]}"
    )
    if phase == "data_wait":
        fix = (
            f"rank {slow}'s input: uneven shards or a slower disk; check its loader "
            "(num_workers, shard sizes with torchspeed.data.DataLoader(rank=, world_size=))"
        )
    else:
        fix = (
            f"rank {slow}'s host or device: CPU contention, another process on its GPU, "
            "thermal throttling, or more work per step (uneven batch or sequence lengths)"
        )
    mine = _phase_s(ranks[slow], phase)
    detail = (
        f"rank {slow}'s {_LABEL[phase]} is {_ms(mine)} against the other ranks' median "
        f"{_ms(mine - excess[phase])} (+{_ms(excess[phase])}); the other ranks wait for it, "
        "in communication. Estimate: every rank's step shrinks by that excess, at most "
        "by the gap to the typical rank."
    )
    saved = min(max(excess[phase], 0.0), gap)
    return [_estimated("straggler", sev, title, fix, detail, _step_s(summary), saved)]


def _breakdown(summary: Any, facts: Any) -> List[Finding]:
    if summary is None:
        return []
    facts = facts if facts is not None else RunFacts()
    out: List[Finding] = []
    if _step_s(summary) > 0 and int(_num(getattr(summary, "steps", 0))) > 0:
        for rule in (_data_wait, _optimizer, _h2d, _comm, _amp, _cudnn_benchmark, _launch_bound):
            out += rule(summary, facts)
        out += _gpu_idle(summary, facts, out)
    out += _straggler(summary)
    return out


def breakdown_rules(summary: StepSummary, facts: RunFacts) -> List[Finding]:
    """Findings from the step times (kind "breakdown"), each with the estimated step after its
    fix where the promise is known; unranked. Nothing for a summary without steps."""
    return _breakdown(summary, facts)


# ---- lints -----------------------------------------------------------------------------------
def _is_conv(m: Any) -> bool:
    return isinstance(m, nn.modules.conv._ConvNd) and getattr(m, "bias", None) is not None


def _is_bn(m: Any) -> bool:
    return isinstance(m, nn.modules.batchnorm._BatchNorm)


def _conv_bn_fx(model: nn.Module) -> Optional[List[Tuple[str, str]]]:
    """(conv, bn) module paths where the traced graph feeds a biased conv only into a BN; None
    when the model cannot be traced (data-dependent control flow, unsupported ops)."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            graph = torch.fx.symbolic_trace(model).graph
    except Exception:
        return None
    pairs = []
    for node in graph.nodes:
        if node.op != "call_module" or not node.args:
            continue
        src = node.args[0]
        if not isinstance(src, torch.fx.Node) or src.op != "call_module" or len(src.users) != 1:
            continue  # a conv output used elsewhere too (a residual) needs its bias
        try:
            bn, conv = model.get_submodule(node.target), model.get_submodule(src.target)
        except (AttributeError, TypeError):
            continue
        if _is_bn(bn) and _is_conv(conv):
            pairs.append((str(src.target), str(node.target)))
    return pairs


def _conv_bn_sequential(model: nn.Module) -> List[Tuple[str, str]]:
    """The same, from the order of children of nn.Sequential containers (the untraceable case)."""
    pairs = []
    for name, m in model.named_modules():
        if not isinstance(m, nn.Sequential):
            continue
        children = list(m.named_children())
        for (a, ma), (b, mb) in zip(children, children[1:]):
            if _is_conv(ma) and _is_bn(mb):
                prefix = f"{name}." if name else ""
                pairs.append((prefix + a, prefix + b))
    return pairs


def _lint_conv_bias(facts: Any) -> List[Finding]:
    found = []
    for model in _models(facts):
        pairs = _conv_bn_fx(model)
        how = "traced with torch.fx"
        if pairs is None:
            try:
                pairs, how = (
                    _conv_bn_sequential(model),
                    "from the nn.Sequential order: fx could not trace it",
                )
            except Exception:
                pairs = []
        found += [(type(model).__name__, c, b, how) for c, b in pairs]
    if not found:
        return []
    shown = "; ".join(f"{m}: {c} -> {b} ({how})" for m, c, b, how in found[:10])
    more = f"; and {len(found) - 10} more" if len(found) > 10 else ""
    return [
        _lint(
            "conv_bias_before_bn",
            "info",
            f"{len(found)} convolution(s) with bias=True feed straight into a BatchNorm",
            "nn.Conv2d(..., bias=False) before a BatchNorm: its mean subtraction cancels the bias "
            "(a wasted add, gradient and optimizer state)",
            shown + more,
        )
    ]


def _lint_counters(facts: Any) -> List[Finding]:
    out = []
    n = _counter(facts, "zero_grad_keep")
    if n:
        out.append(
            _lint(
                "zero_grad_keep",
                "info",
                f"zero_grad(set_to_none=False) calls: {_per_step(facts, n)}",
                "optimizer.zero_grad(set_to_none=True) (the default): frees the grads instead of "
                "writing zeros into them every step",
            )
        )
    if _cuda(facts):
        n = _counter(facts, "h2d_pageable")
        if n:
            out.append(
                _lint(
                    "h2d_pageable",
                    "warning",
                    f"host-to-device copies from pageable memory: {_per_step(facts, n)}",
                    "pin_memory=True in the DataLoader (or tensor.pin_memory()): pageable copies "
                    "are staged through a driver buffer and cannot overlap compute",
                )
            )
        n = _counter(facts, "h2d_blocking")
        if n:
            out.append(
                _lint(
                    "h2d_blocking",
                    "warning",
                    f"blocking host-to-device copies: {_per_step(facts, n)}",
                    ".to(device, non_blocking=True) from pinned memory: the host stops waiting "
                    "for each copy",
                )
            )
    n = _counter(facts, "eval_forward_with_grad")
    if n:
        out.append(
            _lint(
                "eval_without_no_grad",
                "warning",
                f"forwards of eval() modules with grad enabled: {_per_step(facts, n)}",
                "wrap evaluation in torch.inference_mode() (or torch.no_grad()): no autograd "
                "graph, no saved activations",
            )
        )
    n = _counter(facts, "tensor_from_ndarray")
    if n:
        out.append(
            _lint(
                "tensor_from_ndarray",
                "info",
                f"torch.tensor(numpy array) copies: {_per_step(facts, n)}",
                "torch.from_numpy(array): shares the array's memory, torch.tensor copies it",
            )
        )
    return out


def _lint_channels_last(facts: Any) -> List[Finding]:
    if not _cuda(facts):
        return []
    convs = [(n, m) for n, m in _modules_of(facts, (nn.Conv2d,))]
    if not convs:
        return []
    nchw = []
    for name, m in convs:
        w = getattr(m, "weight", None)
        if isinstance(w, torch.Tensor) and w.dim() == 4:
            if not w.is_contiguous(memory_format=torch.channels_last):
                nchw.append(name or "(root)")
    inputs = _counter(facts, "conv_input_not_channels_last")
    if not nchw and not inputs:
        return []
    if inputs:
        title = f"Conv2d inputs not in channels_last: {_per_step(facts, inputs)}"
    else:
        title = f"{len(nchw)} of {len(convs)} Conv2d weights are NCHW, not channels_last"
    detail = (
        f"NCHW weights e.g. {', '.join(nchw[:3])}." if nchw else "The weights are channels_last."
    )
    return [
        _lint(
            "channels_last",
            "info",
            title,
            "model.to(memory_format=torch.channels_last) and inputs .to(memory_format="
            "torch.channels_last): the layout tensor-core convolutions run in without transposes",
            detail,
        )
    ]


def _lint_num_workers(facts: Any) -> List[Finding]:
    zero = [x for x in _loaders(facts) if x.torch_backed and x.num_workers == 0]
    if not zero:
        return []
    return [
        _lint(
            "num_workers_zero",
            "warning",
            f"{len(zero)} DataLoader(s) load batches in the training process (num_workers=0)",
            "torchspeed.data.DataLoader(..., num_workers=N) (or torch's num_workers=N): batches "
            f"are prepared while the model trains; N up to the free cores ({os.cpu_count()} here)",
            "; ".join(x.describe() for x in zero),
        )
    ]


def _lint_batch(facts: Any) -> List[Finding]:
    if not _cuda(facts):
        return []
    peak = _num(getattr(facts, "peak_memory_bytes", None))
    total = _num(getattr(facts, "total_memory_bytes", None))
    if peak <= 0 or total <= 0:
        return []
    frac = peak / total
    if frac >= BATCH_MEMORY_FRACTION:
        return []
    return [
        _lint(
            "batch_too_small",
            "info",
            f"peak memory is {_pct(frac)} of the GPU "
            f"({peak / 2**30:.1f} of {total / 2**30:.1f} GiB)",
            f"a larger batch_size (up to ~{max(int(0.8 / frac), 2)}x before 80 % of memory, less "
            "as weights and optimizer state do not grow; scale the learning rate with it): "
            "fewer, fuller kernels per sample",
        )
    ]


def lint(facts: RunFacts) -> List[Finding]:
    """Findings read off the run's objects and hook counters (kind "lint", no time estimate)."""
    if facts is None:
        return []
    out: List[Finding] = []
    for rule in (
        _lint_conv_bias,
        _lint_counters,
        _lint_channels_last,
        _lint_num_workers,
        _lint_batch,
    ):
        out += rule(facts)
    return out


# ---- ranking ---------------------------------------------------------------------------------
def _rank(findings: List[Finding], weight: Dict[int, float]) -> List[Finding]:
    """Estimated gains first, largest first; then the rest by severity. Gains equal to the
    nanosecond tie on severity, then on the size of the evidence (the phase's time)."""

    def sev(f: Finding) -> int:
        return _SEVERITY_ORDER.get(f.severity, len(_SEVERITY_ORDER))

    gain = [f for f in findings if f.est_gain_s > 0]
    rest = [f for f in findings if not f.est_gain_s > 0]
    gain.sort(key=lambda f: (-round(f.est_gain_s, 9), sev(f), -weight.get(id(f), 0.0)))
    rest.sort(key=sev)
    return gain + rest


def advise(summary: StepSummary, facts: RunFacts) -> List[Finding]:
    """Every finding for the run, ranked: those with an estimated gain first (largest est_gain_s
    first), then the rest by severity (critical, warning, info). Empty when nothing applies."""
    facts = facts if facts is not None else RunFacts()
    found = _breakdown(summary, facts)
    # The evidence behind a breakdown finding, for ties: the share of the phase it is about.
    weight = {id(f): _share(summary, f.rule) if f.rule in PHASES else 0.0 for f in found}
    return _rank(found + lint(facts), weight)
