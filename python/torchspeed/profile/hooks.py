"""torch's global hooks, for profiling plain torch code (StepProfiler(hooks=True), the doctor):
phases from module forwards, autograd backward, optimizer steps, DataLoader iterators,
host-to-device copies and torch.distributed collectives, plus the facts the lints read.

Module hooks are torch's global ones for the whole run (hooks on the user's modules would travel
with the model into pickle, deepcopy and torch.save); the per-call counters of the first
DISCOVERY_STEPS steps are left off after them.
"""

from __future__ import annotations

import gc
import sys
import threading
import warnings
import weakref
from typing import Any, Callable, Dict, List, Optional

import torch
from torch import nn

from .. import _C
from . import ranges as _ranges
from .attribution import ModuleSampler
from .loader_cpu import LoaderCpu
from .malloc import PageFaults, malloc_tuned
from .summary import RunFacts

_P = _C.profile
_IDS = {p: _ranges.PHASE_IDS[p] for p in _ranges.PHASE_IDS}
_NAMES = {p: _P.intern(f"torch.{p}") for p in _IDS}

DISCOVERY_STEPS = 3
_COMPILE_HOOKS_WARNING = r"Using `torch.compile\(module\)` when there are global hooks"
# step_on="auto": boundaries of one kind seen before a loop without an optimizer step is taken
# for a backward-driven (or forward-only) one; more micro-batches than this per optimizer step
# are first taken for steps, until the optimizer steps (then those steps are left out).
CONFIRM_STEPS = 4
_COLLECTIVES = (
    "all_reduce",
    "all_gather",
    "all_gather_into_tensor",
    "reduce_scatter",
    "reduce_scatter_tensor",
    "broadcast",
    "reduce",
    "barrier",
    "all_to_all",
    "all_to_all_single",
    "gather",
    "scatter",
)


def _batch_size(batch: Any) -> int:
    """Samples in a batch: the first dimension of its first tensor (0 when there is none)."""
    seen = 0
    stack = [batch]
    while stack and seen < 64:
        x = stack.pop()
        seen += 1
        if isinstance(x, torch.Tensor):
            return int(x.shape[0]) if x.dim() > 0 else 0
        if isinstance(x, dict):
            stack.extend(reversed(list(x.values())))
        elif isinstance(x, (list, tuple)):
            stack.extend(reversed(x))
    return 0


class _WeakSet:
    """Objects seen, by identity, without keeping them alive."""

    def __init__(self):
        self._refs: Dict[int, Any] = {}

    def add(self, obj: Any) -> None:
        k = id(obj)
        if k not in self._refs:
            try:
                self._refs[k] = weakref.ref(obj)
            except TypeError:
                self._refs[k] = lambda obj=obj: obj

    def __contains__(self, obj: Any) -> bool:
        r = self._refs.get(id(obj))
        return r is not None and r() is obj

    def items(self) -> List[Any]:
        return [o for o in (r() for r in self._refs.values()) if o is not None]

    def dead_keys(self) -> List[int]:
        """The keys (ids at add time) of the objects that are gone."""
        return [k for k, r in self._refs.items() if r() is None]


def _bf16_capable_cpu() -> bool:
    try:
        with open("/proc/cpuinfo") as f:
            flags = f.read(1 << 16)
        return "avx512_bf16" in flags or "amx_bf16" in flags
    except OSError:
        return False


def _autocast_on() -> bool:
    for dev in ("cuda", "cpu"):
        try:
            if torch.is_autocast_enabled(dev):
                return True
        except TypeError:  # older signature
            return torch.is_autocast_enabled()
    return False


def _shapes(args: tuple) -> tuple:
    return tuple(tuple(a.shape) for a in args if isinstance(a, torch.Tensor))


