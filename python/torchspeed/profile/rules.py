"""The doctor's breakdown rules: findings from a run's step times (which phase is large, what fix
shrinks it, and the estimated step after the fix), with the thresholds and the promised effect of
each fix written beside their sources.

    findings = breakdown_rules(summarize(history), facts)   # unranked; advise() ranks them
"""

from __future__ import annotations

import os
import statistics
from typing import Any, Dict, List, Optional, Sequence, Tuple

import torch
import torch.fx
from torch import nn

from .facts import (
    _TORCHSPEED_OPTIMIZERS,
    _accumulation_k,
    _counter,
    _cuda,
    _list,
    _loaders,
    _models,
    _modules_of,
    _ms,
    _num,
    _optimizer_kind,
    _pct,
    _per_step,
    _phase_s,
    _share,
    _step_s,
    compile_unavailable,
)
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

# Contention: a p90 step this many times the median means steps are uneven: other processes take
# the cores, or a periodic stall (GC, a checkpoint, an eval). 2x is our choice (a steady loop on
# an idle machine stays within ~1.2x); 4x is critical. The load from other processes is the
# 1-minute load average against the cores this process may use.
CONTENTION_RATIO = 2.0
CONTENTION_CRITICAL_RATIO = 4.0
# A module whose own forward time is at least this share of the forward (sampled steps) is named
# (the dominant layer) when forward+backward are a large part of the step (AMP_MIN_COMPUTE_SHARE);
# below it no single layer is worth a targeted fix. Our choice.
DOMINANT_LAYER_SHARE = 0.4

# Page faults: a step that faults in at least this many pages (4 MiB of 4 KiB pages) is freeing
# and re-faulting memory, not touching new data once (our choice); the system time they cost is
# then held to the share rule (_severity) like a phase, and advised as info from the 5 % floor.
MALLOC_MIN_FAULTS_PER_STEP = 1024

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
# On a CPU the doctor measures instead (probe.py: a copy of the model, forward+backward at the
# run's input shape, in each variant against float32): a fix is advised only when the probe ran
# at least 10 % faster with it, beyond the probe's repeat-to-repeat spread (a few % under load,
# the minimum of 3 interleaved repeats). Our choice.
PROBE_MIN_GAIN = 0.10
# CPU oversubscription: torch's intra-op threads plus the loader's workers (C++ decode threads or
# worker processes) exceed the cores. Each oneDNN / OpenMP parallel region ends in a barrier: a
# loader thread that preempts one of torch's threads stalls all of them, so forward+backward lose
# far more than the CPU the loader takes. Measured on the demo's fixes run (2 cores, 2 C++ decode
# threads, bench/RESULTS.md): 2 torch threads 53.9 ms per step, 1 thread 35.0 ms. The estimate:
# forward+backward at the probe's one-thread time (x the bf16 ratio when the run used autocast),
# divided by the cores left to torch's threads: the threads advised, or fewer when the loader's
# measured CPU per step (loader_cpu.py: its processes' and threads' CPU time from /proc) keeps
# more than the other cores busy (threads_estimate). Linear scaling: a planning figure above one
# thread. Without the loader's CPU time, the best case (the workers leave those cores free): the
# demo's baseline estimated 61 and 37 ms where --verify measured -5 and 27 ms.

# torch.compile (inductor) generates its own kernels for the pointwise, normalization, softmax and
# pooling ops (attribution.is_fusable) and fuses each chain of them into one: one pass over memory
# and one dispatch instead of one per op; convolutions and matmuls stay ATen / oneDNN calls. The
# rule fires when the fusable ops are at least 15 % of forward+backward's operator time in the
# recorded step (our choice: below it the gain is within a step's noise), and assumes the fused
# kernels take half of those ops' time: a planning figure. On the demo's SmallResNet (batch 64,
# 64 px, synthetic data, 1 thread, a loaded 2-core machine; bench/RESULTS.md) the doctor saw the
# fusable ops at 47-52 % (max pool, BatchNorm forward and backward, ReLU's backward) and estimated
# 11.1 / 18.4 / 19.8 ms where compiling measured 12.3 / 20.4 / 41.0 ms (the last against a
# disturbed eager run). --verify measures it, the compiling steps left out and their time
# reported apart.
COMPILE_MIN_FUSABLE_SHARE = 0.15
COMPILE_FUSED_LEFT = 0.5

