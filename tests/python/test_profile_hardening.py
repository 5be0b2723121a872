"""Hardening of torchspeed.profile as an adversarial user would drive it: bad names, phases and
arguments get clear errors; misused ranges (exit without enter, exceptions, recursion, the 1024
cap, generators, asyncio, threads, fork) keep the trace whole and nested; StepProfiler lifecycles
(nested, foreign-thread, restarted, two at once) leave nothing behind; hooks are removed on every
way out; phases sum to the step on random layouts; the doctor and its CLI on odd scripts; traces
that are empty, big, unwritable; memory bounded over 50k steps. (Each of the 27 defects these
tests found when written was fixed; the tests keep them fixed.)"""

import asyncio
import io
import json
import os
import subprocess
import sys
import textwrap
import threading
import time

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from torch import nn
from torch.nn.modules import module as mm
from torch.optim import optimizer as om
from torch.utils.data import dataloader as dl

import torchspeed
import torchspeed.profile as tsp
from torchspeed.profile import _doctor
from torchspeed.profile import hooks as hooks_mod
from torchspeed.profile import ranges as ranges_mod
from torchspeed.profile import step as step_mod

P = torchspeed._C.profile
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
_MISSING = object()

# Everything TorchHooks patches (owner, attribute): the fixture puts them back after each test, so
# a leak a failing test exposes does not spill into the next one.
_PATCHED = [
    (torch.autograd, "backward"),
    (torch, "tensor"),
    (dl._BaseDataLoaderIter, "__next__"),
    (dl.DataLoader, "__iter__"),
    (torch.optim.Optimizer, "zero_grad"),
    (nn.Module, "zero_grad"),
    (torch.Tensor, "to"),
    (torch.Tensor, "cuda"),
]
if torch.distributed.is_available():
    _PATCHED += [
        (torch.distributed, n) for n in hooks_mod._COLLECTIVES if hasattr(torch.distributed, n)
    ]
_HOOK_DICTS = [
    mm._global_forward_pre_hooks,
    mm._global_forward_hooks,
    mm._global_forward_hooks_always_called,
    om._global_optimizer_pre_hooks,
    om._global_optimizer_post_hooks,
]
ORIG = {(id(o), n): getattr(o, n) for o, n in _PATCHED}


def _drain_open_ranges() -> int:
    n = 0
    while n < 5000 and P.end():
        n += 1
    return n


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


def _events(name=None, tid=None):
    """(begin_ns, end_ns, name, phase) of the rings (since the last P.clear())."""
    out = []
    for os_tid, _, evs in P.snapshot():
        if tid is not None and os_tid != tid:
            continue
        for b, e, nid, ph in evs:
            n = P.name_of(nid)
            if name is None or n == name:
                out.append((b, e, n, ph))
    return out


def _record():
    P.set_enabled(True)
    P.clear()


def _assert_hooks_removed():
    for o, n in _PATCHED:
        assert getattr(o, n) is ORIG[(id(o), n)], (
            f"{getattr(o, '__name__', o)}.{n} is still patched"
        )
    assert not mm._global_forward_pre_hooks
    assert not mm._global_forward_hooks
    assert not om._global_optimizer_pre_hooks and not om._global_optimizer_post_hooks
    assert not hooks_mod._active_hooks
    assert ranges_mod._timeline() is None


def _model():
    torch.manual_seed(0)
    m = nn.Linear(4, 2)
    return m, torch.optim.SGD(m.parameters(), lr=0.1)


def _train_step(m, opt):
    m(torch.randn(8, 4)).sum().backward()
    opt.step()
    opt.zero_grad()


def _load_trace(path):
    with open(path) as f:
        return json.load(f)


def _assert_nested(trace):
    """Every thread's X events nest (no partial overlap), as Perfetto requires on one track."""
    by_tid = {}
    for e in trace["traceEvents"]:
        if e["ph"] == "X":
            b = round(float(e["ts"]) * 1000)  # integer ns: the file has exact ns decimals
            by_tid.setdefault(e["tid"], []).append(
                (b, b + round(float(e["dur"]) * 1000), e["name"])
            )
    for tid, evs in by_tid.items():
        evs.sort(key=lambda x: (x[0], -x[1]))
        stack = []
        for b, e, n in evs:
            while stack and stack[-1][1] <= b:
                stack.pop()
            if stack:
                assert e <= stack[-1][1], (
                    f"tid {tid}: {n!r} [{b}, {e}] ns overlaps {stack[-1][2]!r} partially"
                )
            stack.append((b, e, n))


# ---- range() / phase(): names and phases ----------------------------------------------------------


@pytest.mark.parametrize("name", [None, b"x", 3, 1.5, object()])
def test_range_rejects_non_str_names_naming_the_argument(name):
    with pytest.raises(TypeError, match=r"torchspeed\.profile\.range: name must be a str"):
        tsp.range(name)


@pytest.mark.parametrize("args", [([1],), ({"a": 1},), ("x", ["forward"])])
def test_range_rejects_unhashable_names_and_phases_naming_torchspeed(args):
    with pytest.raises((TypeError, ValueError), match=r"^torchspeed\.profile"):
        tsp.range(*args)


def test_range_rejects_lone_surrogates_naming_torchspeed():
    with pytest.raises((TypeError, ValueError), match=r"^torchspeed\.profile.*name"):
        tsp.range("bad\udcffname")
    assert ("bad\udcffname", None) not in ranges_mod._ranges


