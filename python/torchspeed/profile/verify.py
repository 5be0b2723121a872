"""`torchspeed doctor --verify`: advice that checks itself. The script is run a few steps as it is,
then once more per applicable fix with the fix applied from outside (no edit), and each fix's
measured gain is printed beside the estimate, with the loss drift over those steps so a numerics
change shows. The headspace run serves the first batch again and again: the step time with the
data already in memory, which proves or refutes a data bottleneck.

Each run executes the script again from its start in this process (its files are written again).
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import os
import random
import statistics
import time
from typing import Any, Callable, Dict, Iterator, List, Optional, Tuple

import torch

from .summary import Finding


@dataclasses.dataclass
class VerifyRow:
    fix: str
    rule: str
    estimated_gain_s: Optional[float]
    step_median_s: float
    measured_gain_s: float  # the step median's drop
    loss_drift: Optional[float]  # max |loss - baseline loss| / |baseline loss| over the steps
    #: The drop of the medians of the phases the fix acts on (PHASES_OF), the figure its
    #: estimate is about; steadier than the step's on a loaded machine.
    phase_gain_s: Optional[float] = None
    phases: Tuple[str, ...] = ()
    advised: bool = True  # False: tried to show why the doctor does not advise it
    #: torch.compile's trial: seconds the compiling steps took above the median step (those
    #: steps are left out of its medians), over the first round's run; None for other fixes.
    compile_s: Optional[float] = None
    #: Why torch.compile failed in the trial ("" when it did not): the row then measures eager.
    compile_error: str = ""
    #: Measured on one step of each pair of its run (Alternating): the gains are the other
    #: steps' medians minus the fix's steps', side by side under the same load.
    paired: bool = False
    #: Tried on top of another fix (its name): measured against that fix's run of each round.
    on_top_of: str = ""


#: format_rows says the check is noisy when the runs as the script is differ by more than this.
BASELINE_SPREAD = 1.3
#: est/meas is printed only for a measured gain of at least this (the table's 0.1 ms): a run
#: measured 0.0 ms for torch.compile and the ratio read 554.31.
MIN_RATIO_GAIN_S = 1e-4

#: The phases column of a fix measured in forward+backward's CPU time (StepCpu).
CPU_TIME = "cpu time"
#: ... and of one measured in this process's system time per step (the malloc fix: page faults).
SYSTEM_TIME = "system time"

#: The phases each fix acts on: its estimate is about their time.
PHASES_OF = {
    "amp": ("forward", "backward"),
    "amp_not_advised": ("forward", "backward"),
    "channels_last": ("forward", "backward"),
    "cudnn_benchmark": ("forward", "backward"),
    # Preemption costs every phase, in a different one each step: the step is what it moves.
    "cpu_threads": ("step",),
    # Page faults land in whichever phase allocates: the step.
    "malloc": ("step",),
    "compile": ("forward", "backward"),
    "optimizer": ("optimizer",),
    "data_wait": ("data_wait",),
    "headspace": ("data_wait",),
}


@contextlib.contextmanager
def _patched(owner, name: str, value) -> Iterator[None]:
    own = name in vars(owner)
    orig = vars(owner)[name] if own else None
    setattr(owner, name, value)
    try:
        yield
    finally:
        if own:
            setattr(owner, name, orig)
        else:
            delattr(owner, name)


@contextlib.contextmanager
def losses_recorded(out: List[float]) -> Iterator[None]:
    """Records the value of each scalar a backward starts from (the loss)."""
    orig = torch.autograd.backward

    def backward(tensors, *args, **kwargs):
        t = tensors[0] if isinstance(tensors, (list, tuple)) and tensors else tensors
        if isinstance(t, torch.Tensor) and t.numel() == 1:
            out.append(float(t.detach().float()))
        return orig(tensors, *args, **kwargs)

    with _patched(torch.autograd, "backward", backward):
        yield


@contextlib.contextmanager
def _global_forward_hooks(pre, post) -> Iterator[None]:
    """pre and post as global module forward hooks (post always called), removed on exit."""
    from torch.nn.modules import module as mm

    h1 = mm.register_module_forward_pre_hook(pre)
    h2 = mm.register_module_forward_hook(post, always_call=True)
    try:
        yield
    finally:
        h1.remove()
        h2.remove()


@contextlib.contextmanager
def autocast_bf16(when: Optional[Callable[[], bool]] = None) -> Iterator[None]:
    """torch.autocast(bfloat16) around every outermost module forward (for which ``when()`` is
    true, when given)."""

    state = {"depth": 0, "ctx": None}

    def pre(module, args):
        if state["depth"] == 0 and (when is None or when()):
            p = next(module.parameters(), None)
            dev = p.device.type if p is not None else "cpu"
            state["ctx"] = torch.autocast(dev, dtype=torch.bfloat16)
            state["ctx"].__enter__()
        state["depth"] += 1

    def post(module, args, output):
        state["depth"] -= 1
        if state["depth"] == 0 and state["ctx"] is not None:
            state["ctx"].__exit__(None, None, None)
            state["ctx"] = None

    with _global_forward_hooks(pre, post):
        yield


class StepCpu:
    """Each step's forward+backward CPU time: this process's (all its threads), from the step's
    first module forward to its optimizer step (to the step's end without one, or when the
    forward runs inside the step: an LBFGS closure). With one intra-op thread it is their
    compute, which preemption by other processes does not move: the demo's forward+backward
    took 33-115 ms of wall time a step beside its loader workers, and 40-60 ms of CPU time.
    Entered around a run (``forward_hook=False``: its owner calls ``seen()`` at each forward)."""

    def __init__(self, forward_hook: bool = True):
        self.forward_hook = forward_hook
        self.prof: Any = None
        self.threads: set = set()  # torch's intra-op threads seen at the forwards
        self._cpu_ns: Dict[int, int] = {}  # step -> forward+backward's CPU time in it
        self._fwd_at: Dict[int, int] = {}  # step -> the CPU clock at its first forward
        self._opt_at: Dict[int, int] = {}  # step -> the CPU clock at its optimizer step
        self._stack: Optional[contextlib.ExitStack] = None

    def seen(self) -> Any:
        """At a module forward: the running profiler (None outside one)."""
        from .hooks import running_profiler

        prof = running_profiler()
        if prof is None:
            return None
        if prof is not self.prof:
            self.prof = prof
            # Before the doctor's own callback, which ends the run at its last step.
            prof._on_step.insert(0, self._step_done)
        self.threads.add(torch.get_num_threads())
        self._fwd_at.setdefault(prof.steps_taken, time.process_time_ns())
        return prof

    def _pre(self, module: Any, args: Any) -> None:
        if not torch.compiler.is_compiling():
            self.seen()

    def _step_done(self, prof: Any) -> None:
        step = prof.steps_taken - 1
        if step in self._fwd_at:
            end = self._opt_at.get(step)
            if end is None or end < self._fwd_at[step]:
                end = time.process_time_ns()
            self._cpu_ns[step] = end - self._fwd_at[step]

    def _opt_pre(self, opt: Any, args: Any, kwargs: Any) -> None:
        if self.prof is not None:
            self._opt_at.setdefault(self.prof.steps_taken, time.process_time_ns())

    def median_s(self, steps: Optional[List[int]] = None, system: bool = False) -> Optional[float]:
        """The median over ``steps`` (default: all) less those the run's summary leaves out and
        the first (warm-up); None without one intra-op thread throughout (spin-waits of the
        others then count as CPU time, and preemption moves them) or without such a step.
        system: this process's system time in the whole step (page faults, system calls), on
        any number of threads, as the doctor's hooks record it (malloc.PageFaults)."""
        prof = self.prof
        if prof is None or (self.threads != {1} and not system):
            return None
        if system:
            hooks = getattr(prof, "_hooks", None)
            per = hooks.page_faults.system_s if hooks is not None else {}
        else:
            per = {k: v / 1e9 for k, v in self._cpu_ns.items()}
        left_out = set(prof.left_out_steps())
        kept = sorted(per) if steps is None else steps
        kept = [i for i in kept if i not in left_out and i in per][prof.warmup :]
        return statistics.median(per[i] for i in kept) if kept else None

    def __enter__(self) -> StepCpu:
        from torch.nn.modules import module as mm
        from torch.optim.optimizer import register_optimizer_step_pre_hook

        self.prof, self.threads = None, set()
        self._cpu_ns, self._fwd_at, self._opt_at = {}, {}, {}
        self._stack = contextlib.ExitStack()
        if self.forward_hook:
            self._stack.callback(mm.register_module_forward_pre_hook(self._pre).remove)
        self._stack.callback(register_optimizer_step_pre_hook(self._opt_pre).remove)
        return self

    def __exit__(self, *exc) -> bool:
        self._stack.close()
        if self.prof is not None and self._step_done in self.prof._on_step:
            self.prof._on_step.remove(self._step_done)
        return False


