"""The step profiler: ``step()`` at each step's end; phases from torchspeed's own loader and
optimizers, from ``phase()`` ranges, and (``hooks=True``) from torch's global hooks for plain torch
code. The breakdown sums to 100 % with an explicit "other".

    prof = torchspeed.profile.StepProfiler(hooks=True)
    with prof:
        for x, y in loader:
            loss = loss_fn(model(x), y); loss.backward(); opt.step(); opt.zero_grad()
            prof.step()            # or step_on="optimizer": each optimizer.step() ends a step
    print(prof.report())           # table + ranked advice

One clock per run: on the CPU the host clock (the C++ core's TSC); with CUDA (``device="cuda"``,
the default when a GPU is available) CUDA events recorded on the current stream at every phase
boundary, read back at least one step later with a non-blocking query, never a synchronization
inside the step. A GPU segment between two markers belongs to the phase the host was in between
them, so queued kernels are charged to the phase that launched them, not to the one that waited.
"""

from __future__ import annotations

import collections
import threading
from typing import Any, Deque, List, Optional, Sequence, Tuple

import torch

from .. import _C
from . import ranges as _ranges
from .advice import advise
from .distributed import gather_summaries
from .hooks import TorchHooks
from .report import (
    describe_page_faults,
    describe_step_source,
    format_findings,
    format_summary,
    write_png,
    write_tensorboard,
)
from .summary import PHASES, RunFacts, StepHistory, StepSummary, summarize, without_steps

_P = _C.profile


# Process-wide: how many profilers run (recording stays on until the last stops, then returns to
# what it was before the first) and which one owns torch's process-wide hooks.
_lock = threading.Lock()
_running = {"count": 0, "was_enabled": False, "hooked": None}


class _HostTimeline:
    """Phases are on the C++ per-thread stack; step() breaks the step down from the thread's ring."""

    def __init__(self, cpp):
        self.cpp = cpp
        self.closed = False

    def start(self) -> None:
        self.cpp.start()

    def step(self, samples: int) -> None:
        self.cpp.step(samples)

    def flush(self) -> None:
        pass


class _CudaTimeline:
    """CUDA events at every phase boundary; segments between them summed per phase."""

    _MAX_PENDING = 4096  # steps not yet resolved (the GPU can only run so far behind)

    def __init__(self, cpp):
        self.cpp = cpp
        self.closed = False
        self.pool: List[Any] = []
        self.stack: List[Tuple[int, int]] = []  # open (name id, phase), newest last
        self.marks: List[Tuple[Any, int]] = []
        self.pending: Deque[Tuple[List[Tuple[Any, int]], int, int]] = collections.deque()

    def _mark(self, phase_after: int) -> None:
        ev = self.pool.pop() if self.pool else torch.cuda.Event(enable_timing=True)
        ev.record()
        self.marks.append((ev, phase_after))

    def _current(self) -> int:
        return self.stack[-1][1] if self.stack else _ranges.OTHER

    # Called from C++ for every phase range of the profiler's thread (see _P._set_timeline).
    def enter(self, name_id: int, phase: int) -> None:
        _P.begin(name_id, phase)
        if self.closed:  # stopped from another thread: this thread goes back to C++ only
            _P._set_timeline(None)
            return
        self.stack.append((name_id, phase))
        self._mark(phase)

    def exit(self, name_id: int) -> None:
        _P.end(name_id)
        if self.closed:
            _P._set_timeline(None)
            return
        for i in range(len(self.stack) - 1, -1, -1):  # the newest entry of that name
            if self.stack[i][0] == name_id:
                del self.stack[i]
                self._mark(self._current())
                return

    def start(self) -> None:
        self.cpp.start()  # keeps the host ring cursor for the trace's step track
        self.marks = []
        self._mark(self._current())

    def step(self, samples: int) -> None:
        self._mark(self._current())
        boundary = self.marks[-1]
        self.pending.append((self.marks, samples, _P.now_ns()))
        self.marks = [boundary]  # the closing marker of this step opens the next one
        self.poll(wait=len(self.pending) > self._MAX_PENDING)

    def poll(self, wait: bool = False) -> None:
        while self.pending:
            marks, samples, host_end = self.pending[0]
            if wait:
                marks[-1][0].synchronize()
            elif not all(ev.query() for ev, _ in marks):
                return
            self.pending.popleft()
            phase_ns = [0] * len(PHASES)
            for (e0, p), (e1, _) in zip(marks, marks[1:]):
                phase_ns[p] += int(round(e0.elapsed_time(e1) * 1e6))
            total = sum(phase_ns)
            self.cpp.add(host_end - total, host_end, phase_ns, samples)
            self.pool.extend(ev for ev, _ in marks[:-1])  # the last one opens the next step

    def flush(self) -> None:
        self.poll(wait=True)