class TorchHooks:
    """Installs the hooks for one StepProfiler; ``remove()`` restores everything it patched.

    Nothing is attached to the user's objects: module hooks are torch's global ones and the rest
    patch torch's classes, so a model pickles, deep-copies, saves and compiles as without the
    profiler. An error inside a hook is the profiler's, not the script's: it is reported once
    on stderr, the profiler stops, and the script runs on.
    """

    def __init__(self, profiler):
        self.prof = profiler
        self.thread = threading.get_ident()
        self.counters: Dict[str, int] = {}
        self.models = _WeakSet()
        self.optimizers = _WeakSet()
        self.loaders = _WeakSet()
        # What the rules read off each loader, for the loaders gone by the report (the loop that
        # held them ended, or its frames were freed when --steps stopped the script).
        self.loader_records: Dict[int, Any] = {}
        # The most loader workers seen at once: the loaders may be gone when the rules run.
        self.loader_workers = 0
        # The loader's CPU time per step (its worker processes and C++ threads, from /proc).
        self.loader_cpu = LoaderCpu()
        # This process's page faults and system time per step (the malloc rule).
        self.page_faults = PageFaults()
        self.model_compiled = False
        self.train_forwards = 0  # outermost forwards in train mode with grad (micro-batches)
        self.autocast_used = False
        self.shapes: Dict[int, set] = {}
        self.input_specs: Dict[int, list] = {}
        self.removed = False
        self.probe = bool(getattr(profiler, "probe", False))
        self._probes: Optional[Dict[str, float]] = None
        # What the probes will measure, held from its first training step until they ran: a
        # script that runs to its end has dropped its model and optimizer before the report
        # (they are kept weakly everywhere else), and its estimates fell back to planning
        # figures. Only on the CPU (where the probes run) and only with probes on.
        self._probe_subjects: List[Any] = []
        self.depth = 0
        self.fwd_host_ns = 0
        self.fwd_calls_in_discovery = 0
        self.discovery = True
        self.steps_seen = 0
        self.primary_opt = None
        self.opt_depth = 0
        self._in_opt_post = False
        self._handles: List[Any] = []
        self._opt_handles: List[Any] = []
        self._patches: List[tuple] = []
        self._fwd_t0 = 0
        self._in_backward = 0
        self.failed: Optional[str] = None
        self._warning_filter: Optional[tuple] = None
        # Step detection for step_on="auto" (loops without an optimizer step): see _candidate().
        self.step_source: Optional[str] = None  # "optimizer", "backward" or "forward"
        self.backward_calls = 0
        self._bwd_since_candidate = False
        self._candidates = 0
        self._fwd_only = 0
        self._root_fwd_done = False
        self.closure_forwards = 0  # root forwards inside an optimizer step (LBFGS closures)
        self.steps_switched_at = 0  # the step at which a later optimizer step took over
        # Sampled attribution: per-module forward time of the sampled steps (see attribution.py).
        self.module_sampler = ModuleSampler() if getattr(profiler, "attribute", False) else None

    def _count(self, key: str, n: int = 1) -> None:
        self.counters[key] = self.counters.get(key, 0) + n

    def _mine(self) -> bool:
        return threading.get_ident() == self.thread

    def _internal_error(self, where: str, e: BaseException) -> None:
        """An error in the profiler's own code: said once, profiling stops, the script runs on."""
        if self.failed is None:
            self.failed = f"{where}: {type(e).__name__}: {e}"
            print(
                f"torchspeed: internal error in the profiler ({self.failed}); profiling stopped, "
                "the script runs on",
                file=sys.stderr,
                flush=True,
            )
        try:
            self.prof.stop()
        except Exception:  # noqa: BLE001 (stopping is best effort here; hooks go below)
            pass
        self.remove()

    # ---- step detection without an optimizer step -----------------------------------------
    def _candidate(self, at_forward: bool) -> None:
        """A possible step boundary: the start of a root forward, or of a batch fetch. In
        step_on="auto" mode, before any optimizer step is seen: after a backward, a boundary of
        a backward-driven loop (manual SGD update); a root forward after a root forward with no
        backward between, a boundary of a forward-only loop. A mode is taken after CONFIRM such
        boundaries (the iterations before it make up the first step, left out as warmup), so a
        loop that accumulates gradients over a few micro-batches before its optimizer step is not
        taken for a backward-driven one."""
        if self.prof.step_on != "auto" or self.opt_depth > 0 or self.step_source == "optimizer":
            return
        if self._bwd_since_candidate:
            self._bwd_since_candidate = False
            self._root_fwd_done = False
            if self.step_source == "backward":
                self.prof.step()
            elif self.step_source is None:
                self._candidates += 1
                if self._candidates >= CONFIRM_STEPS:
                    self.step_source = "backward"
                    self.prof.step()
        elif at_forward and self._root_fwd_done and self.backward_calls == 0:
            self._root_fwd_done = False
            if self.step_source == "forward":
                self.prof.step()
            elif self.step_source is None:
                self._fwd_only += 1
                if self._fwd_only >= CONFIRM_STEPS:
                    self.step_source = "forward"
                    self.prof.step()

    # ---- forward --------------------------------------------------------------------------
    def _root_enter(self, module: nn.Module, args: tuple) -> None:
        self._candidate(at_forward=True)
        self.models.add(module)
        if type(module).__name__ == "OptimizedModule" or getattr(
            module, "_compiled_call_impl", None
        ):
            self.model_compiled = True  # model = torch.compile(model) / model.compile()
        if module.training and torch.is_grad_enabled():
            self.train_forwards += 1
        if self.opt_depth > 0:
            self.closure_forwards += 1
        if not module.training and torch.is_grad_enabled():
            self._count("eval_forward_with_grad")
        if _autocast_on():
            self.autocast_used = True
        if module.training:
            self.shapes.setdefault(id(module), set()).add(_shapes(args))
            if id(module) not in self.input_specs:  # the probes' synthetic inputs (probe.py)
                self.input_specs[id(module)] = [
                    (tuple(a.shape), a.dtype) for a in args if isinstance(a, torch.Tensor)
                ]
                if self.input_specs[id(module)]:
                    self._hold_for_probe(module, module.parameters())
        self._fwd_t0 = _P.now_ns()
        _ranges._enter(_NAMES["forward"], _IDS["forward"])

    def _root_exit(self) -> None:
        _ranges._exit(_NAMES["forward"], _IDS["forward"])
        self._root_fwd_done = True
        if self.discovery:
            self.fwd_host_ns += _P.now_ns() - self._fwd_t0

    # Global hooks, never hooks on the user's modules (those would travel with the model into
    # pickle, deepcopy and torch.save). Under torch.compile, dynamo traces the hooks: they return
    # at once there (is_compiling() is a constant to dynamo), so no graph breaks.
    def _global_pre(self, module: nn.Module, args: tuple) -> None:
        if torch.compiler.is_compiling() or not self._mine():
            return
        try:
            if self.discovery:
                self._count("module_calls")
                self.fwd_calls_in_discovery += 1
                if (
                    isinstance(module, nn.Conv2d)
                    and args
                    and isinstance(args[0], torch.Tensor)
                    and args[0].dim() == 4
                    and args[0].is_cuda
                    and not args[0].is_contiguous(memory_format=torch.channels_last)
                ):
                    self._count("conv_input_not_channels_last")
            if self.depth == 0:
                self._root_enter(module, args)
            self.depth += 1
            if self.module_sampler is not None:
                self.module_sampler.enter(module)
        except Exception as e:  # noqa: BLE001 (the profiler's error, not the script's)
            self._internal_error("a module forward pre-hook", e)

    def _global_post(self, module: nn.Module, args: tuple, output: Any) -> None:
        if torch.compiler.is_compiling() or not self._mine() or self.depth <= 0:
            return
        try:
            if self.module_sampler is not None:
                self.module_sampler.exit(module)
            self.depth -= 1
            if self.depth == 0:
                self._root_exit()
                if self.discovery and self.steps_seen >= DISCOVERY_STEPS:
                    self.discovery = False  # deferred from on_step(): that step ended mid-forward
        except Exception as e:  # noqa: BLE001
            self._internal_error("a module forward hook", e)

    # ---- optimizer --------------------------------------------------------------------------
    # torch wraps step() of every optimizer class it has instantiated, so a subclass whose step
    # calls super().step() fires the hooks twice, nested: only the outermost pair counts.
    def _opt_pre(self, opt, args, kwargs) -> None:
        if not self._mine():
            return
        try:
            self.opt_depth += 1
            if self.opt_depth > 1:
                return
            self.optimizers.add(opt)
            if self.primary_opt is None:
                self.primary_opt = weakref.ref(opt)
            if not type(opt).__module__.startswith("torchspeed."):
                self._hold_for_probe(opt, (p for g in opt.param_groups for p in g["params"]))
            _ranges._enter(_NAMES["optimizer"], _IDS["optimizer"])
            if self.module_sampler is not None:
                self.module_sampler.optimizer_enter()
        except Exception as e:  # noqa: BLE001
            self._internal_error("an optimizer step pre-hook", e)

    def _opt_post(self, opt, args, kwargs) -> None:
        if not self._mine() or self.opt_depth == 0:
            return
        try:
            self.opt_depth -= 1
            if self.opt_depth > 0:
                return
            _ranges._exit(_NAMES["optimizer"], _IDS["optimizer"])
            if self.module_sampler is not None:
                self.module_sampler.optimizer_exit()
            primary = self.primary_opt is not None and self.primary_opt() is opt
            if not primary or self.prof.step_on not in ("optimizer", "auto"):
                return
            if self.step_source != "optimizer":
                # The first optimizer step: it ends the steps from now on. Steps a backward-
                # driven guess recorded before (a long accumulation) are left out of the summary.
                if self.step_source is not None:
                    self.steps_switched_at = self.prof.steps_taken + 1
                self.step_source = "optimizer"
        except Exception as e:  # noqa: BLE001
            self._internal_error("an optimizer step hook", e)
            return
        self._in_opt_post = True
        try:
            self.prof.step()
        finally:
            self._in_opt_post = False

    # ---- patches ----------------------------------------------------------------------------
    def _patch(self, owner: Any, name: str, make: Callable[[Callable], Callable]) -> None:
        # Remember whether the owner itself had the attribute (or inherited it: torch.Tensor.to
        # lives on its C base): restoring must not leave a shadowing copy in the owner's dict.
        own = name in vars(owner)
        orig = vars(owner)[name] if own else None
        setattr(owner, name, make(getattr(owner, name)))
        self._patches.append((owner, name, orig))

    def _phase_wrapper(
        self, phase: str, orig: Callable, after: Optional[Callable[[], None]] = None
    ) -> Callable:
        nid, pid, hooks = _NAMES[phase], _IDS[phase], self

        def wrapper(*args, **kwargs):
            if not hooks._mine():
                return orig(*args, **kwargs)
            _ranges._enter(nid, pid)
            try:
                out = orig(*args, **kwargs)
            finally:
                _ranges._exit(nid, pid)
            if after is not None:
                after()
            return out

        wrapper.__wrapped__ = orig
        wrapper.__name__ = getattr(orig, "__name__", "wrapper")
        wrapper.__doc__ = getattr(orig, "__doc__", None)
        return wrapper

    def _install_patches(self) -> None:
        hooks = self

        def backward_done() -> None:
            hooks.backward_calls += 1
            hooks._bwd_since_candidate = True

        self._patch(
            torch.autograd,
            "backward",
            lambda orig: self._phase_wrapper("backward", orig, after=backward_done),
        )

        # DataLoader: its iterator's __next__ is the data wait; the batch size counts samples.
        from torch.utils.data import dataloader as dl

        def make_next(orig):
            nid, pid = _NAMES["data_wait"], _IDS["data_wait"]

            def __next__(it):
                if not hooks._mine():
                    return orig(it)
                try:
                    hooks._candidate(at_forward=False)
                except Exception as e:  # noqa: BLE001 (the profiler's error, not the script's)
                    hooks._internal_error("the DataLoader hook", e)
                _ranges._enter(nid, pid)
                try:
                    batch = orig(it)
                finally:
                    _ranges._exit(nid, pid)
                hooks.prof.pending_samples += _batch_size(batch)
                return batch

            return __next__

        self._patch(dl._BaseDataLoaderIter, "__next__", make_next)

        def make_iter(orig):
            def __iter__(loader):
                hooks.saw_loader(loader)
                it = orig(loader)
                try:  # torch's multiprocessing iterator: its worker processes
                    workers = getattr(it, "_workers", None) or []
                    hooks.loader_cpu.add_workers([getattr(w, "pid", None) for w in workers])
                except Exception as e:  # noqa: BLE001 (the profiler's error, not the script's)
                    hooks._internal_error("the DataLoader iterator hook", e)
                return it

            return __iter__

        self._patch(dl.DataLoader, "__iter__", make_iter)

        def make_zero_grad(orig):
            def zero_grad(self_, set_to_none: bool = True):
                if not set_to_none:
                    hooks._count("zero_grad_keep")
                return orig(self_, set_to_none)

            return zero_grad

        def make_clip(orig):
            def clip_grad_norm_(*args, **kwargs):
                if hooks._mine():
                    hooks._count("clip_grad_norm")
                return orig(*args, **kwargs)

            clip_grad_norm_.__wrapped__ = orig
            clip_grad_norm_.__doc__ = orig.__doc__
            return clip_grad_norm_

        self._patch(torch.nn.utils, "clip_grad_norm_", make_clip)
        self._patch(torch.optim.Optimizer, "zero_grad", make_zero_grad)
        self._patch(nn.Module, "zero_grad", make_zero_grad)

        np = sys.modules.get("numpy")
        if np is not None:
            ndarray = np.ndarray

            def make_tensor(orig):
                def tensor(data, *args, **kwargs):
                    if isinstance(data, ndarray):
                        hooks._count("tensor_from_ndarray")
                    return orig(data, *args, **kwargs)

                tensor.__doc__ = orig.__doc__
                return tensor

            self._patch(torch, "tensor", make_tensor)

        if torch.cuda.is_available():
            self._install_h2d()
        try:
            import torch.distributed as dist
        except ImportError:
            dist = None
        if dist is not None and dist.is_available():
            for name in _COLLECTIVES:
                if hasattr(dist, name):
                    self._patch(dist, name, lambda orig: self._phase_wrapper("comm", orig))

    def _install_h2d(self) -> None:
        hooks = self
        nid, pid = _NAMES["h2d"], _IDS["h2d"]

        def is_h2d(t: torch.Tensor, device: Any) -> bool:
            return (
                t.device.type == "cpu"
                and device is not None
                and torch.device(device).type == "cuda"
            )

        def account(t: torch.Tensor, non_blocking: bool) -> None:
            if not t.is_pinned():
                hooks._count("h2d_pageable")
            if not non_blocking:
                hooks._count("h2d_blocking")

        def make_to(orig):
            def to(t, *args, **kwargs):
                if not hooks._mine():
                    return orig(t, *args, **kwargs)
                try:
                    device, _, non_blocking, _ = torch._C._nn._parse_to(*args, **kwargs)
                except Exception:  # noqa: BLE001 (let torch raise its own error)
                    return orig(t, *args, **kwargs)
                if not is_h2d(t, device):
                    return orig(t, *args, **kwargs)
                account(t, non_blocking)
                _ranges._enter(nid, pid)
                try:
                    return orig(t, *args, **kwargs)
                finally:
                    _ranges._exit(nid, pid)

            return to

        def make_cuda(orig):
            def cuda(t, device=None, non_blocking=False, **kwargs):
                if not hooks._mine() or t.device.type != "cpu":
                    return orig(t, device, non_blocking, **kwargs)
                account(t, non_blocking)
                _ranges._enter(nid, pid)
                try:
                    return orig(t, device, non_blocking, **kwargs)
                finally:
                    _ranges._exit(nid, pid)

            return cuda

        self._patch(torch.Tensor, "to", make_to)
        self._patch(torch.Tensor, "cuda", make_cuda)

    # ---- install / remove -------------------------------------------------------------------
    def install(self) -> None:
        from torch.nn.modules import module as mm
        from torch.optim import optimizer as om

        self._handles = [
            mm.register_module_forward_pre_hook(self._global_pre),
            mm.register_module_forward_hook(self._global_post, always_call=True),
        ]
        self._opt_handles = [
            om.register_optimizer_step_pre_hook(self._opt_pre),
            om.register_optimizer_step_post_hook(self._opt_post),
        ]
        self._install_patches()
        # torch.compile warns the user about global module hooks (they fire once more, for the
        # compiled wrapper): those are the doctor's, and it counts that call as the model's.
        warnings.filterwarnings("ignore", message=_COMPILE_HOOKS_WARNING, category=UserWarning)
        self._warning_filter = warnings.filters[0]
        _active_hooks.append(self)

    def remove(self) -> None:
        for h in self._handles + self._opt_handles:
            h.remove()
        self._handles, self._opt_handles = [], []
        if self.module_sampler is not None:
            try:
                self.module_sampler.close()
            except Exception as e:  # noqa: BLE001 (its results are lost, nothing else)
                print(f"torchspeed: torch.profiler did not stop cleanly ({e})", file=sys.stderr)
        for owner, name, orig in reversed(self._patches):
            if orig is None:
                delattr(owner, name)
            else:
                setattr(owner, name, orig)
        self._patches = []
        if self._warning_filter is not None:
            if self._warning_filter in warnings.filters:
                warnings.filters.remove(self._warning_filter)
                warnings._filters_mutated()
            self._warning_filter = None
        if self in _active_hooks:
            _active_hooks.remove(self)
        self.removed = True

    def on_step(self) -> None:
        self.steps_seen += 1
        if self.opt_depth > 0 and not self._in_opt_post:
            # An optimizer step raised (torch calls no post hook then): close its phase here.
            for _ in range(self.opt_depth):
                _ranges._exit(_NAMES["optimizer"], _IDS["optimizer"])
            self.opt_depth = 0
            if self.module_sampler is not None:
                self.module_sampler.optimizer_exit()
        # Not inside a forward (an optimizer stepped from a module's forward): the forward's
        # post hook ends discovery then.
        if self.discovery and self.steps_seen >= DISCOVERY_STEPS and self.depth == 0:
            self.discovery = False
        if self.module_sampler is not None:
            self.module_sampler.on_step(self.steps_seen)
        # Counted over the steps the summary keeps (after the warmup); only once a loader was
        # seen (a read of /proc costs ~35 µs a step).
        counting = self.steps_seen >= getattr(self.prof, "warmup", 0)
        if self.loader_workers or self.loader_cpu.pids or self.loaders.items():
            self.loader_cpu.sample(counting=counting)
        self.page_faults.sample(self.prof.steps_taken - 1)

    # ---- facts ------------------------------------------------------------------------------
    def _attribution(self, models: List[Any]):
        if self.module_sampler is None:
            return None
        try:
            return self.module_sampler.result(tuple(models))
        except Exception as e:  # noqa: BLE001 (the profiler's error: no attribution then)
            print(f"torchspeed: no module attribution ({type(e).__name__}: {e})", file=sys.stderr)
            return None

    def _hold_for_probe(self, obj: Any, params) -> None:
        """Keeps the first model (with recorded inputs) and the first torch optimizer alive for
        the probes, when they will run: probes on, parameters on the CPU."""
        if not self.probe or self._probes is not None:
            return
        kind = isinstance(obj, nn.Module)
        if any(isinstance(o, nn.Module) == kind for o in self._probe_subjects):
            return
        if all(p.device.type == "cpu" for p in params):
            self._probe_subjects.append(obj)

    def _probe(self, models: List[Any], device_type: str) -> Dict[str, float]:
        """probe.py's measurements, once, on the CPU, after the hooks are gone (before, the
        probe's forwards would count as the script's steps): {} until then."""
        if self._probes is not None:
            return self._probes
        if not self.removed:
            return {}
        if device_type != "cpu":
            self._probe_subjects = []
            return {}
        from .probe import probe_run

        gc.collect()  # what the script dropped (a loader's worker processes) goes first
        model = next((m for m in models if self.input_specs.get(id(m))), None)
        spec = self.input_specs.get(id(model)) if model is not None else None
        try:
            self._probes = probe_run(model, spec, self.optimizers.items())
        except Exception as e:  # noqa: BLE001 (no measured estimates then, nothing else)
            print(
                f"torchspeed: the doctor's probes failed ({type(e).__name__}: {e})", file=sys.stderr
            )
            self._probes = {}
        self._probe_subjects = []
        return self._probes

    def saw_loader(self, loader: Any) -> None:
        """Records a loader (weakly) and the most workers a loader of the run had. The largest,
        not the sum: a torchspeed DataLoader over torch's is seen twice (the wrapper and the
        loader inside), and a validation loader does not run beside the training one."""
        from .facts import _loaders

        self.loaders.add(loader)
        live = _loaders(RunFacts(loaders=[loader]))
        if live and id(loader) not in self.loader_records:
            self.loader_records[id(loader)] = live[0]
        workers = max((max(int(x.num_workers or 0), 0) for x in live), default=0)
        self.loader_workers = max(self.loader_workers, workers)

    def facts(self) -> RunFacts:
        models = self.models.items()
        device_type = "cpu"
        for m in models:
            p = next(iter(m.parameters()), None)
            if p is not None and p.device.type == "cuda":
                device_type = "cuda"
        ddp = any(
            isinstance(m, torch.nn.parallel.DistributedDataParallel)
            or type(m).__name__ == "AccumulatingDDP"
            for m in models
        )
        shapes = [s for s in self.shapes.values() if s]
        fixed = all(len(s) == 1 for s in shapes) if shapes else None
        discovery_steps = min(self.steps_seen, DISCOVERY_STEPS)
        per_call = None
        if self.fwd_calls_in_discovery:
            per_call = self.fwd_host_ns / 1e9 / self.fwd_calls_in_discovery
        peak = total = None
        if device_type == "cuda":
            try:
                peak = int(torch.cuda.max_memory_allocated())
                total = int(
                    torch.cuda.get_device_properties(torch.cuda.current_device()).total_memory
                )
            except Exception:  # noqa: BLE001 (facts are best effort)
                pass
        counters = dict(self.counters)
        if discovery_steps and "module_calls" in counters:
            # module_calls were counted in discovery only: scale to the whole run's steps.
            counters["module_calls"] = int(
                counters["module_calls"] * max(self.steps_seen, 1) / discovery_steps
            )
        return RunFacts(
            device_type=device_type,
            autocast_used=self.autocast_used,
            bf16_capable_cpu=_bf16_capable_cpu(),
            cudnn_benchmark=bool(torch.backends.cudnn.benchmark),
            fixed_input_shapes=fixed,
            models=models,
            optimizers=self.optimizers.items(),
            loaders=self.loaders.items()
            + [
                self.loader_records[k] for k in self.loaders.dead_keys() if k in self.loader_records
            ],
            ddp=ddp,
            counters=counters,
            steps=self.prof.steps,
            peak_memory_bytes=peak,
            total_memory_bytes=total,
            host_s_per_module_call=per_call,
            step_source=self.step_source or ("manual" if self.prof.step_on is None else ""),
            closure_forwards_per_step=self.closure_forwards / max(self.steps_seen, 1),
            train_forwards_per_step=self.train_forwards / max(self.steps_seen, 1),
            attribution=self._attribution(models),
            probes=dict(self._probe(models, device_type)) if self.probe else {},
            torch_threads=torch.get_num_threads(),
            loader_workers=self.loader_workers,
            loader_cpu_s=self.loader_cpu.per_step_s(),
            page_faults=self.page_faults.per_step(
                self.prof.first_kept_step(), self.prof.left_out_steps()
            ),
            malloc_tuned=malloc_tuned(),
            model_compiled=self.model_compiled,
        )


#: The hooks installed now (torchspeed's own loader registers itself with them).
_active_hooks: List[TorchHooks] = []


def running_profiler() -> Any:
    """The profiler of the innermost hooks installed now (the doctor's run), or None."""
    return _active_hooks[-1].prof if _active_hooks else None


def saw_loader(loader: Any) -> None:
    """Called by torchspeed's DataLoader when an epoch starts, so the lints see it."""
    for h in _active_hooks:
        h.saw_loader(loader)


def saw_batch(batch: Any) -> None:
    """Called by torchspeed's DataLoader with each batch it returns: samples per step."""
    for h in _active_hooks:
        if h._mine():
            h.prof.pending_samples += _batch_size(batch)