class Alternating:
    """A fix applied on one step of every two of one run, so that its steps and the steps
    without it are measured side by side, under the same load: on a shared machine the speed
    moves between runs a minute apart by more than a compute fix gains (the demo's
    forward+backward moved 2-32 ms between runs of one fix). Which step of each pair gets the
    fix is drawn at random: a strict odd/even order would beat in step with anything else of
    period two (two loader workers take the batches in turn). ``make(when)`` makes the fix's
    context, applying it where ``when()`` is true; ``also`` are contexts applied to the whole
    run (the threads fix a compute fix is tried on top of). After the run, ``halves()`` gives
    the summaries of the steps without the fix and with it, and ``cpu_halves()`` their
    forward+backward's median CPU seconds (StepCpu)."""

    def __init__(self, make: Callable[[Callable[[], bool]], Any], seed: Optional[int] = None):
        self.make = make
        self.also: List[Callable[[], Any]] = []
        self.clock = StepCpu(forward_hook=False)
        self._rng = random.Random(seed)
        self._first_on: Dict[int, bool] = {}  # pair of steps -> whether its first has the fix
        self._stack: Optional[contextlib.ExitStack] = None

    @property
    def prof(self) -> Any:
        return self.clock.prof

    def applied_at(self, step: int) -> bool:
        """Whether the fix is applied on the step (numbered from the run's first)."""
        pair = step // 2
        if pair not in self._first_on:
            self._first_on[pair] = self._rng.random() < 0.5
        return (step % 2 == 0) == self._first_on[pair]

    def on(self) -> bool:
        """Whether the step in progress is one of the fix's."""
        prof = self.clock.seen()
        return prof is not None and self.applied_at(prof.steps_taken)

    def _sides(self) -> Optional[Tuple[List[int], List[int]]]:
        prof = self.prof
        if prof is None or prof.steps_taken < 4:
            return None
        steps = range(prof.steps_taken + 1)
        return (
            [i for i in steps if not self.applied_at(i)],
            [i for i in steps if self.applied_at(i)],
        )

    def halves(self) -> Optional[tuple]:
        """(summary of the steps without the fix, summary of the steps with it), each leaving
        out its first step as warm-up; None when the run took fewer than 4 steps."""
        sides = self._sides()
        if sides is None:
            return None
        off, on = sides
        return self.prof.summary(gather=False, exclude=on), self.prof.summary(
            gather=False, exclude=off
        )

    def cpu_halves(self) -> Optional[Tuple[float, float]]:
        """Forward+backward's median CPU seconds in the steps without the fix and with it (the
        steps halves() keeps); None when the run took fewer than 4 steps or did not run on one
        intra-op thread (StepCpu.median_s)."""
        sides = self._sides()
        if sides is None:
            return None
        off, on = (self.clock.median_s(side) for side in sides)
        return None if off is None or on is None else (off, on)

    def __enter__(self) -> Alternating:
        self._stack = contextlib.ExitStack()
        self._stack.enter_context(self.clock)
        for make in self.also:
            self._stack.enter_context(make())
        self._stack.enter_context(self.make(self.on))
        return self

    def __exit__(self, *exc) -> bool:
        self._stack.close()
        return False