# cudnn.benchmark picks the fastest conv algorithm per shape once; with fixed shapes that saves
# ~10 % of forward+backward on conv nets. Planning figure (brief).
CUDNN_BENCHMARK = 0.9
# CUDA graphs / torch.compile(mode="reduce-overhead") replay a step's launches at once: x0.5 of
# forward+backward when launch-bound. Planning figure (brief).
LAUNCH_BOUND_GRAPHS = 0.5
# An unexplained host stall (a .item(), a sync) found and removed: half the idle time back.
# Planning figure (brief): the stall is unknown, so only part of it is claimed.
GPU_IDLE_STALL = 0.5

_LABEL = {
    "data_wait": "data wait",
    "h2d": "host-to-device copy",
    "forward": "forward",
    "backward": "backward",
    "optimizer": "optimizer step",
    "comm": "communication",
    "other": "other (unattributed)",
}


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


def _fused_step_estimate(facts: Any, t: float) -> Optional[Tuple[float, str]]:
    """(the optimizer phase's seconds after the swap, how that was estimated) from the probe of
    torchspeed's fused step, or None when it was not measured. With the script's own optimizer
    timed beside it, their ratio scales the phase the run measured; otherwise (an older probe) the
    fused step's own one-thread seconds stand in, which errs low with more threads."""
    fused_s = _probe(facts, "fused_optimizer_s")
    if fused_s is None:
        return None
    own_s = _probe(facts, "own_optimizer_s")
    if own_s is not None and own_s > 0:
        ratio = min(fused_s / own_s, 1.0)
        after = t * ratio
        how = (
            f"torchspeed's fused step over the run's parameter shapes took {_ms(fused_s)} "
            f"against {_ms(own_s)} for the script's optimizer class, both on one thread after "
            f"the run (x{ratio:.2f}) ({_ms(t)} -> {_ms(after)})"
        )
        return after, how
    after = min(fused_s, t)
    how = (
        f"torchspeed's fused step over the run's parameter shapes took {_ms(fused_s)} here "
        f"(measured after the run) ({_ms(t)} -> {_ms(after)})"
    )
    return after, how


def _optimizer(summary: Any, facts: Any, floor: bool = True) -> List[Finding]:
    """floor=False (--verify): the estimate even below the share thresholds, as "info"."""
    step, share, t = _step_s(summary), _share(summary, "optimizer"), _phase_s(summary, "optimizer")
    sev = _severity(share, t)
    if sev is None:
        if floor or t <= 0:
            return []
        sev = "info"
    opts = [(o, _optimizer_kind(o)) for o in _list(facts, "optimizers")]
    opts = [(o, k) for o, k in opts if k is not None]
    title = _phase_title(summary, "optimizer")
    fused = _fused_step_estimate(facts, t)
    if not opts and fused is not None:
        # The objects are gone with the script's frames; the probe timed the torchspeed
        # counterpart of the torch SGD / Adam / AdamW it saw while they were alive.
        after, how = fused
        fix = "torchspeed.optim's fused counterpart of the torch optimizer (drop-in)"
        return [_estimated("optimizer", sev, title, fix, f"Estimate: {how}.", step, t - after)]
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
    if len(opts) == 1 and fused is not None:
        # Measured: torchspeed's step over zero tensors of the run's parameter shapes.
        after, how = fused
        detail = f"optimizers: {kinds}. Estimate: {how}."
        return [_estimated("optimizer", sev, title, fix, detail, step, t - after)]
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


def _probe(facts: Any, key: str) -> Optional[float]:
    """A probe.py measurement (a ratio or seconds), None when not measured."""
    probes = getattr(facts, "probes", None)
    v = _num(probes.get(key) if isinstance(probes, dict) else None, -1.0)
    return v if v > 0 else None