@pytest.mark.parametrize("phase", ["bogus", "", 3, "none", "Forward"])
def test_range_with_a_bad_phase_names_the_choices(phase):
    with pytest.raises(ValueError, match=r"torchspeed\.profile: phase must be one of data_wait"):
        tsp.range("x", phase)
    with pytest.raises(ValueError, match="phase must be one of"):
        tsp.phase(phase, name="x")


@pytest.mark.parametrize("phase", [None, 5])
def test_phase_with_a_non_str_phase_names_the_phase_argument(phase):
    with pytest.raises(ValueError, match="phase must be one of"):
        tsp.phase(phase)


@pytest.mark.parametrize("make", [lambda: tsp.range("deco"), lambda: tsp.phase("forward", "deco")])
def test_decorating_a_non_callable_is_a_clear_type_error(make):
    with pytest.raises(TypeError, match=r"^torchspeed\.profile"):
        make()(5)


def test_odd_but_valid_names_survive_into_a_trace_intact(tmp_path):
    names = [
        'a"b',
        "new\nline",
        "nul\x00byte",
        "back\\slash",
        "tab\t",
        "é漢字🚀",
        "",
        "</script>",
        "\x7f\x1f",
        "x" * (1 << 20),
    ]
    _record()
    for n in names:
        with tsp.range(n):
            pass
    path = tsp.export_chrome_trace(str(tmp_path / "names.json"))
    got = [e["name"] for e in _load_trace(path)["traceEvents"] if e["ph"] == "X"]
    for n in names:
        assert got.count(n) == 1, repr(n[:20])


# ---- range misuse -------------------------------------------------------------------------------


def test_exit_without_enter_is_a_harmless_no_op():
    _record()
    r, ph = tsp.range("never_entered"), tsp.phase("forward", "never_entered_phase")
    assert r.__exit__(None, None, None) is False
    assert ph.__exit__(None, None, None) is False
    assert P.end() is False
    assert _events() == []


def test_exit_of_a_range_never_entered_leaves_the_open_one_alone():
    _record()
    with tsp.range("A_open"):
        tsp.range("B_never").__exit__(None, None, None)
        time.sleep(0.01)
    (ev,) = _events("A_open")
    assert ev[1] - ev[0] >= 8e6


@pytest.mark.parametrize("make", [lambda: tsp.range("exc"), lambda: tsp.phase("backward", "exc")])
def test_exception_inside_with_closes_the_range_and_propagates_unchanged(make):
    _record()
    err = KeyError("mine")
    with pytest.raises(KeyError) as info:
        with make():
            raise err
    assert info.value is err
    assert len(_events("exc")) == 1
    assert P.end() is False


def test_recursion_with_one_cached_range_records_every_level_nested():
    _record()
    r = tsp.range("recurse")

    def f(n):
        with r:
            if n:
                f(n - 1)

    f(200)
    evs = sorted(_events("recurse"), key=lambda e: e[0])
    assert len(evs) == 201
    for outer, inner in zip(evs, evs[1:]):
        assert outer[0] <= inner[0] and inner[1] <= outer[1]
    assert P.end() is False


def test_more_than_1024_nested_opens_stay_balanced():
    _record()
    nid = P.intern("deep_open")
    for _ in range(1500):
        P.begin(nid)
    closed = sum(P.end() for _ in range(1500))
    assert closed == 1500
    assert P.end() is False
    assert len(_events("deep_open")) == 1024  # the cap: the 476 innermost are not recorded


def test_ranges_past_the_cap_are_counted_as_dropped():
    _record()
    nid = P.intern("deep_open")
    for _ in range(1500):
        P.begin(nid)
    for _ in range(1500):
        P.end()
    assert P.dropped_events() == 476


def test_range_open_across_a_yield_in_lifo_use():
    _record()

    def gen():
        with tsp.range("gen_body"):
            yield 1
            yield 2

    it = gen()
    next(it)
    with tsp.range("between"):
        pass
    assert list(it) == [2]
    assert {e[2] for e in _events()} == {"gen_body", "between"}
    assert P.end() is False


def test_interleaved_async_ranges_keep_their_own_ends(tmp_path):
    _record()
    exited = {}

    async def task(name, hold):
        with tsp.range(name):
            await asyncio.sleep(hold)
        exited[name] = P.now_ns()

    async def main():
        await asyncio.gather(task("task_a", 0.01), task("task_b", 0.05))

    asyncio.run(main())
    for name in ("task_a", "task_b"):
        (ev,) = _events(name)
        assert 0 <= exited[name] - ev[1] < 5e6, (
            f"{name} ends {(exited[name] - ev[1]) / 1e6:.1f} ms off"
        )
    _assert_nested(_load_trace(tsp.export_chrome_trace(str(tmp_path / "t.json"))))


def _run_threads(n, target):
    ts = [threading.Thread(target=target, args=(i,), name=f"worker{i}") for i in range(n)]
    for t in ts:
        t.start()
    for t in ts:
        t.join(timeout=30)
        assert not t.is_alive()


