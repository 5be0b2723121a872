"""Where the time goes inside forward and backward, from a few sampled steps: each module's own
forward time (its time minus its children's, from the global module hooks) and the operators
with their input shapes (torch.profiler over one step, forward and backward ops alike). Sampled,
not always on: the module timing costs two clock reads per module call for MODULE_STEPS steps,
torch.profiler runs for one step.

    sampler = ModuleSampler()          # TorchHooks drives it: enter/exit/on_step
    print(sampler.result().format())   # the top modules and operators, by share of the step
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import sys
import weakref
from typing import Any, Dict, List, Optional, Tuple

import torch

from .. import _C

_P = _C.profile

#: Steps whose module forwards are timed, counted from the end of step FIRST_SAMPLED_STEP (the
#: first steps allocate and warm caches), then the step torch.profiler records the operators of.
FIRST_SAMPLED_STEP = 1
#: Each module's time is the median over these steps (a step that another process preempted, on a
#: loaded machine, would stretch a mean).
MODULE_STEPS = 3
#: Rows printed per table.
TOP = 5
#: Elementwise (pointwise) aten ops, trailing "_" stripped: each reads and writes its tensors once
#: per op in eager mode, where torch.compile's inductor fuses a chain of them into one kernel
#: (one pass over memory, one dispatch).
POINTWISE_OPS = frozenset(
    """add sub rsub mul div neg reciprocal abs sign exp log log1p sqrt rsqrt pow square sin cos
    erf relu gelu silu sigmoid tanh hardtanh hardswish hardsigmoid leaky_relu elu softplus mish
    threshold threshold_backward gelu_backward silu_backward sigmoid_backward tanh_backward
    hardtanh_backward hardswish_backward leaky_relu_backward elu_backward softplus_backward
    clamp clamp_min clamp_max where masked_fill maximum minimum eq ne lt le gt ge logical_not
    addcmul addcdiv lerp native_dropout native_dropout_backward bernoulli fill zero copy
    _to_copy clone""".split()
)
#: Normalization, softmax and pooling ops, forward and backward: inductor generates its own
#: kernels for them too and fuses them with their pointwise neighbours (a BatchNorm + ReLU in
#: training: one kernel per pass), where convolutions and matmuls stay ATen / oneDNN calls.
#: With POINTWISE_OPS, the "fusable" ops of the compile rule.
FUSED_REDUCTION_OPS = frozenset(
    """native_batch_norm native_batch_norm_backward _native_batch_norm_legit
    _native_batch_norm_legit_functional native_layer_norm native_layer_norm_backward
    native_group_norm native_group_norm_backward _softmax _softmax_backward_data _log_softmax
    _log_softmax_backward_data max_pool2d_with_indices max_pool2d_with_indices_backward
    avg_pool2d avg_pool2d_backward _adaptive_avg_pool2d _adaptive_avg_pool2d_backward""".split()
)
#: Subtrees of the operator step that are not the model's forward and backward: the optimizer's
#: step and zero_grad (torch.optim's record_function names) and the DataLoader's batch fetch.
NOT_MODEL_ROOTS = ("Optimizer.", "enumerate(DataLoader)", "torchspeed.doctor.optimizer")
#: The doctor's own mark around an optimizer step while operators are recorded: torch.optim's
#: "Optimizer.step#..." range is still open when the step's post hook ends the recorded step,
#: so torch.profiler drops it and the step's ops would read as the model's.
OPTIMIZER_MARK = "torchspeed.doctor.optimizer"
#: torch.profiler names of compiled code: the model already runs under torch.compile.
COMPILED_MARKS = ("Torch-Compiled Region", "CompiledFunction", "CompiledFxGraph")


@dataclasses.dataclass
class ModuleTime:
    name: str  # qualified name in its model ("decoder", "layers.3.attn"), else the type
    type: str
    self_s: float  # forward time of the module itself, per step (children excluded)
    total_s: float  # forward time including its children, per step
    share: float  # self_s over the forward time of every module (their self times summed)
    calls: float  # per step
    detail: str = ""  # e.g. "Linear(200 -> 9000)"


@dataclasses.dataclass
class OpTime:
    name: str
    shapes: str
    self_s: float  # per step
    share: float
    calls: int


@dataclasses.dataclass
class Attribution:
    """The sampled steps' modules and operators, largest first."""

    step_s: float  # the sampled steps' mean time
    modules: List[ModuleTime]
    ops: List[OpTime]
    op_step_s: Optional[float] = None  # the operator step's time (None: not sampled)
    #: The operator step's forward and backward (optimizer and batch fetch left out): the self
    #: time of every op (seconds), of the ones torch.compile fuses (is_fusable), and the
    #: largest of those by name; None when not sampled.
    model_op_s: Optional[float] = None
    fusable_s: Optional[float] = None
    fusable_top: List[Tuple[str, float]] = dataclasses.field(default_factory=list)
    #: Compiled code ran in the operator step (COMPILED_MARKS): torch.compile is in use.
    compiled: bool = False

    def fusable_share(self) -> Optional[float]:
        """The fusable ops' share of the model's operator time in the sampled step."""
        if not self.model_op_s or self.fusable_s is None:
            return None
        return self.fusable_s / self.model_op_s

    def dominant(self) -> Optional[ModuleTime]:
        return self.modules[0] if self.modules else None

    def format(self) -> str:
        lines = [
            f"where the forward time goes (each module's own time, % of the forward; median of "
            f"{MODULE_STEPS} sampled steps):"
        ]
        if not self.modules:
            lines.append("  (no module forward was timed)")
        for m in self.modules[:TOP]:
            lines.append(
                f"  {100 * m.share:5.1f}%  {1e3 * m.self_s:8.3f} ms  {m.name} "
                f"({m.detail or m.type}; {m.calls:g} calls/step)"
            )
        if self.ops:
            lines.append("top operators (one sampled step, forward and backward, self time):")
            for o in self.ops[:TOP]:
                lines.append(
                    f"  {100 * o.share:5.1f}%  {1e3 * o.self_s:8.3f} ms  {o.name} {o.shapes}"
                )
        share = self.fusable_share()
        if share is not None:
            top = ", ".join(f"{n} {1e3 * t:.3f} ms" for n, t in self.fusable_top)
            lines.append(
                "ops torch.compile fuses (pointwise, normalization, softmax, pooling): "
                f"{100 * share:.1f}% of forward+backward's operator time "
                f"({1e3 * self.fusable_s:.3f} of {1e3 * self.model_op_s:.3f} ms"
                + (f"; {top})" if top else ")")
                + (", compiled code ran" if self.compiled else "")
            )
        return "\n".join(lines)