def _amp(summary: Any, facts: Any) -> List[Finding]:
    if getattr(facts, "autocast_used", False) is not False:  # used, or unknown: quiet
        return []
    cuda, cpu_bf16 = _cuda(facts), bool(getattr(facts, "bf16_capable_cpu", False))
    cpu = getattr(facts, "device_type", None) == "cpu"
    if not cuda and not cpu:
        return []
    if _low_precision_model(facts):  # model.bfloat16() / .half(): already runs in 16 bits
        return []
    step = _step_s(summary)
    share, t = _compute(summary)
    if share < AMP_MIN_COMPUTE_SHARE or t < MIN_PHASE_S:
        return []
    measured = None if cuda else _probe(facts, "bf16")
    if cpu and measured is None and not cpu_bf16 and not _models(facts):
        return []  # no model seen (facts from elsewhere): nothing to say about its precision
    isa = (
        "this CPU has native bf16 (AVX512_BF16 / AMX)"
        if cpu_bf16
        else "this CPU has no native bf16 (no AVX512_BF16, no AMX: oneDNN converts to float32 and "
        "back around each bf16 op)"
    )
    if cpu and (
        measured is None and not cpu_bf16 or measured is not None and measured > 1 - PROBE_MIN_GAIN
    ):
        # Said, not silent: a user who knows autocast from a GPU asks why it is not advised.
        if measured is None:
            why = f"{isa}, and the model could not be measured in bf16 here"
        else:
            why = (
                f"forward+backward of a copy of the model ran {measured:.2f}x as long under "
                f"bf16 autocast as in float32 (measured after the run, at its input shape); {isa}"
            )
        title = "bf16 autocast is not advised on this CPU"
        fix = (
            "keep float32 here; on a CPU with AMX / AVX512_BF16 or on a GPU, "
            "torch.autocast(device, dtype=torch.bfloat16) around forward and loss"
        )
        return [_estimated("amp_not_advised", "info", title, fix, why + ".", step, None)]
    if cuda:
        factor, basis = AMP_CUDA, f"x{AMP_CUDA} of forward+backward (planning figure)"
    elif measured is not None:
        factor = measured
        basis = (
            f"forward+backward of a copy of the model ran x{measured:.2f} of its float32 time "
            "under bf16 autocast (measured after the run, at its input shape)"
        )
    else:
        factor, basis = AMP_CPU_BF16, f"x{AMP_CPU_BF16} of forward+backward (planning figure)"
    where = "cuda" if cuda else "cpu"
    title = (
        f"forward+backward are {_pct(share)} of the step ({_ms(t)} of {_ms(step)}) in full "
        "precision: no torch.autocast was seen"
    )
    fix = f'with torch.autocast("{where}", dtype=torch.bfloat16): around forward and loss'
    if cuda:
        fix += " (or float16 with torch.amp.GradScaler)"
    detail = (
        f"device={where}{'' if cuda else '; ' + isa}. Estimate: {basis} "
        f"({_ms(t)} -> {_ms(t * factor)})."
    )
    return [_estimated("amp", "warning", title, fix, detail, step, t * (1.0 - factor))]


def _loader_workers(facts: Any) -> int:
    """Workers (C++ decode threads or worker processes) of the largest loader seen, 0 when
    unknown: the live loaders', or the run's record (its loaders may be gone by now). The
    largest, not the sum: one loader feeds the step (a wrapper and the torch loader inside it,
    or a validation loader, do not add cores)."""
    live = max((max(int(info.num_workers or 0), 0) for info in _loaders(facts)), default=0)
    return max(live, int(_num(getattr(facts, "loader_workers", 0))))


def advised_threads(facts: Any) -> Optional[int]:
    """torch threads that leave the loaders' workers a core each (at least 1), when the run had
    more than that on a CPU; None otherwise."""
    threads = int(_num(getattr(facts, "torch_threads", 0)))
    workers = _loader_workers(facts)
    if getattr(facts, "device_type", None) != "cpu" or threads <= 0 or workers <= 0:
        return None
    _, cores = _load()
    n = max(1, cores - workers)
    return n if threads + workers > cores and n < threads else None