def test_ranges_in_8_threads_land_on_their_own_tracks_after_the_threads_exit(tmp_path):
    _record()
    native = {}

    def work(i):
        native[i] = threading.get_native_id()
        for _ in range(200):
            with tsp.range(f"t{i}"):
                with tsp.range(f"t{i}.inner"):
                    pass

    _run_threads(8, work)  # every thread has exited before the export
    d = _load_trace(tsp.export_chrome_trace(str(tmp_path / "threads.json")))
    per = {}
    for e in d["traceEvents"]:
        if e["ph"] == "X" and e["name"].startswith("t") and e["name"][1].isdigit():
            per.setdefault(e["tid"], []).append(e["name"])
    assert len(per) == 8
    for i in range(8):
        names = per[native[i]]
        assert sorted(set(names)) == [f"t{i}", f"t{i}.inner"] and len(names) == 400
    tids = {e["tid"] for e in d["traceEvents"] if e["ph"] == "M" and e["name"] == "thread_name"}
    assert set(native.values()) <= tids
    _assert_nested(d)


def test_trace_thread_tracks_carry_the_python_thread_names(tmp_path):
    _record()
    native = {}

    def work(i):
        native[i] = threading.get_native_id()
        with tsp.range("named"):
            pass

    _run_threads(2, work)
    d = _load_trace(tsp.export_chrome_trace(str(tmp_path / "names.json")))
    names = {
        e["tid"]: e["args"]["name"]
        for e in d["traceEvents"]
        if e["ph"] == "M" and e["name"] == "thread_name"
    }
    assert [names[native[i]] for i in range(2)] == ["worker0", "worker1"]


_FORK_SCRIPT = r"""
import json, os, sys, threading, time
import torchspeed.profile as tsp
P = tsp.ranges._P
P.set_enabled(True)
with tsp.range("parent_before"):
    pass
stop = threading.Event()
def spin():
    while not stop.is_set():
        with tsp.range("bg"):
            pass
t = threading.Thread(target=spin, daemon=True)
t.start()
time.sleep(0.05)
r = tsp.range("open_across_fork")
r.__enter__()
out = sys.argv[1]
pid = os.fork()
if pid == 0:
    code = 1
    try:
        with tsp.range("child"):
            pass
        closed = P.end()  # the range the parent had open
        path = os.path.join(out, "child.json")
        tsp.export_chrome_trace(path)
        d = json.load(open(path))
        ch = [e for e in d["traceEvents"] if e.get("name") == "child"]
        json.dump({"closed": closed, "n_child": len(ch), "tid": ch[0]["tid"], "pid": ch[0]["pid"],
                   "native": threading.get_native_id(), "getpid": os.getpid()},
                  open(os.path.join(out, "child_result.json"), "w"))
        code = 0
    finally:
        os._exit(code)
_, st = os.waitpid(pid, 0)
r.__exit__(None, None, None)
stop.set()
t.join()
print("CHILD_STATUS", os.waitstatus_to_exitcode(st))
"""


@pytest.fixture(scope="module")
def fork_result(tmp_path_factory):
    d = tmp_path_factory.mktemp("fork")
    script = d / "fork.py"
    script.write_text(_FORK_SCRIPT)
    p = subprocess.run(
        [sys.executable, str(script), str(d)], capture_output=True, text=True, timeout=90
    )
    assert p.returncode == 0, p.stderr[-2000:]
    assert "CHILD_STATUS 0" in p.stdout, p.stdout + p.stderr[-2000:]
    with open(d / "child_result.json") as f:
        return json.load(f)


def test_fork_with_an_open_range_child_exports_a_trace(fork_result):
    assert fork_result["closed"] is True  # the inherited open range closes in the child
    assert fork_result["n_child"] == 1
    assert fork_result["pid"] == fork_result["getpid"]


def test_fork_child_events_carry_the_child_thread_id(fork_result):
    assert fork_result["tid"] == fork_result["native"]


# ---- StepProfiler: arguments --------------------------------------------------------------------


@pytest.mark.parametrize(
    "kw, match",
    [
        (dict(warmup=-1), "warmup"),
        (dict(warmup=1.5), "warmup"),
        (dict(device="tpu"), "device"),
        (dict(step_on="x"), "step_on"),
        (dict(step_on="Optimizer"), "step_on"),
        (dict(history_steps=0), "history_steps"),
    ],
)
def test_step_profiler_bad_arguments_are_clear_value_errors(kw, match):
    with pytest.raises(ValueError, match=rf"torchspeed\.profile\.StepProfiler: {match}"):
        tsp.StepProfiler(**kw)


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_step_profiler_cuda_without_cuda_is_a_clear_error():
    with pytest.raises(ValueError, match="device='cuda' but CUDA is not available"):
        tsp.StepProfiler(device="cuda")


@pytest.mark.parametrize("hs", [-1, 1.5, "8", True])
def test_step_profiler_history_steps_of_a_wrong_type_is_named(hs):
    with pytest.raises(
        (ValueError, TypeError), match=r"^torchspeed\.profile\.StepProfiler: history_steps"
    ):
        tsp.StepProfiler(history_steps=hs)


@pytest.mark.parametrize("which", ["warmup", "doctor_steps"])
def test_bools_are_not_counts(which):
    with pytest.raises((ValueError, TypeError), match=r"^torchspeed\.profile"):
        if which == "warmup":
            tsp.StepProfiler(warmup=True)
        else:
            with tsp.doctor(steps=True, out=None, progress=False, file=io.StringIO()):
                pass


@pytest.mark.parametrize("samples", [-5, 1.7, "abc", 2**70])
def test_step_samples_are_validated(samples):
    prof = tsp.StepProfiler(device="cpu")
    with prof:
        with pytest.raises(
            (ValueError, TypeError), match=r"^torchspeed\.profile\.StepProfiler\.step: samples"
        ):
            prof.step(samples)
        assert prof.steps == 0


