"""The step profiler's data: per-step phase times (StepHistory), their statistics (StepSummary) and
the facts the doctor reads off the run (RunFacts). Plain dataclasses; no torch needed to build them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Tuple

#: The phases of a training step, in the order of the C++ enum torchspeed::profile::Phase.
#: "other" is the part of the step that no phase covered, so the phases of a step sum to its time.
PHASES = ("data_wait", "h2d", "forward", "backward", "optimizer", "comm", "other")


@dataclass
class StepHistory:
    """Per-step times in nanoseconds, oldest first; bounded (the profiler keeps the last N steps).

    ``step_ns[i] == sum(phase_ns[p][i] for p in PHASES)`` for every step.
    """

    step_ns: List[int] = field(default_factory=list)
    phase_ns: Dict[str, List[int]] = field(default_factory=lambda: {p: [] for p in PHASES})
    #: Time of each step's end, in ns of the profiler's clock (for throughput over time).
    end_ns: List[int] = field(default_factory=list)
    #: Samples in each step's batch, when known (0 = unknown).
    samples: List[int] = field(default_factory=list)
    #: "host" (the CPU clock) or "cuda" (CUDA events on the step's stream): one clock per run.
    clock: str = "host"
    #: Steps that were measured but are no longer in the lists (the bounded window moved on).
    steps_dropped: int = 0

    def __len__(self) -> int:
        return len(self.step_ns)


@dataclass
class PhaseStat:
    """One phase over the summarized steps (seconds)."""

    median_s: float
    p90_s: float
    mean_s: float
    total_s: float
    #: The phase's fraction of all step time: the shares of PHASES sum to 1.
    share: float


@dataclass
class StepSummary:
    """What the summary table prints and the doctor's rules read."""

    steps: int
    step_median_s: float
    step_p90_s: float
    step_mean_s: float
    total_s: float
    phases: Dict[str, PhaseStat]
    clock: str = "host"
    #: Samples per second over the summarized steps (None when batch sizes are unknown).
    samples_per_s: Optional[float] = None
    #: Events the recorder overwrote before they were read (ring full); 0 means the trace is whole.
    dropped_events: int = 0
    rank: int = 0
    world_size: int = 1
    #: On rank 0 of a distributed run: every rank's summary (index = rank); else None.
    ranks: Optional[List[StepSummary]] = None

    def share(self, phase: str) -> float:
        return self.phases[phase].share


def _quantile(sorted_values: List[float], q: float) -> float:
    """Linear-interpolated quantile of sorted values (numpy's default method)."""
    if not sorted_values:
        return 0.0
    pos = (len(sorted_values) - 1) * q
    lo = math.floor(pos)
    hi = min(lo + 1, len(sorted_values) - 1)
    return sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * (pos - lo)


def without_steps(history: StepHistory, steps) -> StepHistory:
    """The history without the given steps (numbered from the run's first, as steps_dropped
    counts them): steps a sampler perturbed. Unchanged when that would leave none."""
    drop = {i - history.steps_dropped for i in steps}
    keep = [i for i in range(len(history)) if i not in drop]
    if not keep or len(keep) == len(history):
        return history
    return StepHistory(
        step_ns=[history.step_ns[i] for i in keep],
        phase_ns={p: [v[i] for i in keep] for p, v in history.phase_ns.items()},
        end_ns=[history.end_ns[i] for i in keep],
        samples=[history.samples[i] for i in keep],
        clock=history.clock,
        steps_dropped=history.steps_dropped,
    )


def summarize(history: StepHistory, skip_first: int = 0) -> StepSummary:
    """Median, p90, mean and share of each phase over the history's steps (after ``skip_first``)."""
    n = len(history)
    s = min(skip_first, max(n - 1, 0))
    steps = [x / 1e9 for x in history.step_ns[s:]]
    total = sum(steps)
    phases = {}
    for p in PHASES:
        vals = [x / 1e9 for x in history.phase_ns[p][s:]]
        sv = sorted(vals)
        tot = sum(vals)
        phases[p] = PhaseStat(
            median_s=_quantile(sv, 0.5),
            p90_s=_quantile(sv, 0.9),
            mean_s=tot / len(vals) if vals else 0.0,
            total_s=tot,
            share=tot / total if total > 0 else 0.0,
        )
    ss = sorted(steps)
    samples = history.samples[s:]
    sps = None
    if samples and all(x > 0 for x in samples) and total > 0:
        sps = sum(samples) / total
    return StepSummary(
        steps=len(steps),
        step_median_s=_quantile(ss, 0.5),
        step_p90_s=_quantile(ss, 0.9),
        step_mean_s=total / len(steps) if steps else 0.0,
        total_s=total,
        phases=phases,
        clock=history.clock,
        samples_per_s=sps,
    )