def describe_module(m: Any) -> str:
    """A short description of a module's size: Linear(200 -> 9000), Conv2d(3 -> 64, 7x7)."""
    t = type(m).__name__
    try:
        if isinstance(m, torch.nn.Linear):
            return f"{t}({m.in_features} -> {m.out_features})"
        if isinstance(m, torch.nn.modules.conv._ConvNd):
            k = "x".join(str(x) for x in m.kernel_size)
            return f"{t}({m.in_channels} -> {m.out_channels}, {k})"
        if isinstance(m, torch.nn.Embedding):
            return f"{t}({m.num_embeddings} x {m.embedding_dim})"
        if isinstance(m, torch.nn.RNNBase):
            return f"{t}({m.input_size} -> {m.hidden_size}, {m.num_layers} layers)"
    except Exception:  # noqa: BLE001 (a description is best effort)
        pass
    return t


def _median(values: List[float]) -> float:
    v = sorted(values)
    m = len(v) // 2
    return v[m] if len(v) % 2 else (v[m - 1] + v[m]) / 2


def is_pointwise(name: str) -> bool:
    return name.startswith("aten::") and name[6:].rstrip("_") in POINTWISE_OPS


def is_fusable(name: str) -> bool:
    """An op inductor generates (and fuses) its own kernel for: pointwise, normalization,
    softmax, pooling; not a convolution or matmul (those stay library calls)."""
    return is_pointwise(name) or (name.startswith("aten::") and name[6:] in FUSED_REDUCTION_OPS)


def model_op_times(events: Any) -> Tuple[float, float, List[Tuple[str, float]], bool]:
    """(self seconds of every op, of the fusable ops (is_fusable), the largest fusable ops by
    name, compiled code seen) over torch.profiler events, leaving out the subtrees under
    NOT_MODEL_ROOTS (the optimizer, the batch fetch) and the ProfilerStep markers."""
    total, fusable, compiled = 0.0, 0.0, False
    by_name: Dict[str, float] = {}
    for e in events:
        name = str(e.name)
        if any(m in name for m in COMPILED_MARKS):
            compiled = True
        if name.startswith("ProfilerStep"):
            continue
        parent, outside = e, False
        for _ in range(256):  # bounded: a parent chain, never a cycle
            if parent is None:
                break
            if str(parent.name).startswith(NOT_MODEL_ROOTS):
                outside = True
                break
            parent = parent.cpu_parent
        if outside:
            continue
        self_s = float(e.self_cpu_time_total) / 1e6  # µs
        total += self_s
        if is_fusable(name):
            fusable += self_s
            by_name[name] = by_name.get(name, 0.0) + self_s
    top = sorted(by_name.items(), key=lambda kv: -kv[1])[:3]
    return total, fusable, top, compiled