_TORCH_TO_TORCHSPEED = ("SGD", "Adam", "AdamW")


@contextlib.contextmanager
def torchspeed_optimizer(fold_clip: bool = False) -> Iterator[None]:
    """torch.optim.SGD/Adam/AdamW made as torchspeed's (same hyperparameters); with fold_clip,
    clip_grad_norm_ becomes the optimizer's max_grad_norm (the first max_norm seen)."""
    from .. import optim as ts_optim

    made: List[torch.optim.Optimizer] = []
    with contextlib.ExitStack() as stack:
        for name in _TORCH_TO_TORCHSPEED:
            cls = getattr(ts_optim, name)

            def make(*args, _cls=cls, **kwargs):
                for k in ("foreach", "fused", "capturable", "differentiable"):
                    kwargs.pop(k, None)
                opt = _cls(*args, **kwargs)
                made.append(opt)
                return opt

            stack.enter_context(_patched(torch.optim, name, make))
        if fold_clip:
            orig = torch.nn.utils.clip_grad_norm_

            def clip(parameters, max_norm, *args, **kwargs):
                if not made:
                    return orig(parameters, max_norm, *args, **kwargs)
                for opt in made:
                    for g in opt.param_groups:
                        if g.get("max_grad_norm") is None:
                            g["max_grad_norm"] = float(max_norm)
                return torch.zeros(())

            stack.enter_context(_patched(torch.nn.utils, "clip_grad_norm_", clip))
        yield


@contextlib.contextmanager
def more_workers(n: int) -> Iterator[None]:
    """torch DataLoaders made with num_workers=0 get n workers."""
    from torch.utils.data import dataloader as dl

    orig = dl.DataLoader.__init__

    def __init__(self, *args, **kwargs):
        if kwargs.get("num_workers", 0) == 0 and len(args) < 6:
            kwargs["num_workers"] = n
        orig(self, *args, **kwargs)

    with _patched(dl.DataLoader, "__init__", __init__):
        yield


@contextlib.contextmanager
def torch_threads(n: int) -> Iterator[None]:
    """torch's intra-op threads set to n for the run, as torch.set_num_threads(n) at the start of
    the script would; restored after."""
    before = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


@contextlib.contextmanager
def channels_last(when: Optional[Callable[[], bool]] = None) -> Iterator[None]:
    """Each outermost module forward: the module and its 4-D floating-point inputs in
    torch.channels_last, as model.to(memory_format=...) and x.contiguous(memory_format=...) in
    the script would put them (the parameters stay the same objects, the optimizer keeps them).
    With ``when``: only in the forwards where ``when()`` is true, the module put back in
    torch.contiguous_format in the others (each switch, one copy of its 4-D parameters: on an
    every-other-step run both sides pay about as many)."""

    fmt = torch.channels_last
    state: Dict[str, Any] = {"depth": 0, "layout": {}}  # id(module) -> the format it is in

    def convert(a):
        if isinstance(a, torch.Tensor) and a.dim() == 4 and a.is_floating_point():
            return a.contiguous(memory_format=fmt)
        return a

    def pre(module, args):
        state["depth"] += 1
        if state["depth"] > 1:
            return None
        on = when is None or when()
        want = fmt if on else torch.contiguous_format
        if state["layout"].get(id(module), torch.contiguous_format) != want:
            module.to(memory_format=want)
            state["layout"][id(module)] = want
        return tuple(convert(a) for a in args) if on else None

    def post(module, args, output):
        state["depth"] -= 1

    with _global_forward_hooks(pre, post):
        yield