@dataclass
class RunFacts:
    """What the doctor knows about the run besides the times: read off the objects the hooks saw
    and counted while the steps ran. Every field has a neutral default, so a rule whose fact is
    unknown stays quiet.
    """

    #: "cpu" or "cuda": where the model's parameters live.
    device_type: str = "cpu"
    #: torch.autocast was active in some forward.
    autocast_used: bool = False
    #: The CPU has native bf16 math (AVX-512 BF16 or AMX) — AMP on CPU pays off there.
    bf16_capable_cpu: bool = False
    cudnn_benchmark: bool = False
    #: Every step saw the same input shapes (None = not observed).
    fixed_input_shapes: Optional[bool] = None
    #: The modules, optimizers and loaders seen during the run (the lints read them).
    models: List[Any] = field(default_factory=list)
    optimizers: List[Any] = field(default_factory=list)
    loaders: List[Any] = field(default_factory=list)
    #: A torch DistributedDataParallel (or torchspeed's AccumulatingDDP) wraps the model.
    ddp: bool = False
    #: Counts the hooks made over the profiled steps; keys (absent = 0):
    #:   h2d_pageable        host-to-device copies from non-pinned memory
    #:   h2d_blocking        host-to-device copies without non_blocking=True
    #:   tensor_from_ndarray torch.tensor(numpy array) calls (a copy; torch.from_numpy shares)
    #:   zero_grad_keep      zero_grad(set_to_none=False) calls
    #:   eval_forward_with_grad  forwards of a module in eval() mode with grad enabled
    #:   conv_input_not_channels_last  4-D inputs to a Conv2d on CUDA not in channels_last
    #:   module_calls        forward calls of any module (per step: divide by steps)
    #:   clip_grad_norm      torch.nn.utils.clip_grad_norm_ calls
    counters: Dict[str, int] = field(default_factory=dict)
    #: Steps profiled (to turn counters into per-step rates).
    steps: int = 0
    #: Fraction of the step the GPU was idle (from CUDA events); None when not measured.
    gpu_idle_share: Optional[float] = None
    #: Peak bytes allocated by torch on the device, and the device's total bytes (CUDA only).
    peak_memory_bytes: Optional[int] = None
    total_memory_bytes: Optional[int] = None
    #: Median host time per module call, seconds (launch-bound detection on GPU).
    host_s_per_module_call: Optional[float] = None
    #: What ended each step: "optimizer" (the first optimizer's step()), "backward" (no optimizer
    #: step seen: the first forward or batch fetch after a backward), "forward" (no backward
    #: either: each forward of the top module), "manual" (StepProfiler.step()), "" (unknown).
    step_source: str = ""
    #: Forwards of the model inside optimizer steps, per step (an LBFGS closure: > 1).
    closure_forwards_per_step: float = 0.0
    #: Outermost forwards in train mode with grad per step (micro-batches: k with accumulation).
    train_forwards_per_step: float = 0.0
    #: The modules and operators that took the most time in the sampled steps (Attribution).
    attribution: Optional[Any] = None
    #: Measured on this machine after the run (probe.py; CPU only, {} when not measured):
    #:   bf16               forward+backward of a copy of the model under bf16 autocast / fp32
    #:   channels_last      the same in channels_last / NCHW (models with Conv2d layers)
    #:   fused_optimizer_s  one step of torchspeed's fused optimizer over the run's parameters
    #:   own_optimizer_s    one step of the script's optimizer class over the same, interleaved
    #:   fp32_s             seconds of one forward+backward of the float32 copy on one thread
    probes: Dict[str, float] = field(default_factory=dict)
    #: torch's intra-op threads (torch.get_num_threads()) when the facts were taken; 0 = unknown.
    torch_threads: int = 0
    #: The most workers (C++ decode threads or worker processes) of one loader seen in the run.
    loader_workers: int = 0
    #: The loader's CPU seconds per step (its worker processes and C++ threads, from /proc over
    #: the steps after the warmup); None when not measured.
    loader_cpu_s: Optional[float] = None
    #: This process's (minor page faults, system CPU seconds) per step over the steps after the
    #: warmup (getrusage; not its worker processes); None when not measured.
    page_faults: Optional[Tuple[float, float]] = None
    #: How the process's allocator was set up when the facts were taken: "" for glibc's malloc
    #: as it comes, else what was seen ("MALLOC_TRIM_THRESHOLD_", "LD_PRELOAD jemalloc", "not
    #: glibc", ...); None when not checked. The malloc rule speaks only for "".
    malloc_tuned: Optional[str] = None
    #: An outermost module ran under torch.compile (an OptimizedModule, or model.compile()); the
    #: attribution's operator step also tells (Attribution.compiled).
    model_compiled: bool = False
    #: Why torch.compile cannot run here ("" when it can), None when not checked: the compile
    #: rule checks then (facts.compile_unavailable), only when it would advise it.
    compile_unavailable: Optional[str] = None


@dataclass
class Finding:
    """One piece of advice. Ranked by ``est_gain_s`` (largest first); lints without a time estimate
    come after, by severity."""

    rule: str  # stable id, e.g. "data_wait", "conv_bias_before_bn"
    severity: str  # "critical" | "warning" | "info"
    title: str  # one line: what is wrong, with the number
    fix: str  # one line: what to do, naming the torchspeed / torch API
    detail: str = ""  # why, and where (module names, counts)
    #: What the median step would take if the fix worked as promised (None for lints that do
    #: not change the step time by a known amount).
    est_step_s: Optional[float] = None
    #: Seconds saved per step (step_median_s - est_step_s), 0 when unknown.
    est_gain_s: float = 0.0
    kind: str = "breakdown"  # "breakdown" (from the times) or "lint" (read off the code)