@pytest.mark.skipif(P.nvtx_available(), reason="needs a build without NVTX")
def test_nvtx_without_cuda_fails_leaving_nothing_half_done():
    P.set_enabled(False)
    with pytest.raises((RuntimeError, ValueError), match="NVTX"):
        tsp.StepProfiler(device="cpu", nvtx=True).start()
    assert ranges_mod._timeline() is None
    assert P.enabled() is False


# ---- StepProfiler: lifecycle ---------------------------------------------------------------------


def test_step_without_start_records_no_zero_length_step():
    prof = tsp.StepProfiler(device="cpu", warmup=0)
    for _ in range(4):
        time.sleep(0.002)
        prof.step()
    prof.stop()
    h = prof.history()
    assert len(h) >= 3
    assert min(h.step_ns) >= 1.5e6, h.step_ns


def test_step_from_another_thread_raises_and_records_nothing():
    prof = tsp.StepProfiler(device="cpu")
    errors = []
    with prof:
        prof.step()

        def other():
            try:
                prof.step()
            except RuntimeError as e:
                errors.append(str(e))

        t = threading.Thread(target=other)
        t.start()
        t.join(timeout=30)
        assert prof.steps == 1
    assert len(errors) == 1 and "thread that started the profiler" in errors[0]


def test_two_profilers_on_one_thread_the_second_refuses_and_the_first_keeps_working():
    P.set_enabled(False)
    a, b = tsp.StepProfiler(device="cpu", warmup=0), tsp.StepProfiler(device="cpu")
    with a:
        with pytest.raises(RuntimeError, match="another StepProfiler is running on this thread"):
            b.start()
        with tsp.phase("forward"):
            time.sleep(0.005)
        a.step()
        assert a.history().phase_ns["forward"][-1] >= 4e6
        assert b.steps == 0
    assert P.enabled() is False
    assert ranges_mod._timeline() is None


def test_nested_with_of_one_profiler_keeps_it_running_or_refuses():
    prof = tsp.StepProfiler(device="cpu", warmup=0)
    with prof:
        try:
            with prof:
                prof.step()
        except RuntimeError:
            pass  # refusing the nested enter is fine too
        assert P.enabled()
        prof.step()
        with tsp.phase("forward"):
            time.sleep(0.005)
        prof.step()
        assert prof.history().phase_ns["forward"][-1] >= 4e6


def test_stop_twice_and_stop_before_start_are_no_ops():
    P.set_enabled(False)
    prof = tsp.StepProfiler(device="cpu", hooks=True)
    prof.stop()
    with prof:
        prof.step()
    prof.stop()
    prof.stop()
    assert P.enabled() is False
    _assert_hooks_removed()
    assert prof.steps == 1


def test_step_after_stop_does_not_reinstall_the_hooks():
    P.set_enabled(False)
    prof = tsp.StepProfiler(device="cpu", hooks=True)
    with prof:
        prof.step()
    try:
        prof.step()
    except RuntimeError:
        pass  # refusing is fine
    assert P.enabled() is False
    _assert_hooks_removed()


def test_summary_and_report_with_zero_and_one_step():
    prof = tsp.StepProfiler(device="cpu")
    s = prof.summary()
    assert (
        s.steps == 0
        and s.step_median_s == 0.0
        and all(st_.share == 0.0 for st_ in s.phases.values())
    )
    assert "no steps summarized" in prof.report()
    with prof:
        time.sleep(0.002)
        prof.step()
    s = prof.summary()
    assert s.steps == 1  # warmup=1 keeps the only step rather than summarizing nothing
    assert s.step_median_s >= 1.5e-3
    assert abs(sum(p.share for p in s.phases.values()) - 1.0) < 1e-9
    assert "1 step summarized" in prof.report()


def test_history_is_bounded_and_the_trace_numbers_the_kept_steps(tmp_path):
    prof = tsp.StepProfiler(device="cpu", history_steps=8)
    with prof:
        for _ in range(100):
            prof.step()
    h = prof.history()
    assert len(h) == 8 and h.steps_dropped == 92 and prof.steps == 100
    assert all(len(v) == 8 for v in h.phase_ns.values()) and len(h.end_ns) == 8
    assert h.end_ns == sorted(h.end_ns)
    d = _load_trace(prof.export_chrome_trace(str(tmp_path / "t.json")))
    steps = [e["name"] for e in d["traceEvents"] if e.get("cat") == "step"]
    assert steps == [f"step {i}" for i in range(92, 100)]


def test_profilers_on_two_threads_do_not_switch_each_other_off():
    P.set_enabled(False)
    a, b = tsp.StepProfiler(device="cpu"), tsp.StepProfiler(device="cpu", warmup=0)
    started, b_started, a_stopped = threading.Event(), threading.Event(), threading.Event()

    def run_a():
        a.start()
        started.set()
        b_started.wait(30)
        a.stop()
        a_stopped.set()

    t = threading.Thread(target=run_a)
    t.start()
    assert started.wait(30)
    with b:
        b_started.set()
        assert a_stopped.wait(30)
        assert P.enabled()
        with tsp.phase("forward"):
            time.sleep(0.005)
        b.step()
        assert b.history().phase_ns["forward"][-1] >= 4e6
    t.join(timeout=30)