#: The compile trial's backend (tests may use "eager": dynamo's capture without inductor).
COMPILE_BACKEND = "inductor"
#: Steps after a compiling step also left out of the trial's medians: a new compiled graph's
#: first calls still run slow (measured on a small MLP on this CPU: the 2 calls after the
#: compiling one took ~100x a steady one).
COMPILE_SETTLE_STEPS = 2
#: What the last CompiledModel run measured, for verify(): {"compile_s": s, "steps": n,
#: "error": why torch.compile failed ("" when it did not)}.
last_compile: Dict[str, Any] = {}


def _compile_count() -> int:
    from torch._dynamo.utils import counters

    return sum(counters["stats"].values())


class CompiledModel:
    """Each outermost module forward in training mode runs through torch.compile, as
    ``model = torch.compile(model)`` in the script would: its bound forward is compiled and set
    on the module (from its second call: the first has started when the hook runs), removed on
    exit. A step in which something compiled, and COMPILE_SETTLE_STEPS after it, are left out of
    the run's summary (StepProfiler.excluded_steps); on exit last_compile holds their time above
    the median of the other steps."""

    def __init__(self, backend: Any = None):  # a backend name or callable (torch.compile)
        self.backend = backend or COMPILE_BACKEND
        self.state = {"depth": 0}
        self.patched: List[Any] = []
        self.prof = None
        self.steps: List[int] = []
        self.error = ""  # why torch.compile failed, when it did
        self._stack: Optional[contextlib.ExitStack] = None

    def _mark(self) -> None:
        from .hooks import running_profiler

        prof = running_profiler()
        if prof is None:
            return
        self.prof = prof
        i = prof.steps_taken  # the step in progress, numbered from the run's first
        new = [j for j in range(i, i + 1 + COMPILE_SETTLE_STEPS) if j not in self.steps]
        self.steps += new
        prof.excluded_steps.extend(new)

    def _compile(self, module: Any) -> None:
        from torch._dynamo.exc import TorchDynamoException

        eager = module.forward
        compiled = torch.compile(eager, backend=self.backend)

        def forward(*args, **kwargs):
            if self.error:
                return eager(*args, **kwargs)
            before = _compile_count()
            try:
                out = compiled(*args, **kwargs)
            except TorchDynamoException as e:
                # torch.compile failed on this model: the trial runs on eagerly and says so
                # (an error from the script's own code is not a TorchDynamoException).
                lines = str(e).strip().splitlines()
                self.error = f"{type(e).__name__}: {lines[0] if lines else ''}"[:300]
                return eager(*args, **kwargs)
            if _compile_count() != before:
                self._mark()
            return out

        forward._torchspeed_compile_trial = True
        module.forward = forward
        self.patched.append(module)

    def _pre(self, module, args):
        if torch.compiler.is_compiling():
            return
        self.state["depth"] += 1
        if self.state["depth"] > 1 or not module.training or not torch.is_grad_enabled():
            return
        if any(m is module for m in self.patched) or "forward" in vars(module):
            return  # done, or a forward the script set itself
        if type(module).__name__ == "OptimizedModule" or getattr(
            module, "_compiled_call_impl", None
        ):
            return  # the script compiles it already
        self._compile(module)

    def _post(self, module, args, output):
        if not torch.compiler.is_compiling():
            self.state["depth"] -= 1

    def __enter__(self) -> CompiledModel:
        last_compile.clear()
        self._stack = contextlib.ExitStack()
        self._stack.enter_context(_global_forward_hooks(self._pre, self._post))
        # The script's deepcopy / pickle / torch.save of the model must not carry the trial's
        # forward (a copy would run the original's weights): dropped from the state, as torch
        # drops its own _compiled_call_impl.
        orig = torch.nn.Module.__getstate__

        def __getstate__(module):
            state = orig(module)
            if getattr(state.get("forward"), "_torchspeed_compile_trial", False):
                state.pop("forward")
            return state

        self._stack.enter_context(_patched(torch.nn.Module, "__getstate__", __getstate__))
        return self

    def __exit__(self, *exc) -> bool:
        self._stack.close()
        for m in self.patched:
            if "forward" in vars(m):
                del m.forward
        self.patched = []
        extra = 0.0
        if self.prof is not None and self.steps:
            h = self.prof.history()
            first = h.steps_dropped
            idx = [i - first for i in self.steps if 0 <= i - first < len(h)]
            rest = [x for k, x in enumerate(h.step_ns) if k not in idx and k >= self.prof.warmup]
            typical = statistics.median(rest) if rest else 0.0
            extra = sum(max(h.step_ns[k] - typical, 0.0) for k in idx) / 1e9
        last_compile.update(compile_s=extra, steps=float(len(self.steps)), error=self.error)
        return False


def set_cudnn_benchmark(on: bool) -> bool:
    """Sets torch.backends.cudnn.benchmark and returns what it was. Through torch's own setter:
    assigning the attribute raises once torch's test utilities froze the global flags
    (disable_global_flags), and cudnn.flags() would reset every other cudnn flag as well."""
    prev = bool(torch._C._get_cudnn_benchmark())
    torch._C._set_cudnn_benchmark(bool(on))
    return prev