def threads_estimate(
    one_s: float,
    threads: int,
    cores: int,
    loader_cpu_s: Optional[float],
    step_s: float,
    fb_s: float,
) -> Tuple[float, float]:
    """(forward+backward seconds on `threads` torch threads, the cores left to them) when one
    forward+backward takes one_s on one thread and the loader needs loader_cpu_s of CPU per step
    (None: unknown, taken as 0: the best case). The loader's busy cores are its CPU per step over
    the step after the fix (step_s - fb_s + the estimate: a shorter step leaves it less time for
    the same work), so the estimate is the fixed point of
        est = one_s / min(threads, cores - loader_cpu_s / (step_s - fb_s + est)),
    found by bisection (the right side falls as est grows); linear scaling above one thread."""
    loader = max(_num(loader_cpu_s), 0.0)
    rest = max(step_s - fb_s, 0.0)
    floor = 0.05  # cores: a loader that needs them all leaves torch a sliver (a huge estimate)

    def free(est: float) -> float:
        return max(float(cores) - loader / max(rest + est, 1e-9), floor)

    lo = one_s / threads
    hi = one_s / floor
    if min(threads, free(lo)) >= threads:
        return lo, free(lo)
    for _ in range(60):
        mid = 0.5 * (lo + hi)
        if mid < one_s / min(threads, free(mid)):
            lo = mid
        else:
            hi = mid
    return hi, free(hi)


def _cpu_threads(summary: Any, facts: Any) -> List[Finding]:
    """torch threads + loader workers above the cores (CPU), and the probe says forward+backward
    would run faster on the threads left, beside the loader's measured CPU demand."""
    n = advised_threads(facts)
    one = _probe(facts, "fp32_s")
    share, t = _compute(summary)
    if n is None or one is None or share < AMP_MIN_COMPUTE_SHARE or t < MIN_PHASE_S:
        return []
    if len(_models(facts)) > 1:
        return []  # the probe timed one model (a GAN's two, say, are not one forward+backward)
    # The probe times one forward+backward; a step of k micro-batches runs k of them.
    one *= max(1, round(_num(getattr(facts, "train_forwards_per_step", 1.0))))
    basis = "float32"
    if getattr(facts, "autocast_used", False):
        ratio = _probe(facts, "bf16")
        if ratio is None:
            return []
        one, basis = one * ratio, "bf16 autocast"
    _, cores = _load()
    loader = getattr(facts, "loader_cpu_s", None)
    loader = _num(loader, -1.0) if loader is not None else None
    loader = loader if loader is not None and loader >= 0 else None
    step = _step_s(summary)
    est, free = threads_estimate(one, n, cores, loader, step, t)
    if est > t * (1 - PROBE_MIN_GAIN):
        return []
    threads, workers = int(_num(facts.torch_threads)), _loader_workers(facts)
    title = (
        f"{threads} torch threads and {workers} loader workers on {cores} cores: oversubscribed "
        f"(forward+backward {_ms(t)}, {_pct(share)} of the step)"
    )
    keep = (
        "so the loader's workers keep their own cores"
        if cores - workers >= 1
        else "the fewest: the workers alone fill the cores, so torch's threads and theirs "
        "preempt each other less"
    )
    fix = f"torch.set_num_threads({n}) at the start of the script (or OMP_NUM_THREADS={n}), {keep}"
    detail = (
        "Each parallel op ends in a barrier: a loader worker that takes a core from one of "
        "torch's threads stalls the others. Estimate: forward+backward of a copy of the model "
        f"took {_ms(one)} on one thread ({basis}, measured after the run)"
    )
    if loader is None:
        detail += (
            (f", divided over {n} threads (linear scaling, a planning figure)" if n > 1 else "")
            + f" ({_ms(t)} -> {_ms(est)}): the best case, where the workers leave those cores "
            "free (their CPU time was not measured); workers that need more leave less, which "
            "--verify measures."
        )
    else:
        used = cores - free
        detail += (
            f"; the loader used {_ms(loader)} of CPU per step (its worker processes and threads, "
            f"measured over the run's steps), {used:.2f} of the {cores} cores at the estimated "
            f"step, leaving torch's {n} thread{'s' if n > 1 else ''} {min(free, n):.2f} cores"
            + f" (one-thread time / {min(free, n):.2f}"
            + (", linear scaling above one thread, a planning figure" if n > 1 else "")
            + f") ({_ms(t)} -> {_ms(est)}). Assumes the loader's demand spreads evenly over the "
            "step; what else the step runs on other cores is not counted, which --verify measures."
        )
    return [_estimated("cpu_threads", "warning", title, fix, detail, step, t - est)]