def test_a_second_hooked_profiler_is_refused_and_the_first_removes_every_hook():
    # torch's hooks are process-wide: one hooked profiler at a time (a second one on another
    # thread is a clear error, not a tangle of patches restored out of order).
    a, b = tsp.StepProfiler(device="cpu", hooks=True), tsp.StepProfiler(device="cpu", hooks=True)
    started, tried = threading.Event(), threading.Event()

    def run_a():
        a.start()
        started.set()
        tried.wait(30)
        a.stop()

    t = threading.Thread(target=run_a)
    t.start()
    assert started.wait(30)
    with pytest.raises(
        RuntimeError, match=r"^torchspeed\.profile\.StepProfiler: hooks=True while another"
    ):
        b.start()
    tried.set()
    t.join(timeout=30)
    _assert_hooks_removed()
    b.start()  # free again once the first has stopped
    b.stop()
    _assert_hooks_removed()


def test_stop_from_another_thread_releases_the_starting_thread():
    prof = tsp.StepProfiler(device="cpu")
    prof.start()
    prof.step()
    t = threading.Thread(target=prof.stop)
    t.start()
    t.join(timeout=30)
    assert ranges_mod._timeline() is None  # the stopped timeline is dropped on this thread
    q = tsp.StepProfiler(device="cpu")
    q.start()  # raises "another StepProfiler is running on this thread" today
    q.stop()


# ---- hooks: every way out removes them ----------------------------------------------------------


@pytest.mark.parametrize("exc", [RuntimeError("boom"), KeyboardInterrupt()])
def test_exception_inside_with_prof_removes_every_hook(exc):
    P.set_enabled(False)
    m, opt = _model()
    prof = tsp.StepProfiler(device="cpu", hooks=True)
    with pytest.raises(type(exc)) as info:
        with prof:
            assert torch.autograd.backward is not ORIG[(id(torch.autograd), "backward")]
            assert mm._global_forward_pre_hooks
            _train_step(m, opt)
            prof.step()
            with tsp.phase("forward", "open_at_raise"):
                raise exc
    assert info.value is exc
    _assert_hooks_removed()
    assert P.enabled() is False
    assert P.end() is False
    _train_step(m, opt)  # plain torch still works


def test_h2d_patches_pass_non_copies_through_and_are_removed(monkeypatch):
    monkeypatch.setattr(
        torch.cuda, "is_available", lambda: True
    )  # installs the Tensor.to/.cuda patches
    prof = tsp.StepProfiler(device="cpu", hooks=True)
    x = torch.ones(3)
    with prof:
        assert torch.Tensor.to is not ORIG[(id(torch.Tensor), "to")]
        assert x.to(torch.float64).dtype == torch.float64
        assert x.to("cpu").device.type == "cpu"
        assert x.to(torch.ones(1, dtype=torch.int32)).dtype == torch.int32
        assert x.to(dtype=torch.float16, copy=True).dtype == torch.float16
        with pytest.raises(TypeError):
            x.to(object())  # torch's own error
    _assert_hooks_removed()


def test_hook_removal_leaves_no_shadowing_class_attributes(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    before = {n: n in torch.Tensor.__dict__ for n in ("to", "cuda")}
    with tsp.StepProfiler(device="cpu", hooks=True):
        pass
    assert {n: n in torch.Tensor.__dict__ for n in ("to", "cuda")} == before


class _FailingModel(nn.Module):
    def __init__(self):
        super().__init__()
        self.inner = nn.Sequential(nn.Linear(4, 4), nn.ReLU())
        self.head = nn.Linear(4, 2)
        self.fail = False

    def forward(self, x):
        x = self.inner(x)
        if self.fail:
            raise RuntimeError("forward failed")
        return self.head(x)


def test_forward_that_raises_does_not_leak_the_phase_stack():
    m = _FailingModel()
    opt = torch.optim.SGD(m.parameters(), lr=0.1)
    prof = tsp.StepProfiler(device="cpu", hooks=True, warmup=0)
    with prof:
        for i in range(8):  # fails in discovery (1) and after it (5)
            m.fail = i in (1, 5)
            try:
                _train_step(m, opt)
            except RuntimeError:
                pass
            with tsp.phase("data_wait"):
                time.sleep(0.003)
            prof.step()
        assert prof._hooks.depth == 0
    assert P.end() is False
    h = prof.history()
    for i in range(len(h)):
        assert sum(h.phase_ns[p][i] for p in tsp.PHASES) == h.step_ns[i]
        assert h.phase_ns["data_wait"][i] >= 2.5e6  # never swallowed by a leaked forward
        assert h.phase_ns["forward"][i] < h.step_ns[i] / 2
    assert h.phase_ns["backward"][1] == 0 and h.phase_ns["backward"][5] == 0


def test_optimizer_step_that_raises_does_not_leak_the_optimizer_phase():
    m, opt = _model()

    def bad_closure():
        raise RuntimeError("closure failed")

    prof = tsp.StepProfiler(device="cpu", hooks=True, warmup=0)
    with prof:
        prof.step()
        with tsp.phase("forward", "user_forward"):
            with pytest.raises(RuntimeError):
                opt.step(bad_closure)
            time.sleep(0.02)
        prof.step()
    h = prof.history()
    assert h.phase_ns["optimizer"][-1] < 5e6
    assert h.phase_ns["forward"][-1] >= 15e6
    assert P.end() is False


def test_optimizer_step_inside_a_forward_does_not_leak_a_forward_phase():
    class Trainer(nn.Module):
        def __init__(self):
            super().__init__()
            self.model, self.opt = _model()

        def forward(self, x):
            loss = self.model(x).sum()
            loss.backward()
            self.opt.step()
            self.opt.zero_grad()
            return loss

    t = Trainer()
    prof = tsp.StepProfiler(device="cpu", hooks=True, step_on="optimizer")
    with prof:
        for _ in range(6):
            t(torch.randn(8, 4))
    assert prof.steps == 6
    assert P.end() is False


# ---- phases sum to the step ---------------------------------------------------------------------

_OP = st.one_of(
    st.tuples(st.just("enter"), st.sampled_from(list(tsp.PHASES) + [None])),
    st.just(("exit",)),
    st.just(("step",)),
    st.tuples(st.just("spin"), st.integers(0, 300)),
)


def _spin_us(us):
    t0 = time.perf_counter_ns()
    while time.perf_counter_ns() - t0 < us * 1000:
        pass


def _play(prof, ops):
    names = {
        p: (tsp.phase(p, f"hyp.{p}") if p else tsp.range("hyp.plain"))
        for p in list(tsp.PHASES) + [None]
    }
    open_ = []
    with prof:
        for op in ops:
            if op[0] == "enter" and len(open_) < 50:
                r = names[op[1]]
                r.__enter__()
                open_.append(r)
            elif op[0] == "exit" and open_:
                open_.pop().__exit__(None, None, None)
            elif op[0] == "step":
                prof.step()
            elif op[0] == "spin":
                _spin_us(op[1])
        while open_:
            open_.pop().__exit__(None, None, None)
        prof.step()


def _assert_sums(h, n_steps):
    assert len(h) == n_steps
    for i in range(len(h)):
        assert h.step_ns[i] >= 0
        assert all(h.phase_ns[p][i] >= 0 for p in tsp.PHASES)
        assert sum(h.phase_ns[p][i] for p in tsp.PHASES) == h.step_ns[i], i


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(_OP, max_size=60))
def test_phases_sum_exactly_to_the_step_on_random_layouts(ops):
    prof = tsp.StepProfiler(device="cpu", warmup=0, history_steps=1000)
    _play(prof, ops)
    _assert_sums(prof.history(), 1 + sum(op[0] == "step" for op in ops))
    assert P.end() is False