@contextlib.contextmanager
def cudnn_benchmark() -> Iterator[None]:
    prev = set_cudnn_benchmark(True)
    try:
        yield
    finally:
        set_cudnn_benchmark(prev)


@contextlib.contextmanager
def headspace() -> Iterator[None]:
    """Each DataLoader iterator serves its first batch again and again: no data cost."""
    from torch.utils.data import dataloader as dl

    orig = dl._BaseDataLoaderIter.__next__
    first: Dict[int, object] = {}

    def __next__(it):
        key = id(it)
        if key not in first:
            first[key] = orig(it)
        return first[key]

    with _patched(dl._BaseDataLoaderIter, "__next__", __next__):
        yield


def _fixes(findings: List[Finding], facts: Any) -> List[tuple]:
    """(name, rule, context factory, advised) for each fix that applies to the run: those its
    findings call for, and those the doctor measured and does not advise (bf16 autocast on a CPU
    without native bf16, torchspeed's optimizer below the share threshold), so the measurement
    behind the decision shows beside it."""
    from .rules import _nchw_convs

    rules = {f.rule for f in findings}
    probes = getattr(facts, "probes", None) or {}
    out = []
    if "amp" in rules:
        out.append(("bf16 autocast", "amp", lambda: Alternating(autocast_bf16), True))
    elif "amp_not_advised" in rules or (
        "bf16" in probes and not getattr(facts, "autocast_used", False)
    ):
        # Measured by the probe but not advised (slower, or forward+backward too small a part
        # of the step for the rule): tried, so the measurement shows.
        out.append(
            (
                "bf16 autocast (not advised)",
                "amp_not_advised",
                lambda: Alternating(autocast_bf16),
                False,
            )
        )
    if "channels_last" in rules or (
        getattr(facts, "device_type", "cpu") == "cpu"
        and (_nchw_convs(facts) or probes.get("nchw_convs"))
    ):
        advised = "channels_last" in rules
        name = "channels_last" + ("" if advised else " (not advised)")
        # Side by side, as bf16: between runs, forward+backward's CPU time moved by more than
        # channels_last gains (Zen 3: 3-7 ms measured against 19-23 ms estimated, against the
        # run with 1 thread; in one process, NCHW's moved from 76 to 57 ms a step).
        out.append((name, "channels_last", lambda: Alternating(channels_last), advised))
    if "cudnn_benchmark" in rules:
        out.append(("cudnn.benchmark", "cudnn_benchmark", cudnn_benchmark, True))
    if "malloc" in rules:
        from .malloc import keep_freed_memory

        out.append(("malloc thresholds", "malloc", keep_freed_memory, True))
    if "compile" in rules:
        out.append(("torch.compile(model)", "compile", CompiledModel, True))
    if "cpu_threads" in rules:
        from .rules import advised_threads

        n = advised_threads(facts) or 1
        out.append(
            (
                f"{n} torch thread{'s' if n > 1 else ''}",
                "cpu_threads",
                lambda: torch_threads(n),
                True,
            )
        )
    # A torch optimizer with a torchspeed counterpart was seen: the probe timed that counterpart
    # (the optimizer objects may be gone by now, with the script's frames).
    if "optimizer" in rules or "clip_into_optimizer" in rules or "fused_optimizer_s" in probes:
        fold = "clip_into_optimizer" in rules
        name = "torchspeed optimizer" + (" + max_grad_norm" if fold else "")
        advised = "optimizer" in rules or fold
        name += "" if advised else " (below the threshold)"
        out.append((name, "optimizer", lambda: torchspeed_optimizer(fold_clip=fold), advised))
    if "data_wait" in rules or "num_workers_zero" in rules:
        # more_workers changes only loaders made with num_workers=0: no trial when none was seen
        # (a loader that has workers already would run unchanged under a misleading name).
        from .facts import _loaders

        if any(info.num_workers == 0 for info in _loaders(facts)) or "num_workers_zero" in rules:
            n = max(1, min(4, (os.cpu_count() or 2) - 1))
            out.append((f"{n} loader workers", "data_wait", lambda: more_workers(n), True))
        out.append(("headspace (data in memory)", "headspace", headspace, True))
    return out


#: The fixes of forward+backward's compute: when the doctor found torch's threads oversubscribed
#: (cpu_threads), the contention distorts their measurement (a parallel op's barrier waits on a
#: preempted thread), so they are tried on top of the threads fix, against that run.
_STACKED = ("amp", "amp_not_advised", "channels_last", "compile")


@contextlib.contextmanager
def _together(*makes: Callable[[], Any]) -> Iterator[None]:
    with contextlib.ExitStack() as stack:
        for make in makes:
            stack.enter_context(make())
        yield


#: The fixes the compute fixes are tried on top of, in this order: each changes how every step
#: runs (threads preempted, pages faulted), and a compute fix measured without it measures that
#: too. The malloc fix cannot be undone in a process (malloc.keep_freed_memory): it and the
#: fixes on top of it run after the last run as the script is.
_UNDER = ("cpu_threads", "malloc")
_IRREVERSIBLE = ("malloc",)