def _malloc(summary: Any, facts: Any) -> List[Finding]:
    """CPU, glibc's malloc as it comes: the step faults in many pages (freed tensors went back to
    the OS) and the system time that costs is a large share of the step. Estimate: that system
    time, an upper bound: the faults of new data (a batch arriving in shared memory) and other
    system calls stay, and which part of the time they are is not known before the fix (per
    step, the system time and the faults correlate weakly: r = 0.15-0.42 on the demo)."""
    from .malloc import ENV_FIX

    pf = getattr(facts, "page_faults", None)
    if getattr(facts, "device_type", None) != "cpu" or getattr(facts, "malloc_tuned", None) != "":
        return []
    if not pf or _num(pf[0]) < MALLOC_MIN_FAULTS_PER_STEP:
        return []
    faults, sys_s = _num(pf[0]), _num(pf[1])
    step = _step_s(summary)
    share = sys_s / step if step > 0 else 0.0
    if share < NEVER_BELOW_SHARE or sys_s < MIN_PHASE_S:
        return []
    # A fix with no cost but memory: advised (info) from the 5 % floor, not only from 10 %.
    sev = _severity(share, sys_s) or "info"
    title = (
        f"{faults:,.0f} page faults a step: {_ms(sys_s)} of system time, {_pct(sys_s / step)} "
        "of the step"
    )
    fix = (
        f"start the script with {ENV_FIX} in the environment (glibc's malloc keeps freed tensors' "
        "memory for the next step), or LD_PRELOAD jemalloc or tcmalloc"
    )
    detail = (
        "glibc's malloc gives each large block a fresh mmap and returns the free top of its heap "
        "to the OS, so the activations a step frees are faulted in (and zeroed) again in the "
        "next: this process's minor faults and system time, medians over the steps the table "
        "keeps. "
        f"Estimate: that system time, at most ({_ms(step)} -> {_ms(step - sys_s)}): the faults "
        "of new data and other system calls stay. The heap then keeps "
        "up to the run's peak allocation (1 GiB at most) between steps."
    )
    return [_estimated("malloc", sev, title, fix, detail, step, sys_s)]


def _nchw_convs(facts: Any) -> List[str]:
    out = []
    for name, m in _modules_of(facts, (nn.Conv2d,)):
        w = getattr(m, "weight", None)
        if isinstance(w, torch.Tensor) and w.dim() == 4:
            if not w.is_contiguous(memory_format=torch.channels_last):
                out.append(name or "(root)")
    return out


def _channels_last_cpu(summary: Any, facts: Any) -> List[Finding]:
    """CPU: NCHW convolutions, and a probe that measured the model faster in channels_last (on
    CUDA the channels_last lint speaks, without an estimate)."""
    if getattr(facts, "device_type", None) != "cpu":
        return []
    nchw = _nchw_convs(facts)
    # The model may be gone by the time the rules run (the script returned): the probe's count.
    n = len(nchw) or int(_probe(facts, "nchw_convs") or 0)
    measured = _probe(facts, "channels_last")
    step = _step_s(summary)
    share, t = _compute(summary)
    if not n or measured is None or measured > 1 - PROBE_MIN_GAIN:
        return []
    if share < WARN_SHARE or t < MIN_PHASE_S:
        return []
    title = (
        f"{n} Conv2d layers run in NCHW; forward+backward are {_pct(share)} of the step ({_ms(t)})"
    )
    fix = (
        "model.to(memory_format=torch.channels_last) and each input batch "
        ".contiguous(memory_format=torch.channels_last): oneDNN's convolutions run in NHWC "
        "without reordering every activation"
    )
    detail = (
        f"NCHW weights e.g. {', '.join(nchw[:3]) or '(the model is gone)'}. Estimate: "
        "forward+backward of a copy of the "
        f"model ran x{measured:.2f} of its NCHW time in channels_last, converting each input "
        f"batch included (measured after the run, at its input shape) "
        f"({_ms(t)} -> {_ms(t * measured)})."
    )
    return [_estimated("channels_last", "warning", title, fix, detail, step, t * (1 - measured))]


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