class _HostEvent:
    """A stand-in torch.cuda.Event on the host clock (the GPU keeps up)."""

    def __init__(self, enable_timing=False):
        self.t = None

    def record(self, stream=None):
        self.t = time.perf_counter_ns()

    def query(self):
        return True

    def synchronize(self):
        pass

    def elapsed_time(self, end):
        return (end.t - self.t) / 1e6


@settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(st.lists(_OP, max_size=60))
def test_cuda_timeline_phases_sum_exactly_to_the_step_on_random_layouts(monkeypatch, ops):
    monkeypatch.setattr(torch.cuda, "Event", _HostEvent)
    prof = tsp.StepProfiler(device="cpu", warmup=0, history_steps=1000)
    prof._timeline = step_mod._CudaTimeline(prof._cpp)
    _play(prof, ops)
    h = prof.history()
    assert h.clock == "cuda"
    _assert_sums(h, sum(op[0] == "step" for op in ops) + 1)


class _LaggingEvent(_HostEvent):
    """A GPU running behind: nothing completes until someone synchronizes."""

    def record(self, stream=None):
        super().record()
        self.done = False

    def query(self):
        return self.done

    def synchronize(self):
        self.done = True


def test_doctor_stops_after_its_steps_while_the_gpu_runs_behind(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "Event", _LaggingEvent)
    m, opt = _model()
    ran = 0
    with tsp.doctor(steps=3, device="cuda", out=None, progress=False, file=io.StringIO()):
        for _ in range(30):
            _train_step(m, opt)
            ran += 1
    assert ran == 2  # the third opt.step() raises StopRun


# ---- memory -------------------------------------------------------------------------------------


def _rss():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def test_50k_steps_with_phases_keep_memory_bounded():
    fw, bw, inner = tsp.phase("forward"), tsp.phase("backward"), tsp.range("mem.inner")
    prof = tsp.StepProfiler(device="cpu")
    with prof:
        for _ in range(2000):
            prof.step()
        r0 = _rss()
        for _ in range(50_000):
            with fw:
                pass
            with bw:
                with inner:
                    pass
            prof.step()
    grown = _rss() - r0
    assert grown < 10e6, f"RSS grew {grown / 1e6:.1f} MB"
    assert len(prof.history()) == 16384 and prof.steps == 52_000


# ---- traces -------------------------------------------------------------------------------------


def test_export_with_no_events_is_valid_json(tmp_path):
    P.clear()
    d = _load_trace(tsp.export_chrome_trace(str(tmp_path / "empty.json")))
    assert [e for e in d["traceEvents"] if e["ph"] != "M"] == []
    assert d["otherData"]["dropped_events"] == 0
    assert {e["name"] for e in d["traceEvents"]} <= {"process_name", "thread_name"}


def test_export_100k_events_is_fast_and_complete(tmp_path):
    P.set_ring_capacity(1 << 17)  # the ring of the thread created below
    _record()

    def work(_):
        r = tsp.range("bulk")
        for _ in range(100_000):
            with r:
                pass

    _run_threads(1, work)
    t0 = time.perf_counter()
    path = tsp.export_chrome_trace(str(tmp_path / "big.json"))
    dt = time.perf_counter() - t0
    d = _load_trace(path)
    assert sum(e["name"] == "bulk" for e in d["traceEvents"]) == 100_000
    assert d["otherData"]["dropped_events"] == 0
    assert dt < 2.0, f"export took {dt:.2f} s"


