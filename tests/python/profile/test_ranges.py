"""torchspeed.profile.range/phase and traces as an adversarial user drives them: bad names and
phases get clear errors; misused ranges (exit without enter, exceptions, recursion, the 1024 cap,
generators, asyncio, threads, fork) keep the trace whole and nested; traces that are empty, big,
unwritable."""

import asyncio
import json
import os
import subprocess
import sys
import threading
import time

import pytest
from profile_helpers import (
    P,
    _assert_nested,
    _events,
    _load_trace,
    _model,
    _record,
    _train_step,
)

import torchspeed.profile as tsp
from torchspeed.profile import ranges as ranges_mod

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