def _compile(summary: Any, facts: Any) -> List[Finding]:
    """Forward+backward a large part of the step and many of their ops ones torch.compile fuses
    (pointwise, normalization, softmax, pooling); quiet when the model already runs compiled."""
    att = getattr(facts, "attribution", None)
    fusable = att.fusable_share() if hasattr(att, "fusable_share") else None
    if fusable is None or fusable < COMPILE_MIN_FUSABLE_SHARE:
        return []
    if getattr(facts, "model_compiled", False) or getattr(att, "compiled", False):
        return []
    share, t = _compute(summary)
    if share < AMP_MIN_COMPUTE_SHARE or t < MIN_PHASE_S:
        return []
    device = "cuda" if _cuda(facts) else "cpu"
    step = _step_s(summary)
    top = ", ".join(f"{n} {_ms(x)}" for n, x in getattr(att, "fusable_top", [])[:3])
    seen = (
        "In the sampled step the ops torch.compile fuses (pointwise, normalization, softmax, "
        f"pooling) took {_ms(att.fusable_s)} of forward+backward's {_ms(att.model_op_s)} of "
        f"operator time ({_pct(fusable)}" + (f"; {top}" if top else "") + ")."
    )
    why = getattr(facts, "compile_unavailable", None)
    if why is None:
        why = compile_unavailable(device)
    if why:
        title = "torch.compile would fuse the model's elementwise ops, but it cannot run here"
        fix = f"make torch.compile available ({why}), then model = torch.compile(model)"
        return [_estimated("compile_unavailable", "info", title, fix, seen, step, None)]
    saved = t * fusable * (1 - COMPILE_FUSED_LEFT)
    title = (
        f"ops torch.compile fuses are {_pct(fusable)} of forward+backward's operator time, and "
        f"forward+backward {_pct(share)} of the step ({_ms(t)}): eager PyTorch runs each "
        "on its own"
    )
    fix = (
        "model = torch.compile(model) after building it (inductor fuses each chain of "
        "elementwise, normalization and pooling ops into one kernel); the first steps compile, "
        "which takes seconds to minutes"
    )
    detail = (
        f"{seen} Estimate: the fused kernels are assumed to take {_pct(COMPILE_FUSED_LEFT)} of "
        f"those ops' time (a planning figure; convolutions and matmuls unchanged): "
        f"forward+backward x(1 - {fusable:.2f} x {1 - COMPILE_FUSED_LEFT:g}) "
        f"({_ms(t)} -> {_ms(t - saved)}). --verify measures it, compile time apart."
    )
    return [_estimated("compile", "warning", title, fix, detail, step, saved)]


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


def _load() -> Tuple[Optional[float], int]:
    """The 1-minute load average (None when unknown) and the cores this process may use."""
    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cores = os.cpu_count() or 1
    try:
        return os.getloadavg()[0], cores
    except (AttributeError, OSError):
        return None, cores


def _contention(summary: Any, facts: Any) -> List[Finding]:
    """p90 step / median step above CONTENTION_RATIO: the steps are uneven."""
    step, p90 = _step_s(summary), max(_num(getattr(summary, "step_p90_s", 0.0)), 0.0)
    if step <= 0 or p90 < CONTENTION_RATIO * step or p90 - step < MIN_PHASE_S:
        return []
    ratio = p90 / step
    load, cores = _load()
    sev = "critical" if ratio >= CONTENTION_CRITICAL_RATIO else "warning"
    title = f"uneven steps: the p90 step is {ratio:.1f}x the median ({_ms(p90)} vs {_ms(step)})"
    busy = ""
    if load is not None:
        busy = f" The load average is {load:.1f} on {cores} cores"
        busy += (
            ": other processes compete for them."
            if load > cores
            else ", so the stall is more "
            "likely in the loop itself (a periodic eval, checkpoint, GC or a data hiccup)."
        )
    fix = (
        "run on an otherwise idle machine, or keep torch's threads (torch.set_num_threads) "
        "within the cores left free; look in the trace for what the slow steps do"
    )
    detail = f"The table's medians describe the typical step; a tenth of the steps take {_ms(p90)} or more.{busy}"
    # No estimate: what the slow steps wait for is not known from the times alone.
    return [_estimated("contention", sev, title, fix, detail, step, None)]