def _stacked(fixes: List[tuple]) -> Tuple[List[tuple], Dict[int, int], set]:
    """(fixes, on_top_of, late): cpu_threads first, then malloc on top of it, then each compute
    fix on top of both (those that apply); on_top_of maps a fix's index to the index of the fix
    whose run it is measured against, late holds the indices run after the last run as the
    script is (the malloc fix and what is on top of it)."""
    out: List[tuple] = []
    on_top_of: Dict[int, int] = {}
    late: set = set()
    below: Optional[tuple] = None  # (name, make, index) of the last fix of _UNDER placed
    for rule in _UNDER:
        fix = next((f for f in fixes if f[1] == rule), None)
        if fix is None:
            continue
        name, _, make, advised = fix
        if below is not None:
            name, make = _on_top(name, make, below)
            on_top_of[len(out)] = below[2]
        if rule in _IRREVERSIBLE or (below is not None and below[2] in late):
            late.add(len(out))
        below = (name, make, len(out))
        out.append((name, rule, make, advised))
    for name, rule, make, advised in fixes:
        if rule in _UNDER:
            continue
        if rule in _STACKED and below is not None:
            name, make = _on_top(name, make, below)
            on_top_of[len(out)] = below[2]
            if below[2] in late:
                late.add(len(out))
        out.append((name, rule, make, advised))
    return out, on_top_of, late


def _on_top(name: str, make: Callable, below: tuple) -> Tuple[str, Callable]:
    """The fix's name and make() with the fix ``below`` applied under it, for the whole run."""
    below_name, below_make, _ = below

    def both(make=make):
        fix = make()
        if isinstance(fix, Alternating):
            fix.also.append(below_make)
            return fix
        return _together(below_make, lambda: fix)

    return f"{name} + {below_name}", both


def _drift(losses: List[float], base_losses: List[float]) -> Optional[float]:
    """max |loss - baseline loss| / |baseline loss| over the steps both runs have."""
    n = min(len(losses), len(base_losses))
    if not n:
        return None
    drift = max(abs(a - b) / max(abs(b), 1e-12) for a, b in zip(losses[:n], base_losses[:n]))
    return drift if math.isfinite(drift) else float("inf")


#: Fixes whose estimate is their phases' time in the first run x a measured ratio (or the phase
#: itself: the headspace's is the whole data wait).
_PROPORTIONAL = ("amp", "amp_not_advised", "channels_last", "compile", "headspace")


def _scales_with_phase(rule: str, facts: Any) -> bool:
    if rule in _PROPORTIONAL:
        return True
    # The optimizer's: the phase x torchspeed's step / the script's own, when both were probed
    # (else the phase minus torchspeed's one-thread step, not a ratio).
    probes = getattr(facts, "probes", None) or {}
    return rule == "optimizer" and "own_optimizer_s" in probes


def _phase_median(summary: Any, phases: Tuple[str, ...]) -> float:
    if phases == ("step",):
        return summary.step_median_s
    return sum(summary.phases[p].median_s for p in phases if p in summary.phases)