@contextlib.contextmanager
def _native_stderr_silenced():
    """Kineto prints a line to the process's stderr when torch.profiler starts and stops: the
    script's stderr is its own, so fd 2 goes to /dev/null for those two calls only."""
    try:
        sys.stderr.flush()
        saved = os.dup(2)
    except (OSError, ValueError):
        yield
        return
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        try:
            os.dup2(devnull, 2)
        finally:
            os.close(devnull)
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)


class ModuleSampler:
    """Times module forwards in the sampled steps and records one step's operators."""

    def __init__(self, first_step: int = FIRST_SAMPLED_STEP, module_steps: int = MODULE_STEPS):
        self.first_step = first_step
        self.module_steps = module_steps
        self.active = False
        self._stack: List[List[Any]] = []  # [module id, t0, children ns]
        self._times: Dict[int, List[float]] = {}  # id -> [self ns, total ns, calls], this step
        self._step_times: List[Dict[int, List[float]]] = []  # per sampled step
        self._refs: Dict[int, Any] = {}
        # Taken when a module is first seen, so the report names it even when the script has
        # dropped the model before the report is written (runpy frees the script's globals when
        # it ends): id -> qualified name in its top module, id -> (type, description).
        self._names: Dict[int, str] = {}
        self._kinds: Dict[int, Tuple[str, str]] = {}
        self._t_start = 0
        self.sampled_ns = 0
        self.sampled_steps = 0
        self._torch_prof = None
        self._op_t0 = 0
        self.op_step_ns = 0
        self._ops: List[OpTime] = []
        self.op_step: Optional[int] = None  # the step torch.profiler recorded (run numbering)
        self._stopped_prof = None
        self._model_ops: Optional[tuple] = None
        self._opt_mark: Any = None

    # ---- module forwards (called from the global hooks) ------------------------------------
    def enter(self, module: Any) -> None:
        if self.active:
            self._stack.append([id(module), _P.now_ns(), 0])
            if id(module) not in self._refs:
                try:
                    self._refs[id(module)] = weakref.ref(module)
                except TypeError:
                    self._refs[id(module)] = lambda: None
                self._kinds[id(module)] = (type(module).__name__, describe_module(module))
                if len(self._stack) == 1:  # a top module: its submodules' names, once
                    self._remember_names(module)

    def _remember_names(self, root: Any) -> None:
        try:
            for qual, mod in root.named_modules():
                self._names.setdefault(id(mod), qual or type(root).__name__)
        except Exception:  # noqa: BLE001 (names are best effort)
            pass

    def exit(self, module: Any) -> None:
        if not self.active or not self._stack or self._stack[-1][0] != id(module):
            return
        key, t0, children = self._stack.pop()
        total = _P.now_ns() - t0
        rec = self._times.setdefault(key, [0.0, 0.0, 0.0])
        rec[0] += total - children
        rec[1] += total
        rec[2] += 1
        if self._stack:
            self._stack[-1][2] += total

    # ---- the optimizer's ops, marked (called from the optimizer step hooks) -------------------
    def optimizer_enter(self) -> None:
        if self._torch_prof is not None and self._opt_mark is None:
            self._opt_mark = torch.autograd.profiler.record_function(OPTIMIZER_MARK)
            self._opt_mark.__enter__()

    def optimizer_exit(self) -> None:
        mark, self._opt_mark = self._opt_mark, None
        if mark is not None:
            mark.__exit__(None, None, None)

    # ---- steps ------------------------------------------------------------------------------
    def on_step(self, steps_seen: int) -> None:
        now = _P.now_ns()
        if self.active:
            self.sampled_ns += now - self._t_start
            self.sampled_steps += 1
            self._step_times.append(self._times)
        self._times = {}
        if self._torch_prof is not None:
            self.op_step_ns = now - self._op_t0
            self._stop_ops()
        end = self.first_step + self.module_steps
        self.active = self.first_step <= steps_seen < end
        self._stack = []
        self._t_start = now
        if steps_seen == end:
            self._start_ops(steps_seen)

    def perturbed_steps(self) -> List[int]:
        """Steps to leave out of the summary: the one torch.profiler recorded, and the next one
        (stopping the profiler and collecting its events happen at their boundary)."""
        return [self.op_step, self.op_step + 1] if self.op_step is not None else []

    def _start_ops(self, step: int) -> None:
        # Not while the user's own torch.profiler runs: one profiler at a time.
        if torch.autograd.profiler._is_profiler_enabled:
            return
        prof = torch.profiler.profile(
            activities=[torch.profiler.ProfilerActivity.CPU], record_shapes=True
        )
        with _native_stderr_silenced():
            prof.__enter__()
        self._torch_prof = prof
        self.op_step = step
        self._op_t0 = _P.now_ns()

    def _stop_ops(self) -> None:
        self.optimizer_exit()
        prof, self._torch_prof = self._torch_prof, None
        with _native_stderr_silenced():
            prof.__exit__(None, None, None)
        self._stopped_prof = prof  # its events are read in result(), after the run

    def _read_ops(self) -> None:
        prof, self._stopped_prof = self._stopped_prof, None
        if prof is None:
            return
        step_ns = max(self.op_step_ns, 1)
        rows = []
        for e in prof.key_averages(group_by_input_shape=True):
            self_ns = float(e.self_cpu_time_total) * 1e3  # µs -> ns
            if self_ns <= 0 or e.key.startswith("ProfilerStep"):
                continue
            shapes = ", ".join(str(list(s)) for s in (e.input_shapes or []) if s)
            rows.append(OpTime(e.key, shapes, self_ns / 1e9, self_ns / step_ns, int(e.count)))
        rows.sort(key=lambda o: -o.self_s)
        self._ops = rows[: TOP * 2]
        self._model_ops = model_op_times(prof.events())

    def close(self) -> None:
        """Stops a torch.profiler left running (the run ended inside the operator step)."""
        self.active = False
        if self._torch_prof is not None:
            self.op_step_ns = _P.now_ns() - self._op_t0
            self._stop_ops()

    # ---- result -----------------------------------------------------------------------------
    def result(self, models: Tuple[Any, ...] = ()) -> Optional[Attribution]:
        self._read_ops()
        if not self.sampled_steps and not self._ops:
            return None
        names: Dict[int, str] = {}
        for root in models:
            try:
                for qual, mod in root.named_modules():
                    names.setdefault(id(mod), qual or type(root).__name__)
            except Exception:  # noqa: BLE001 (names are best effort)
                pass
        n = max(self.sampled_steps, 1)
        step_ns = max(self.sampled_ns / n, 1.0)
        # Per module the median over the sampled steps (0 in a step it did not run in); a run
        # that ended inside the first sampled step has that step's partial times.
        steps = self._step_times or ([self._times] if self._times else [])
        keys = {k: None for st in steps for k in st}
        times = {}
        for key in keys:
            rows = [st.get(key, (0.0, 0.0, 0.0)) for st in steps]
            times[key] = (
                _median([r[0] for r in rows]),
                _median([r[1] for r in rows]),
                sum(r[2] for r in rows) / max(len(rows), 1),
            )
        forward_ns = max(sum(rec[0] for rec in times.values()), 1.0)
        mods = []
        for key, (self_ns, total_ns, calls) in times.items():
            m = self._refs.get(key, lambda: None)()
            t, described = self._kinds.get(key, ("?", ""))
            if m is not None:
                t, described = type(m).__name__, describe_module(m)
            mods.append(
                ModuleTime(
                    names.get(key, self._names.get(key, t)),
                    t,
                    self_ns / 1e9,
                    total_ns / 1e9,
                    self_ns / forward_ns,
                    calls,
                    described,
                )
            )
        mods.sort(key=lambda m: -m.self_s)
        model_s, fusable_s, top, compiled = self._model_ops or (None, None, [], False)
        return Attribution(
            step_s=step_ns / 1e9,
            modules=mods[: TOP * 2],
            ops=self._ops,
            op_step_s=self.op_step_ns / 1e9 if self.op_step_ns else None,
            model_op_s=model_s,
            fusable_s=fusable_s,
            fusable_top=top,
            compiled=compiled,
        )