@pytest.mark.parametrize("where", ["missing_dir", "is_a_dir"])
def test_export_to_an_unwritable_path_is_a_clear_error_with_no_leftovers(tmp_path, where):
    _record()
    with tsp.range("x"):
        pass
    target = tmp_path / "nope" / "t.json" if where == "missing_dir" else tmp_path / "adir"
    if where == "is_a_dir":
        target.mkdir()
    before = sorted(os.listdir(tmp_path))
    with pytest.raises((OSError, RuntimeError), match=r"^torchspeed\.profile"):
        tsp.export_chrome_trace(str(target))
    assert sorted(os.listdir(tmp_path)) == before
    if where == "is_a_dir":
        assert os.listdir(target) == []


def test_export_to_none_is_a_type_error(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    try:
        with pytest.raises(TypeError, match=r"^torchspeed\.profile.*path"):
            tsp.export_chrome_trace(None)
    finally:
        assert not (tmp_path / "None").exists()


def test_trace_structure_of_a_hooked_run_with_worker_threads(tmp_path):
    P.clear()
    m, opt = _model()
    stop = threading.Event()

    def worker(_):
        while not stop.is_set():
            with tsp.range("worker.outer"):
                with tsp.phase("data_wait", "worker.load"):
                    time.sleep(0.0005)

    t = threading.Thread(target=worker, args=(0,))
    prof = tsp.StepProfiler(device="cpu", hooks=True)
    with prof:
        t.start()
        for _ in range(6):
            with tsp.range("user.step"):
                with tsp.phase("data_wait", "user.load"):
                    time.sleep(0.001)
                _train_step(m, opt)
            prof.step()
        stop.set()
        t.join(timeout=30)
    d = _load_trace(prof.export_chrome_trace(str(tmp_path / "t.json")))
    assert isinstance(d["otherData"]["dropped_events"], int)
    thread_tracks = set()
    x_tids = set()
    for e in d["traceEvents"]:
        assert {"ph", "name", "pid", "tid"} <= set(e), e
        assert e["pid"] == os.getpid()
        if e["ph"] == "X":
            assert float(e["ts"]) >= 0 and float(e["dur"]) >= 0
            x_tids.add(e["tid"])
        elif e["ph"] == "M" and e["name"] == "thread_name":
            thread_tracks.add(e["tid"])
        else:
            assert e["ph"] == "M" and e["name"] == "process_name"
    assert x_tids <= thread_tracks and len(x_tids) >= 3  # main, worker, steps (tid 0)
    names = {e["name"] for e in d["traceEvents"] if e["ph"] == "X"}
    assert {
        "user.step",
        "user.load",
        "torch.forward",
        "torch.backward",
        "torch.optimizer",
        "worker.load",
    } <= names
    assert sum(e.get("cat") == "step" for e in d["traceEvents"]) == prof.steps
    _assert_nested(d)


# ---- the doctor -----------------------------------------------------------------------------------


@pytest.mark.parametrize("steps", [0, -1, "5", 1.5])
def test_doctor_rejects_bad_steps_before_running_the_block(steps):
    ran = []
    with pytest.raises(ValueError, match=r"torchspeed\.profile\.doctor: steps must be an int >= 1"):
        with tsp.doctor(steps=steps, out=None, progress=False):
            ran.append(1)
    assert ran == []
    _assert_hooks_removed()


def test_doctor_block_without_an_optimizer_step_has_nothing_to_report(tmp_path):
    out, buf = tmp_path / "out", io.StringIO()
    m, _ = _model()
    with tsp.doctor(steps=5, out=str(out), progress=False, file=buf):
        m(torch.randn(2, 4))
    assert "no optimizer step ran, nothing to report" in buf.getvalue()
    assert not out.exists()
    _assert_hooks_removed()


def test_doctor_stop_is_not_swallowed_by_the_blocks_except_exception(tmp_path):
    m, opt = _model()
    buf, steps, swallowed = io.StringIO(), 0, 0
    with tsp.doctor(steps=3, out=str(tmp_path / "o"), png=False, progress=False, file=buf) as prof:
        for _ in range(1000):
            try:
                _train_step(m, opt)
                steps += 1
            except Exception:
                swallowed += 1
    assert swallowed == 0 and steps == 2 and prof.steps == 3
    assert "written:" in buf.getvalue()
    for f in ("report.txt", "summary.json", "trace.json"):
        assert (tmp_path / "o" / f).exists()
    json.loads((tmp_path / "o" / "summary.json").read_text())
    _assert_hooks_removed()


def test_doctor_with_an_unwritable_out_fails_first_or_still_prints_the_report(tmp_path):
    (tmp_path / "afile").write_text("")
    bad = str(tmp_path / "afile" / "sub")
    m, opt = _model()
    ran, buf = 0, io.StringIO()
    try:
        with tsp.doctor(steps=3, out=bad, png=False, progress=False, file=buf):
            for _ in range(5):
                _train_step(m, opt)
                ran += 1
    except (OSError, ValueError):
        pass
    assert ran == 0 or "data_wait" in buf.getvalue()


_SCRIPT = textwrap.dedent(
    """
    import json, sys
    import torch
    from torch import nn
    print("ARGV " + json.dumps(sys.argv))
    print("NAME " + __name__)
    sys.path.append("/added/by/the/script")
    mode = sys.argv[1] if len(sys.argv) > 1 else "ok"
    m = nn.Linear(4, 2)
    opt = torch.optim.SGD(m.parameters(), lr=0.1)

    def step():
        m(torch.randn(8, 4)).sum().backward()
        opt.step()
        opt.zero_grad()

    if __name__ == "__main__":
        if mode == "exit3":
            step(); step(); sys.exit(3)
        if mode == "exitstr":
            step(); step(); sys.exit("bad config: lr must be > 0")
        if mode == "raise":
            step(); step(); raise RuntimeError("the script failed")
        if mode == "interrupt":
            step(); step(); raise KeyboardInterrupt
        if mode == "forever":
            while True:
                try:
                    step()
                except Exception:
                    print("SWALLOWED")
        for _ in range(2):
            step()
        print("DONE")
    """
)


@pytest.fixture
def script(tmp_path):
    p = tmp_path / "train.py"
    p.write_text(_SCRIPT)
    return str(p)


def _run(argv, tmp_path, **kw):
    return _doctor.run(argv, out=str(tmp_path / "out"), png=False, progress=False, **kw)


def test_run_passes_argv_through_runs_main_and_restores_sys(script, tmp_path, capsys):
    argv0, path0 = list(sys.argv), list(sys.path)
    assert _run(["python", script, "ok", "--lr", "0.1", "--", "x y"], tmp_path) == 0
    out = capsys.readouterr().out
    assert f"ARGV {json.dumps([script, 'ok', '--lr', '0.1', '--', 'x y'])}" in out
    assert "NAME __main__" in out and "DONE" in out
    assert sys.argv == argv0 and sys.path == path0
    _assert_hooks_removed()


def test_run_returns_the_scripts_exit_status(script, tmp_path, capsys):
    assert _run([sys.executable, script, "exit3"], tmp_path) == 3
    assert "written:" in capsys.readouterr().out
    _assert_hooks_removed()


def test_run_prints_a_sys_exit_message(script, tmp_path, capsys):
    assert _run([script, "exitstr"], tmp_path) == 1
    assert "bad config: lr must be > 0" in capsys.readouterr().err


def test_run_lets_the_scripts_exception_propagate_after_the_report(script, tmp_path, capsys):
    argv0 = list(sys.argv)
    with pytest.raises(RuntimeError, match="the script failed"):
        _run([script, "raise"], tmp_path)
    assert "written:" in capsys.readouterr().out  # the two steps that ran are still reported
    assert sys.argv == argv0
    _assert_hooks_removed()


def test_run_keyboard_interrupt_is_status_130_with_hooks_removed(script, tmp_path, capsys):
    assert _run([script, "interrupt"], tmp_path) == 130
    assert "written:" in capsys.readouterr().out
    _assert_hooks_removed()


def test_run_a_missing_script_is_a_clear_error(tmp_path):
    with pytest.raises(
        FileNotFoundError, match=r"torchspeed doctor: no such script: .*missing\.py"
    ):
        _run(["python", str(tmp_path / "missing.py")], tmp_path)
    _assert_hooks_removed()


def test_run_a_missing_script_fails_before_profiling(tmp_path, capsys):
    with pytest.raises(FileNotFoundError):
        _run(["python", str(tmp_path / "missing.py")], tmp_path)
    assert capsys.readouterr().out == ""


def test_run_accepts_interpreter_options_before_the_script(script, tmp_path, capsys):
    assert _run(["python", "-u", script, "ok"], tmp_path) == 0
    assert "DONE" in capsys.readouterr().out


def test_run_with_dash_m_runs_the_module_as_main(script, tmp_path, monkeypatch, capsys):
    (tmp_path / "my_train_mod.py").write_text(_SCRIPT)
    monkeypatch.chdir(tmp_path)
    assert _run(["python", "-m", "my_train_mod", "ok", "--flag"], tmp_path) == 0
    out = capsys.readouterr().out
    argv_line = next(line for line in out.splitlines() if line.startswith("ARGV "))
    argv = json.loads(argv_line[5:])
    assert argv[0].endswith("my_train_mod.py") and argv[1:] == ["ok", "--flag"]
    assert "NAME __main__" in out and "DONE" in out
    with pytest.raises(ValueError, match="-m needs a module name"):
        _run(["python", "-m"], tmp_path)
    with pytest.raises(ImportError, match="no_such_module_xyz"):
        _run(["-m", "no_such_module_xyz"], tmp_path)
    with pytest.raises(ValueError, match="give the training command"):
        _run(["python"], tmp_path)
    _assert_hooks_removed()


def test_doctor_cli_stops_an_infinite_loop_that_catches_exception(script, tmp_path):
    out = tmp_path / "cli_out"
    # The child imports the torchspeed this test imported (an editable or a site-packages install).
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    p = subprocess.run(
        [
            sys.executable,
            "-m",
            "torchspeed",
            "doctor",
            "--steps",
            "3",
            "--no-png",
            "--out",
            str(out),
            "--",
            "python",
            script,
            "forever",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    assert p.returncode == 0, p.stderr[-3000:]
    assert "SWALLOWED" not in p.stdout
    assert f"ARGV {json.dumps([script, 'forever'])}" in p.stdout
    assert "written:" in p.stdout
    summary = json.loads((out / "summary.json").read_text())
    assert summary["steps"] >= 1 and "findings" in summary
    trace = _load_trace(out / "trace.json")
    assert sum(e.get("cat") == "step" for e in trace["traceEvents"]) == 3
    assert "phase" in (out / "report.txt").read_text()
