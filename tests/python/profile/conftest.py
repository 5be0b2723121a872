"""The profiler tests' isolation: everything TorchHooks patches and the recording state are put
back after each test, so a leak a failing test exposes does not spill into the next one."""

import pytest
from profile_helpers import _HOOK_DICTS, _MISSING, _PATCHED, P, _drain_open_ranges

from torchspeed.profile import hooks as hooks_mod
from torchspeed.profile import ranges as ranges_mod
from torchspeed.profile import verify as verify_mod


@pytest.fixture(autouse=True)
def _compile_trials_capture_only(monkeypatch):
    """--verify's torch.compile trial compiles with dynamo's "eager" backend in these tests (the
    capture and the step bookkeeping, without minutes of inductor C++ builds on 2 cores); the
    one test of inductor itself sets it back."""
    monkeypatch.setattr(verify_mod, "COMPILE_BACKEND", "eager")


@pytest.fixture(autouse=True)
def _isolate():
    saved = [(o, n, o.__dict__.get(n, _MISSING)) for o, n in _PATCHED]
    saved_dicts = [dict(d) for d in _HOOK_DICTS]
    was_enabled, ring = P.enabled(), P.ring_capacity()
    _drain_open_ranges()
    yield
    _drain_open_ranges()
    ranges_mod._route.profiler = None
    P._set_timeline(None)
    for o, n, v in saved:
        if v is _MISSING:
            if n in o.__dict__:
                delattr(o, n)
        else:
            setattr(o, n, v)
    for d, s in zip(_HOOK_DICTS, saved_dicts):
        d.clear()
        d.update(s)
    hooks_mod._active_hooks.clear()
    P.set_enabled(was_enabled)
    P.set_ring_capacity(ring)