def verify(run_steps: Callable[..., tuple], rounds: int = 1) -> list:
    """run_steps(context, advise) runs the script's first steps under the context and returns
    (summary, losses, findings, facts); findings and facts only with advise=True (the first
    run's: the probes run once). Returns the rows: the baseline, one per fix that applies, and
    the baseline again after them (when a fix applied). The headspace run's estimate is the whole
    data wait.

    Each of `rounds` rounds runs every fix once, and a run as the script is comes before each
    round and after the last: a fix's gain in a round is against the mean of the two runs around
    it (on a shared machine the load moves between runs), and a row reports the median over the
    rounds (its step and gains), so one disturbed run does not decide it.

    The malloc fix cannot be undone in the process: it and the fixes tried on top of it run
    after the last run as the script is, in rounds of their own, and its first run probes the
    model again (advise=True), so that the ratios of the fixes on top of it are measured with
    the memory kept as in their runs."""
    from .rules import verify_estimates

    # ("base", k) for the runs as the script is, (round, fix) for the trials -> their medians:
    system: Dict[Any, float] = {}  # the system time a step
    cpu_runs: Dict[Any, float] = {}  # forward+backward's CPU seconds (on one torch thread)

    def timed(key: Any, ctx: Any, advise: bool, fix: bool = True) -> tuple:
        """run_steps under ctx, its medians recorded under key: the system time a step, and
        for a fix's trial forward+backward's CPU time (on one torch thread)."""
        clock = StepCpu()
        out = run_steps(_together(lambda: clock, lambda: ctx), advise)
        for store, median in (
            (system, clock.median_s(system=True)),
            (cpu_runs, clock.median_s() if fix else None),
        ):
            if median is not None:
                store[key] = median
        return out

    def as_is(k: int, advise: bool = False) -> tuple:
        """A run as the script is (the k-th)."""
        return timed(("base", k), contextlib.nullcontext(), advise, fix=False)

    base, base_losses, findings, facts = as_is(0, True)
    estimates = verify_estimates(base, facts)
    estimates.update({f.rule: f.est_gain_s for f in findings if f.est_gain_s > 0})
    estimates["headspace"] = _phase_median(base, ("data_wait",))
    fixes, on_top_of, late = _stacked(_fixes(findings, facts))
    if not fixes:
        return [VerifyRow("as the script is", "", None, base.step_median_s, 0.0, 0.0)]
    bases = [base]
    trials: List[list] = []  # [round][fix] -> (summary, losses, ...)
    compile_s: Dict[int, float] = {}  # fix -> the first round's compile time
    compile_error: Dict[int, str] = {}  # fix -> why torch.compile failed (any round)
    paired: Dict[tuple, tuple] = {}  # (round, fix) -> an Alternating run's halves
    cpu: Dict[tuple, tuple] = {}  # (round, fix) -> its halves' forward+backward CPU seconds

    def trial(r: int, i: int, make: Callable, advise: bool = False) -> tuple:
        last_compile.clear()
        ctx = make()
        if isinstance(ctx, Alternating):
            out = run_steps(ctx, False)
            halves = ctx.halves()
            if halves is not None:
                paired[(r, i)] = halves
                both = ctx.cpu_halves()
                if both is not None:
                    cpu[(r, i)] = both
        else:
            out = timed((r, i), ctx, advise)
        if "compile_s" in last_compile and i not in compile_s:
            compile_s[i] = last_compile["compile_s"]
        if last_compile.get("error"):
            compile_error.setdefault(i, last_compile["error"])
        return out

    n_rounds = max(1, rounds)
    for r in range(n_rounds):
        if r:
            bases.append(as_is(len(bases))[0])
        trials.append(
            [None if i in late else trial(r, i, make) for i, (_, _, make, _) in enumerate(fixes)]
        )
    bases.append(as_is(len(bases))[0])
    for r in range(n_rounds if late else 0):
        for i in sorted(late):
            reprobe = r == 0 and fixes[i][1] in _IRREVERSIBLE
            trials[r][i] = trial(r, i, fixes[i][2], advise=reprobe)
            if reprobe and trials[r][i][3] is not None:
                # The ratios of the fixes on top of it, probed with the memory kept.
                again = verify_estimates(base, trials[r][i][3])
                for j in late:
                    rule_j = fixes[j][1]
                    if on_top_of.get(j) == i and again.get(rule_j) is not None:
                        estimates[rule_j] = again[rule_j]
    rows = [VerifyRow("as the script is", "", None, base.step_median_s, 0.0, 0.0)]
    for i, (name, rule, _, advised) in enumerate(fixes):
        phases = PHASES_OF.get(rule, ())
        below_i = on_top_of.get(i)
        stacked = below_i is not None
        steps, gains, phase_gains, est = [], [], [], estimates.get(rule)
        refs = []  # per round: the phase time the fix's run is measured against
        cpu_pairs = []  # per round: (the reference's forward+backward CPU seconds, the fix's)
        sys_pairs = []  # per round: (the reference's system seconds a step, the fix's)
        for r, round_trials in enumerate(trials):
            s = round_trials[i][0]
            if (r, i) in paired:
                # Every other step: against the run's own steps without the fix.
                ref, s = paired[(r, i)]
                before_s, before_p = ref.step_median_s, _phase_median(ref, phases)
                if (r, i) in cpu:
                    cpu_pairs.append(cpu[(r, i)])
            elif stacked:
                # Tried on top of another fix: measured against that fix's run of the round.
                ref = round_trials[below_i][0]
                before_s, before_p = ref.step_median_s, _phase_median(ref, phases)
                if (r, below_i) in cpu_runs and (r, i) in cpu_runs:
                    cpu_pairs.append((cpu_runs[(r, below_i)], cpu_runs[(r, i)]))
            else:
                before_s = 0.5 * (bases[r].step_median_s + bases[r + 1].step_median_s)
                before_p = 0.5 * sum(_phase_median(b, phases) for b in bases[r : r + 2])
            if rule == "malloc":
                # Its phase: this process's system time (page faults), on any threads.
                refs_sys = (
                    [system.get((r, below_i))]
                    if stacked
                    else [system.get(("base", r)), system.get(("base", r + 1))]
                )
                if (r, i) in system and None not in refs_sys:
                    sys_pairs.append((statistics.mean(refs_sys), system[(r, i)]))
            refs.append(before_p)
            steps.append(s.step_median_s)
            gains.append(before_s - s.step_median_s)
            phase_gains.append(before_p - _phase_median(s, phases))
        t0 = _phase_median(base, phases)
        cpu_refs: List[float] = []
        if sys_pairs and len(sys_pairs) == len(trials):
            phases = (SYSTEM_TIME,)
            phase_gains = [ref - fix for ref, fix in sys_pairs]
            if est is not None:
                # The rule's promise (all of the system time a step, an upper bound) for the
                # runs it is measured against: on one thread fewer system calls than the first.
                est = statistics.median(ref for ref, _ in sys_pairs)
        elif cpu_pairs and len(cpu_pairs) == len(trials):
            # On one torch thread throughout: in forward+backward's CPU time (StepCpu), which
            # preemption by other processes does not move.
            phases = (CPU_TIME,)
            phase_gains = [ref - fix for ref, fix in cpu_pairs]
            cpu_refs = [ref for ref, _ in cpu_pairs]
        if est is not None and _scales_with_phase(rule, facts) and t0 > 0:
            # The estimate is the first run's phase time x a measured ratio (est / t0 of it
            # saved): the same ratio of the time the fix is measured against (the runs as the
            # script is around it, the run of the fix it is on top of, or the other steps of an
            # every-other-step run), in CPU time when the gain is. The optimizer's phase is
            # bimodal on the demo (1.7-2.0 or 5-7 ms a step, as the loader's workers preempt
            # it), and the first run's median landed on either mode.
            est = est * statistics.median(cpu_refs or refs) / t0
        rows.append(
            VerifyRow(
                name,
                rule,
                est,
                statistics.median(steps),
                statistics.median(gains),
                _drift(trials[0][i][1], base_losses),
                statistics.median(phase_gains) if phases else None,
                phases,
                advised,
                compile_s.get(i),
                compile_error.get(i, ""),
                any((r, i) in paired for r in range(len(trials))),
                fixes[below_i][0] if stacked else "",
            )
        )
    rows.append(VerifyRow("as the script is, again", "", None, bases[-1].step_median_s, 0.0, 0.0))
    return rows


