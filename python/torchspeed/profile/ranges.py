"""Ranges from Python: ``torchspeed.profile.range(name)`` (a C++ context manager: a ``with``
costs two C++ calls) and ``phase(name)`` (a range that counts as a phase of the step breakdown and
also marks the CUDA timeline when a StepProfiler runs on a GPU). Both are decorators too.

    with torchspeed.profile.range("augment"):      # in the trace, its time stays in its phase
        ...
    @torchspeed.profile.range("loss")
    def loss_fn(...): ...
    with torchspeed.profile.phase("h2d"):          # counts as host-to-device copy
        batch = batch.to("cuda", non_blocking=True)
"""

from __future__ import annotations

import functools
import os
import threading
from typing import Callable, Dict, Optional, Tuple

from .. import _C
from .summary import PHASES

_P = _C.profile
PHASE_IDS: Dict[str, int] = {name: i for i, name in enumerate(PHASES)}
OTHER = PHASE_IDS["other"]
_NONE = _P.PHASE_NONE

enabled = _P.enabled
set_enabled = _P.set_enabled
now_ns = _P.now_ns
clock_source = _P.clock_source
dropped_events = _P.dropped_events


def phase_id(phase: str) -> int:
    """The id of a phase name (one of PHASES); ValueError naming the choices otherwise."""
    try:
        return PHASE_IDS[phase] if isinstance(phase, str) else PHASE_IDS[None]
    except KeyError:
        raise ValueError(
            f"torchspeed.profile: phase must be one of {', '.join(PHASES)}; got {phase!r}"
        ) from None


class _Route(threading.local):
    # Where phase ranges of this thread go: None = straight to C++; else the running StepProfiler's
    # timeline (its thread only), which also records CUDA events at phase boundaries. A timeline
    # stopped from another thread is marked closed, and ranges then go straight to C++ again.
    timeline = None


_route = _Route()


def _timeline():
    """This thread's running StepProfiler timeline, or None (a closed one is dropped)."""
    t = _route.timeline
    if t is not None and t.closed:
        _route.timeline = t = None
    return t


def _enter(name_id: int, phase: int) -> None:
    t = _route.timeline
    if t is None or t.closed:
        _P.begin(name_id, phase)
    else:
        t.enter(name_id, phase)


def _exit(name_id: int) -> None:
    # By name: the newest open range of that name closes, even if newer ones are open (ranges
    # interleaved by async code); an exit without its enter closes nothing.
    t = _route.timeline
    if t is None or t.closed:
        _P.end(name_id)
    else:
        t.exit(name_id)


class _ThreadName(threading.local):
    native_id = None


_names = _ThreadName()
# The Python names of the threads that made ranges (the OS calls them all "python"), kept for
# threads that have exited by the time a trace is written; bounded like the rings (64 + live).
_thread_names: Dict[int, str] = {}


def _thread_seen() -> None:
    t = threading.current_thread()
    _names.native_id = t.native_id
    if len(_thread_names) > 4096:
        live = {x.native_id for x in threading.enumerate()}
        for k in [k for k in _thread_names if k not in live][: len(_thread_names) - 64]:
            del _thread_names[k]
    _thread_names[t.native_id] = t.name


def _decorate(ctx, fn: Callable) -> Callable:
    if not callable(fn):
        raise TypeError(
            f"torchspeed.profile: a range decorates a callable, got {type(fn).__name__}"
        )

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        with ctx:
            return fn(*args, **kwargs)

    return wrapper


class PhaseRange:
    """A range counted as ``phase`` in the step breakdown (use ``phase(name)`` to get one)."""

    __slots__ = ("name_id", "phase", "name")

    def __init__(self, name: str, phase: str):
        self.name = name
        self.name_id = _P.intern(name)
        self.phase = phase_id(phase)

    def __enter__(self) -> PhaseRange:
        t = _route.timeline
        if t is None or t.closed:
            _P.begin(self.name_id, self.phase)
        else:
            t.enter(self.name_id, self.phase)
        return self

    def __exit__(self, *exc) -> bool:
        t = _route.timeline
        if t is None or t.closed:
            _P.end(self.name_id)
        else:
            t.exit(self.name_id)
        return False

    def __call__(self, fn: Callable) -> Callable:
        return _decorate(self, fn)

    def __repr__(self) -> str:
        return f"torchspeed.profile.phase({PHASES[self.phase]!r}, name={self.name!r})"


_ranges: Dict[Tuple[str, Optional[str]], object] = {}


def range(name: str, phase: Optional[str] = None):  # noqa: A001 (the torch.profiler-like name)
    """A reusable context manager and decorator that records ``name`` while profiling is on.

    ``phase`` (one of PHASES) makes it count as that phase of the step breakdown; without it the
    range is in the trace and its time belongs to the phase around it. Objects are cached per
    (name, phase), so calling this in a loop costs a dict lookup. Names are interned for the
    life of the process: use a fixed set of names, not one per step (f"batch {i}").
    """
    if not isinstance(name, str):
        raise TypeError(f"torchspeed.profile.range: name must be a str, got {type(name).__name__}")
    if phase is not None:
        phase_id(phase)  # ValueError naming the choices (also for a non-str, unhashable phase)
    if _names.native_id is None:
        _thread_seen()
    key = (name, phase)
    r = _ranges.get(key)
    if r is None:
        try:
            name.encode("utf-8")
        except UnicodeEncodeError:
            raise ValueError(
                "torchspeed.profile.range: name must be valid UTF-8 text (no lone surrogates), "
                f"got {name!r:.80}"
            ) from None
        r = _P.Range(_P.intern(name), _NONE) if phase is None else PhaseRange(name, phase)
        _ranges[key] = r
    return r


def phase(phase: str, name: Optional[str] = None) -> PhaseRange:
    """A range that counts as ``phase`` (data_wait, h2d, forward, backward, optimizer, comm,
    other); named ``name`` in the trace (default: the phase)."""
    phase_id(phase)  # the phase is the argument a bad value most likely is: name it first
    return range(name if name is not None else phase, phase)


def export_chrome_trace(path, profiler=None) -> str:
    """Writes every thread's recorded ranges (and a StepProfiler's steps) as Chrome trace JSON,
    which Perfetto (ui.perfetto.dev) and chrome://tracing open. Returns the path."""
    if not isinstance(path, (str, os.PathLike)):
        raise TypeError(
            "torchspeed.profile.export_chrome_trace: path must be a str or os.PathLike, "
            f"got {type(path).__name__}"
        )
    path = os.fsdecode(os.fspath(path))
    # Python threads are all "python" to the OS: their Python names label the tracks.
    names = dict(_thread_names)
    names.update((t.native_id, t.name) for t in threading.enumerate() if t.native_id is not None)
    names = list(names.items())
    _P.write_chrome_trace(path, getattr(profiler, "_cpp", profiler), names)
    return path
