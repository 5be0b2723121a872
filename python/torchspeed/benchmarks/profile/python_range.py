"""Section 2, the Python range: ns per `with` block for the torchspeed ranges and phases against
torch.profiler.record_function (outside and inside an active profile) and a bare `with`."""

from __future__ import annotations

import contextlib
import threading
import timeit
from typing import Callable, Dict, Optional

import torch

from ... import _C
from ... import profile as tsp
from .table import TARGET_PY_ON_NS, Table, median_iqr, verdict

_P = _C.profile

# ---- 2. Python range ---------------------------------------------------------------------------


class _Trivial:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def _time_stmt(
    stmt: str, ns: Dict, repeats: int, target_s: float, around: Optional[Callable] = None
) -> Dict:
    """ns per execution of stmt: timeit loops (gc off), sized to ~target_s, median of repeats.
    `around` makes a context entered around each repeat's loop (an active torch.profiler)."""
    timer = timeit.Timer(stmt, globals=ns)
    ctx = around or contextlib.nullcontext
    with ctx():
        probe_n = 2000
        per = timer.timeit(probe_n) / probe_n
    n = max(1000, int(target_s / max(per, 1e-9)))
    vals = []
    for _ in range(repeats):
        with ctx():
            vals.append(timer.timeit(n) / n * 1e9)
    m, iqr, _, _ = median_iqr(vals)
    return {"median_ns": m, "iqr_ns": iqr, "repeats_ns": vals, "n": n}


def python_section(t: Table, quick: bool) -> Dict:
    print("2. Python range cost", flush=True)
    reps = 7 if quick else 9
    target_s = 0.02 if quick else 0.05
    rf = torch.profiler.record_function
    null = contextlib.nullcontext()
    triv = _Trivial()
    pre = tsp.range("x")

    def plain():
        pass

    @tsp.range("deco")
    def deco():
        pass

    ns = {
        "tsp": tsp,
        "torch": torch,
        "null": null,
        "triv": triv,
        "lock": threading.Lock(),
        "pre": pre,
        "plain": plain,
        "deco": deco,
        "rf": rf,
    }

    def cpu_profile():
        return torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU])

    @contextlib.contextmanager
    def in_step_profiler():
        p = tsp.StepProfiler(device="cpu")
        p.start()
        try:
            yield
        finally:
            p.stop()

    def w(ctx: str) -> str:
        return f"with {ctx}:\n    pass"

    off, on = False, True
    # (key, label, statement, torchspeed profiling on, context around each repeat)
    cases = [
        ("empty_loop", "empty loop iteration (`pass`, subtracted below)", "pass", off, None),
        ("nullcontext", "bare with: pre-created contextlib.nullcontext()", w("null"), off, None),
        ("trivial_class", "bare with: trivial class __enter__/__exit__", w("triv"), off, None),
        ("c_lock", "bare with: threading.Lock() (a C __enter__/__exit__)", w("lock"), off, None),
        ("range_off", 'tsp.range("x") inline, profiling off', w('tsp.range("x")'), off, None),
        ("range_on", 'tsp.range("x") inline, profiling on', w('tsp.range("x")'), on, None),
        ("range_pre_off", 'tsp.range("x") pre-created, off', w("pre"), off, None),
        ("range_pre_on", 'tsp.range("x") pre-created, on', w("pre"), on, None),
        ("phase_on", 'tsp.phase("forward") inline, on', w('tsp.phase("forward")'), on, None),
        (
            "phase_in_step_profiler",
            'tsp.phase("forward") in a running StepProfiler',
            w('tsp.phase("forward")'),
            on,
            in_step_profiler,
        ),
        (
            "record_function",
            'torch.profiler.record_function("x"), no profiler',
            w('rf("x")'),
            off,
            None,
        ),
        (
            "record_function_active",
            'record_function("x") in an active profile(CPU)',
            w('rf("x")'),
            off,
            cpu_profile,
        ),
        (
            "autograd_record_function",
            'torch.autograd.profiler.record_function("x")',
            w('torch.autograd.profiler.record_function("x")'),
            off,
            None,
        ),
        ("plain_call", "plain function call f()", "plain()", off, None),
        ("decorated_off", '@tsp.range("deco") f(), profiling off', "deco()", off, None),
        ("decorated_on", '@tsp.range("deco") f(), profiling on', "deco()", on, None),
    ]
    res: Dict = {
        "record_function_is_autograd_record_function": torch.profiler.record_function
        is torch.autograd.profiler.record_function
    }
    was = _P.enabled()
    g = "2. Python range"
    try:
        for key, _, stmt, enable, around in cases:
            _P.set_enabled(enable)
            res[key] = _time_stmt(stmt, ns, reps, target_s, around)
    finally:
        _P.set_enabled(was)
    base = res["empty_loop"]["median_ns"]
    for key, label, _, _, _ in cases:
        r = res[key]
        if key != "empty_loop":
            r["net_ns"] = r["median_ns"] - base
        note = ""
        if key in ("range_on", "range_pre_on", "phase_on", "phase_in_step_profiler"):
            note = (
                f"target <= {TARGET_PY_ON_NS:.0f} ns net: {verdict(r['net_ns'], TARGET_PY_ON_NS)}"
            )
        if key == "autograd_record_function" and res["record_function_is_autograd_record_function"]:
            note = "the same class as torch.profiler.record_function"
        if "net_ns" in r:
            note = f"net {r['net_ns']:.0f} ns" + (f"; {note}" if note else "")
        t.add(g, label, r["median_ns"], "ns/iter", iqr=r["iqr_ns"], note=note, key=key)
    return res
