"""Ranges from Python: ``torchspeed.profile.range(name)`` and ``phase(name)`` (a range that counts
as a phase of the step breakdown, and also marks the CUDA timeline when a StepProfiler runs on a
GPU). Both are C++ context managers, so a ``with`` costs two C++ calls; both are decorators too.

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
    # The StepProfiler running on this thread (one at a time). Its CUDA timeline, if any, is set
    # in C++ (_P._set_timeline): phase ranges then also go to its enter/exit, which record CUDA
    # events at phase boundaries. On the host clock phase ranges are C++ calls only.
    profiler = None


_route = _Route()


def _timeline():
    """The timeline of the StepProfiler running on this thread, or None."""
    p = _route.profiler
    if p is None or p._state != "running":
        _route.profiler = None
        return None
    return p._timeline


#: Open / close a phase range by name id and phase id (hooks, torchspeed's loader and optimizers).
_enter = _P.enter
_exit = _P.exit


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


_ranges: Dict[Tuple[str, Optional[str]], object] = {}


def range(name: str, phase: Optional[str] = None):  # noqa: A001 (the torch.profiler-like name)
    """A reusable context manager and decorator that records ``name`` while profiling is on.

    ``phase`` (one of PHASES) makes it count as that phase of the step breakdown; without it the
    range is in the trace and its time belongs to the phase around it. Objects are cached per
    (name, phase), so calling this in a loop costs a dict lookup. Names are interned for the
    life of the process: use a fixed set of names, not one per step (f"batch {i}").
    """
    try:  # the hot path: a cached range (a dict lookup)
        r = _ranges[(name, phase)]
    except (KeyError, TypeError):
        return _new_range(name, phase)
    if _names.native_id is None:  # this thread's first range: remember its Python name
        _thread_seen()
    return r


def _new_range(name, phase):
    if not isinstance(name, str):
        raise TypeError(f"torchspeed.profile.range: name must be a str, got {type(name).__name__}")
    if phase is not None:
        phase_id(phase)  # ValueError naming the choices (also for a non-str, unhashable phase)
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError(
            "torchspeed.profile.range: name must be valid UTF-8 text (no lone surrogates), "
            f"got {name!r:.80}"
        ) from None
    if _names.native_id is None:
        _thread_seen()
    r = _P.Range(_P.intern(name), _NONE if phase is None else phase_id(phase))
    _ranges[(name, phase)] = r
    return r


def phase(phase: str, name: Optional[str] = None):
    """A range that counts as ``phase`` (data_wait, h2d, forward, backward, optimizer, comm,
    other); named ``name`` in the trace (default: the phase)."""
    try:  # the hot path, as in range()
        r = _phases[(phase, name)]
    except (KeyError, TypeError):
        phase_id(phase)  # the phase is the argument a bad value most likely is: name it first
        r = _phases[(phase, name)] = range(name if name is not None else phase, phase)
    if _names.native_id is None:
        _thread_seen()
    return r


_phases: Dict[Tuple[str, Optional[str]], object] = {}


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