def _layer_fix(m: Any, cuda: bool) -> str:
    t = getattr(m, "type", "")
    amp = f'torch.autocast("{"cuda" if cuda else "cpu"}", dtype=torch.bfloat16)'
    if t == "Linear":
        return (
            f"{amp} around it (or the whole forward); for a large output layer before a softmax, "
            "a smaller vocabulary or nn.AdaptiveLogSoftmaxWithLoss"
        )
    if t.startswith("Conv"):
        return f"channels_last (model.to(memory_format=torch.channels_last)) and {amp}"
    if t in ("LSTM", "GRU", "RNN"):
        return f"{amp}; fewer layers or a smaller hidden size; on CUDA cuDNN's fused kernels"
    if t in ("MultiheadAttention",):
        return "torch.nn.functional.scaled_dot_product_attention (fused kernels) and " + amp
    return f"{amp}, or a cheaper form of this layer"


def _dominant_layer(summary: Any, facts: Any) -> List[Finding]:
    """The module whose own forward time is the largest share of the sampled steps."""
    att = getattr(facts, "attribution", None)
    top = att.dominant() if att is not None and hasattr(att, "dominant") else None
    if top is None or _num(getattr(top, "share", 0.0)) < DOMINANT_LAYER_SHARE:
        return []
    compute, t = _compute(summary)
    if compute < AMP_MIN_COMPUTE_SHARE:
        return []
    title = (
        f"{top.name} ({top.detail or top.type}) is {_pct(top.share)} of the forward time, "
        f"and forward+backward are {_pct(compute)} of the step ({_ms(t)})"
    )
    ops = list(getattr(att, "ops", []) or [])[:3]
    detail = "Sampled steps: module forwards timed by the hooks."
    if ops:
        detail += (
            " Top operators in one step (forward and backward): "
            + "; ".join(f"{o.name} {o.shapes} {_pct(o.share)}" for o in ops)
            + "."
        )
    return [
        _estimated(
            "dominant_layer",
            "warning",
            title,
            _layer_fix(top, _cuda(facts)),
            detail,
            _step_s(summary),
            None,
        )
    ]


def _breakdown(summary: Any, facts: Any) -> List[Finding]:
    if summary is None:
        return []
    facts = facts if facts is not None else RunFacts()
    out: List[Finding] = []
    if _step_s(summary) > 0 and int(_num(getattr(summary, "steps", 0))) > 0:
        for rule in (
            _data_wait,
            _optimizer,
            _h2d,
            _comm,
            _amp,
            _channels_last_cpu,
            _cpu_threads,
            _malloc,
            _compile,
            _cudnn_benchmark,
            _launch_bound,
            _contention,
            _dominant_layer,
        ):
            out += rule(summary, facts)
        out += _gpu_idle(summary, facts, out)
    out += _straggler(summary)
    return out


def verify_estimates(summary: Any, facts: Any) -> Dict[str, Optional[float]]:
    """Signed seconds per step each fix would save by the doctor's measurements (negative: a
    loss), for --verify, whether or not a rule advises it: "amp" and "channels_last" from the
    probes' ratios on forward+backward, "optimizer" below the share threshold too. None: not
    measured."""
    _, t = _compute(summary)
    out: Dict[str, Optional[float]] = {}
    for key, rule in (("bf16", "amp"), ("channels_last", "channels_last")):
        r = _probe(facts, key)
        out[rule] = t * (1 - r) if r is not None else None
    out["amp_not_advised"] = out["amp"]
    threads = _cpu_threads(summary, facts)
    out["cpu_threads"] = threads[0].est_gain_s if threads else None
    opt = _optimizer(summary, facts, floor=False)
    out["optimizer"] = opt[0].est_gain_s if opt and opt[0].est_step_s is not None else None
    return out


def breakdown_rules(summary: StepSummary, facts: RunFacts) -> List[Finding]:
    """Findings from the step times (kind "breakdown"), each with the estimated step after its
    fix where the promise is known; unranked. Nothing for a summary without steps."""
    return _breakdown(summary, facts)