class StepProfiler:
    """Always-on per-step breakdown: data_wait, h2d, forward, backward, optimizer, comm, other.

    Args:
        hooks: install torch's global hooks (module forward, optimizer step, DataLoader iterator,
            autograd backward, host-to-device copies, torch.distributed collectives) so plain torch
            code is covered; they also collect the facts the doctor's lints read.
        step_on: "optimizer" makes each step of the first optimizer that steps end a profiler
            step; "auto" (what ``torchspeed doctor`` uses, needs ``hooks=True``) does too, and
            in a loop with no optimizer step (a manual SGD update, a forward-only loop) the first
            forward or batch fetch after a backward (else each forward of the top module) ends
            one; None (default) means you call ``step()``.
        device: "cuda" (CUDA-event timeline), "cpu" (host clock) or None: cuda when a GPU is
            available.
        history_steps: the newest steps kept (memory does not grow with the run).
        warmup: steps left out of ``summary()`` (the first steps compile, allocate, warm caches).
        nvtx: mirror every range into NVTX for Nsight Systems (CUDA builds).
        attribute: with hooks, time each module's forward in two sampled steps and record the
            next step's operators with torch.profiler: the report names the dominant layers
            and operators (what the doctor does).
        probe: with hooks, after the run (the first ``facts()``/``advice()`` after ``stop()``),
            measure a copy of the model in bf16 and channels_last and torchspeed's fused
            optimizer over the run's parameter shapes, on the CPU (profile/probe.py): the
            doctor's estimates for those fixes then come from this machine (what the doctor does).
    """

    def __init__(
        self,
        *,
        hooks: bool = False,
        step_on: Optional[str] = None,
        device: Optional[str] = None,
        history_steps: int = 16384,
        warmup: int = 1,
        nvtx: bool = False,
        attribute: bool = False,
        probe: bool = False,
    ):
        name = "torchspeed.profile.StepProfiler"
        if step_on not in (None, "optimizer", "auto"):
            raise ValueError(
                f"{name}: step_on must be None, 'optimizer' or 'auto', got {step_on!r}"
            )
        if step_on == "auto" and not hooks:
            raise ValueError(f"{name}: step_on='auto' needs hooks=True")
        if device is None:
            device = "cuda" if torch.cuda.is_available() else "cpu"
        if device not in ("cpu", "cuda"):
            raise ValueError(f"{name}: device must be 'cpu' or 'cuda', got {device!r}")
        if device == "cuda" and not torch.cuda.is_available():
            raise ValueError(f"{name}: device='cuda' but CUDA is not available")
        for arg, value, low in (("warmup", warmup, 0), ("history_steps", history_steps, 1)):
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise ValueError(f"{name}: {arg} must be an int >= {low}, got {value!r}")
        if nvtx and not _P.nvtx_available():
            raise ValueError(f"{name}: NVTX ranges (nvtx=True) need a CUDA build of torchspeed")
        self.device = device
        self.warmup = warmup
        self.step_on = step_on
        self._cpp = _P.StepProfiler(history_steps)
        self._timeline = _CudaTimeline(self._cpp) if device == "cuda" else _HostTimeline(self._cpp)
        self._hooks = None
        self._want_hooks = hooks
        self._nvtx = nvtx
        self.attribute = bool(attribute)
        self.probe = bool(probe)
        self._thread: Optional[int] = None
        self._state = "new"  # "new" -> "running" -> "stopped"; a profiler runs once
        self.steps_taken = 0  # step() calls (CUDA steps are in history() once their events resolve)
        self.pending_samples = 0  # the hooks count the batches a step loaded
        self._on_step: List[Any] = []  # callbacks after each step (the doctor's progress, stop)
        #: Steps (numbered from the run's first) left out of summary(): steps a caller knows are
        #: not typical (the doctor's torch.compile trial: the steps that compiled).
        self.excluded_steps: List[int] = []

    # ---- lifecycle --------------------------------------------------------------------------
    def start(self) -> StepProfiler:
        """Turns recording on and starts the first step (``with prof:`` calls it)."""
        name = "torchspeed.profile.StepProfiler"
        if self._state == "running":
            raise RuntimeError(f"{name}: already running (nested `with` of one profiler?)")
        if self._state == "stopped":
            raise RuntimeError(f"{name}: a profiler runs once; make a new one to profile again")
        if _ranges._timeline() is not None:
            raise RuntimeError(f"{name}: another StepProfiler is running on this thread")
        _P._set_timeline(None)  # a timeline left by a profiler stopped from another thread
        with _lock:
            if self._want_hooks and _running["hooked"] is not None:
                raise RuntimeError(
                    f"{name}: hooks=True while another profiler with hooks runs (torch's hooks "
                    "are process-wide: one hooked profiler at a time)"
                )
            if _running["count"] == 0:
                _running["was_enabled"] = _P.enabled()
            _running["count"] += 1
            if self._want_hooks:
                _running["hooked"] = self
        _P.set_enabled(True)
        if self._nvtx:
            _P.set_nvtx(True)
        self._thread = threading.get_ident()
        _ranges._route.profiler = self
        if isinstance(self._timeline, _CudaTimeline):
            _P._set_timeline(self._timeline)
        self._state = "running"
        if self._want_hooks:
            self._hooks = TorchHooks(self)
            self._hooks.install()
        self._timeline.start()
        return self

    def stop(self) -> None:
        """Reads back outstanding CUDA events (one synchronization, after the last step), removes
        the hooks and restores the recording state. From any thread; a second call does nothing."""
        if self._state != "running":
            return
        self._state = "stopped"
        if self._hooks is not None:
            self._hooks.remove()
        # From another thread, the starting thread drops the timeline at its next phase range
        # (the route is per thread).
        self._timeline.closed = True
        if threading.get_ident() == self._thread:
            _P._set_timeline(None)
            _ranges._route.profiler = None
        self._timeline.flush()
        if self._nvtx:
            _P.set_nvtx(False)
        with _lock:
            _running["count"] -= 1
            if _running["hooked"] is self:
                _running["hooked"] = None
            if _running["count"] == 0:
                _P.set_enabled(_running["was_enabled"])

    def __enter__(self) -> StepProfiler:
        return self.start()

    def __exit__(self, *exc) -> bool:
        self.stop()
        return False

    def step(self, samples: Optional[int] = None) -> None:
        """Ends the current step; ``samples`` is its batch size (for samples/s; with hooks the
        loader's batches are counted when it is None). The first step() of a profiler never
        started starts it (and records no step)."""
        name = "torchspeed.profile.StepProfiler.step"
        if samples is not None and (
            isinstance(samples, bool) or not isinstance(samples, int) or not 0 <= samples < 2**63
        ):
            raise ValueError(f"{name}: samples must be None or an int >= 0, got {samples!r}")
        if self._state == "new":
            self.start()
            return
        if self._state == "stopped":
            raise RuntimeError(f"{name}: the profiler was stopped")
        if threading.get_ident() != self._thread:
            raise RuntimeError(f"{name}: call it from the thread that started the profiler")
        n = self.pending_samples if samples is None else samples
        self.pending_samples = 0
        self._timeline.step(n)
        self.steps_taken += 1
        if self._hooks is not None:
            self._hooks.on_step()
        for cb in self._on_step:
            cb(self)

    # ---- results ----------------------------------------------------------------------------
    @property
    def steps(self) -> int:
        return self._cpp.steps

    def history(self) -> StepHistory:
        """The kept steps' times in ns (see StepHistory)."""
        cuda = isinstance(self._timeline, _CudaTimeline)
        if cuda and self._state != "running":
            self._timeline.flush()
        h = self._cpp.history()
        return StepHistory(
            step_ns=[e - b for b, e in zip(h["begin_ns"], h["end_ns"])],
            phase_ns={p: list(h["phase_ns"][p]) for p in PHASES},
            end_ns=list(h["end_ns"]),
            samples=list(h["samples"]),
            clock="cuda" if cuda else "host",
            steps_dropped=h["steps_dropped"],
        )

    def summary(self, gather: bool = True, exclude: Sequence[int] = ()) -> StepSummary:
        """Median/p90/share per phase over the kept steps after ``warmup``, less the steps
        ``exclude`` names (numbered from the run's first, as ``steps_taken`` counts them). In a
        distributed run (torch.distributed initialized) with ``gather``, every rank must call it:
        rank 0's summary then lists every rank's (``ranks``)."""
        history = self.history()
        drop = self.left_out_steps() + list(exclude)
        if drop:
            history = without_steps(history, drop)
        s = summarize(history, skip_first=self.first_kept_step())
        s.dropped_events = int(_P.dropped_events())
        if gather:
            gather_summaries(s)
        return s

    def first_kept_step(self) -> int:
        """The steps before it are left out of summary() as warm-up: ``warmup``, or the steps a
        backward-driven guess recorded before the first optimizer step."""
        skip = self.warmup
        if self._hooks is not None and self._hooks.steps_switched_at:
            skip = max(skip, self._hooks.steps_switched_at)
        return skip

    def left_out_steps(self) -> List[int]:
        """The steps summary() leaves out besides the warm-up (numbered from the run's first):
        ``excluded_steps``, and the step torch.profiler recorded (it runs several times slower:
        not a typical step)."""
        drop = list(self.excluded_steps)
        if self._hooks is not None and self._hooks.module_sampler is not None:
            drop += self._hooks.module_sampler.perturbed_steps()
        return drop

    def facts(self) -> RunFacts:
        """What the hooks saw (models, optimizers, loaders, counters); defaults without hooks."""
        if self._hooks is None:
            return RunFacts(device_type=self.device, steps=self.steps)
        return self._hooks.facts()

    def advice(self, summary: Optional[StepSummary] = None) -> list:
        return advise(summary if summary is not None else self.summary(), self.facts())

    def report(self, summary: Optional[StepSummary] = None) -> str:
        """The summary table and the ranked advice, as printed at the end of ``torchspeed doctor``."""
        s = summary if summary is not None else self.summary()
        facts = self.facts()
        text = format_summary(s)
        for line in (describe_step_source(facts), describe_page_faults(facts)):
            if line:
                text += "\n" + line
        if facts.attribution is not None:
            text += "\n\n" + facts.attribution.format()
        return text + "\n\n" + format_findings(advise(s, facts))

    def export_chrome_trace(self, path: str) -> str:
        """Chrome trace JSON of every thread's ranges plus this profiler's steps (Perfetto)."""
        return _ranges.export_chrome_trace(path, self)

    def write_png(self, path: str) -> Optional[str]:
        return write_png(self.history(), path)

    def write_tensorboard(self, logdir: str) -> bool:
        return write_tensorboard(self.history(), logdir)

    def __repr__(self) -> str:
        return (
            f"torchspeed.profile.StepProfiler(device={self.device!r}, hooks={self._want_hooks}, "
            f"step_on={self.step_on!r}, steps={self.steps}, clock={_P.clock_source()!r})"
        )