def format_rows(rows: List[VerifyRow], steps: int, rounds: int = 1) -> str:
    def ms(x):
        return "-" if x is None else f"{1e3 * x:.1f} ms"

    lines = [
        f"verified ({steps} steps per run, medians"
        + (f", {rounds} rounds (the median over them)" if rounds > 1 else "")
        + "; gain = the mean of the runs as the script is before and after the fix's round "
        "minus the fix's (a fix tried on top of another: that fix's run minus its own); the "
        "phase gain is over the phases the fix acts on, the figure its estimate is about):",
        f"  {'fix':<52} {'step':>10} {'step gain':>10} {'phase gain':>11} {'estimated':>10} "
        f"{'est/meas':>8} {'loss drift':>10}  phases",
    ]
    for r in rows:
        if not r.rule:
            lines.append(f"  {r.fix:<52} {ms(r.step_median_s):>10}")
            continue
        drift = "-" if r.loss_drift is None else f"{100 * r.loss_drift:.2f} %"
        ratio = "-"
        gain = r.phase_gain_s
        if r.estimated_gain_s is not None and gain is not None and abs(gain) >= MIN_RATIO_GAIN_S:
            ratio = f"{r.estimated_gain_s / gain:.2f}"
        lines.append(
            f"  {r.fix:<52} {ms(r.step_median_s):>10} {ms(r.measured_gain_s):>10} "
            f"{ms(r.phase_gain_s):>11} {ms(r.estimated_gain_s):>10} {ratio:>8} {drift:>10}  "
            f"{'+'.join(r.phases) or '-'}"
        )
    bases = [r.step_median_s for r in rows if not r.rule and r.step_median_s]
    if len(bases) >= 2 and max(bases) > BASELINE_SPREAD * min(bases):
        try:
            load = f" (load average now {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores)"
        except (AttributeError, OSError):
            load = ""
        lines.append(
            f"  the runs as the script is took {ms(min(bases))} and {ms(max(bases))} a step: "
            f"the machine's speed moved during the check{load}, so gains smaller than that "
            "difference are noise; rerun on a quiet machine"
            + (", or with --verify-rounds 3" if rounds == 1 else "")
        )
    for r in rows:
        if r.paired:
            lines.append(
                f"  {r.fix}: applied on one step of every two of its run (drawn at random), its "
                "gains against that run's other steps (side by side, under the same load)"
                + (
                    "; its phase gain is the drop of forward+backward's CPU time (this "
                    "process's, on one torch thread: time taken by other processes does not "
                    "count), its estimate that CPU time in the other steps x (1 - the probe's "
                    "ratio)"
                    if r.phases == (CPU_TIME,)
                    else ""
                )
            )
        if r.phases == (CPU_TIME,) and not r.paired:
            lines.append(
                f"  {r.fix}: its phase gain is the drop of forward+backward's CPU time against "
                f"the run with {r.on_top_of} (this process's, on one torch thread: time taken "
                "by other processes does not count), its estimate that CPU time x the fraction "
                "the report's estimate saves"
            )
        if r.rule == "malloc":
            against = f"the run with {r.on_top_of}" if r.on_top_of else "the runs as the script is"
            lines.append(
                f"  {r.fix}: mallopt() in this process, as the environment variables do at "
                "start; it cannot be undone, so it and the fixes on top of it ran after the last "
                "run as the script is, and the model was probed again for their estimates"
                + (
                    f"; its phase gain is the drop of this process's system time a step against "
                    f"{against} (page faults and system calls), its estimate the first run's"
                    if r.phases == (SYSTEM_TIME,)
                    else ""
                )
            )
        if r.compile_error:
            lines.append(
                f"  {r.fix}: torch.compile failed ({r.compile_error}); the run went on eagerly, "
                "so its row measures no fix"
            )
        elif r.compile_s is not None:
            lines.append(
                f"  {r.fix}: the compiling steps took {r.compile_s:.1f} s above a typical step "
                "(left out of its medians, with the steps right after them)"
            )
    return "\n".join(lines)


__all__ = ["PHASES_OF", "VerifyRow", "format_rows", "verify"]
