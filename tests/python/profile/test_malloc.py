"""The malloc rule (torchspeed.profile.malloc): page faults a step counted at step boundaries, the
rule's thresholds and its quiet cases, the fix (mallopt) removing the faults of blocks glibc would
otherwise map afresh each step, and --verify running that irreversible fix after the last run as
the script is, with the compute fixes on top of it measured against its run."""

import contextlib
import io
import mmap
import os
import platform
import runpy
import subprocess
import sys
import textwrap

import pytest
import torch
from test_advice import make_summary

from torchspeed.profile import _doctor, malloc, rules, verify
from torchspeed.profile.summary import Finding, RunFacts

glibc = pytest.mark.skipif(
    platform.system() != "Linux" or platform.libc_ver()[0] != "glibc", reason="needs glibc"
)

_TOUCH_MIB = 32  # 8,192 pages of 4 KiB: faulted in each step, about 5-20 ms of system time


def _touch(mib=_TOUCH_MIB):
    """Maps fresh anonymous memory and writes one byte a page: a minor fault per page."""
    m = mmap.mmap(-1, mib << 20)
    for off in range(0, mib << 20, mmap.PAGESIZE):
        m[off] = 1
    m.close()


@glibc
def test_page_faults_are_counted_per_step_over_the_steps_the_summary_keeps():
    pf = malloc.PageFaults()
    pf.sample(0)  # the first boundary starts the count
    _touch()  # step 1: the warm-up
    pf.sample(1)
    for step in range(2, 6):
        _touch(4 * _TOUCH_MIB if step == 3 else _TOUCH_MIB)  # step 3: a profiled step, 4x
        pf.sample(step)
    pages = (_TOUCH_MIB << 20) // mmap.PAGESIZE
    assert sorted(pf.faults) == [1, 2, 3, 4, 5] and pf.faults[3] >= 4 * pages
    faults, sys_s = pf.per_step(first=2, left_out=[3])
    assert pages <= faults < pages * 1.5  # each step's pages, plus a little of Python's own
    assert sys_s > 0
    # Without leaving step 3 out, the median of 2..5 still is a one-page-set step; the mean
    # would not be.
    assert pf.per_step(first=2)[0] < pages * 1.5
    assert pf.per_step(first=6) is None  # no kept step: not measured
    assert malloc.PageFaults().per_step() is None


def _facts(faults=4000.0, sys_s=0.012, **kw):
    kw.setdefault("device_type", "cpu")
    kw.setdefault("malloc_tuned", "")
    return RunFacts(page_faults=(faults, sys_s), **kw)


def test_the_rule_estimates_the_system_time_and_names_the_environment_fix():
    s = make_summary(0.100, {"forward": 0.040, "backward": 0.040})
    found = [f for f in rules.breakdown_rules(s, _facts()) if f.rule == "malloc"]
    assert len(found) == 1
    f = found[0]
    assert f.est_gain_s == pytest.approx(0.012) and f.severity == "warning"  # 12 % of the step
    assert f.title.startswith("4,000 page faults a step: 12.0 ms of system time")
    assert malloc.ENV_FIX in f.fix and "jemalloc" in f.fix
    # 6 %: advised, as info (no cost but memory); under the 5 % floor: quiet.
    six = rules.breakdown_rules(s, _facts(sys_s=0.006))
    assert [f.severity for f in six if f.rule == "malloc"] == ["info"]
    assert not [f for f in rules.breakdown_rules(s, _facts(sys_s=0.004)) if f.rule == "malloc"]


@pytest.mark.parametrize(
    "facts",
    [
        _facts(faults=500.0),  # few faults: new data touched once, not memory churned
        _facts(malloc_tuned="LD_PRELOAD jemalloc"),
        _facts(malloc_tuned="MALLOC_TRIM_THRESHOLD_"),
        _facts(malloc_tuned=None),  # not checked
        _facts(device_type="cuda"),
        RunFacts(device_type="cpu", malloc_tuned=""),  # not measured
    ],
)
def test_the_rule_is_quiet_where_it_has_nothing_to_say(facts):
    s = make_summary(0.100, {"forward": 0.040, "backward": 0.040})
    assert not [f for f in rules.breakdown_rules(s, facts) if f.rule == "malloc"]


def test_malloc_tuned_reads_preloaded_allocators_and_the_environment(monkeypatch):
    for var in ("LD_PRELOAD", "GLIBC_TUNABLES") + tuple(
        v for v in os.environ if v.startswith("MALLOC_")
    ):
        monkeypatch.delenv(var, raising=False)
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        assert malloc.malloc_tuned() == "not glibc"
        return
    assert malloc.malloc_tuned() == ""
    monkeypatch.setenv("GLIBC_TUNABLES", "glibc.malloc.trim_threshold=1")
    assert malloc.malloc_tuned() == "GLIBC_TUNABLES"
    monkeypatch.setenv("MALLOC_MMAP_THRESHOLD_", "1")
    assert malloc.malloc_tuned() == "MALLOC_MMAP_THRESHOLD_"
    monkeypatch.setenv("LD_PRELOAD", "/usr/lib/x86_64-linux-gnu/libjemalloc.so.2")
    assert malloc.malloc_tuned() == "LD_PRELOAD jemalloc"


_SCRIPT = f"""
import mmap, torch
from torch import nn
torch.manual_seed(0)
model = nn.Linear(64, 64)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
x = torch.randn(32, 64)
for _ in range(12):
    m = mmap.mmap(-1, {_TOUCH_MIB} << 20)   # memory returned and faulted in again each step
    for off in range(0, {_TOUCH_MIB} << 20, mmap.PAGESIZE):
        m[off] = 1
    m.close()
    model(x).square().mean().backward()
    opt.step(); opt.zero_grad()
print("done")
"""


@glibc
@pytest.mark.parametrize("tuned", [False, True])
def test_the_doctor_finds_a_script_that_faults_its_memory_in_each_step(
    tuned, tmp_path, monkeypatch
):
    for var in ("LD_PRELOAD", "GLIBC_TUNABLES", "MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.delenv("MALLOC_TOP_PAD_", raising=False)
    if tuned:
        monkeypatch.setenv("MALLOC_TRIM_THRESHOLD_", str(malloc.TRIM_THRESHOLD))
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent(_SCRIPT))
    monkeypatch.chdir(tmp_path)
    report = io.StringIO()
    with contextlib.redirect_stdout(io.StringIO()):
        with _doctor.doctor(out=None, progress=False, file=report, probe=False) as prof:
            runpy.run_path(str(script), run_name="__main__")
    facts = prof.facts()
    pages = (_TOUCH_MIB << 20) // mmap.PAGESIZE
    assert facts.page_faults is not None and facts.page_faults[0] >= pages
    found = [f for f in prof.advice(prof.summary()) if f.rule == "malloc"]
    assert "minor page faults and" in prof.report()  # the facts, in the report either way
    if tuned:  # the user already set the allocator up: nothing to advise
        assert facts.malloc_tuned == "MALLOC_TRIM_THRESHOLD_" and not found
    else:
        assert facts.malloc_tuned == "" and len(found) == 1, report.getvalue()
        assert found[0].est_gain_s == pytest.approx(facts.page_faults[1])


_FIX = """
import resource, sys, torch
from torchspeed.profile import malloc
torch.set_num_threads(1)
import ctypes
ctypes.CDLL(None).mallopt(-3, 128 << 10)   # glibc's first, static threshold: every 8 MiB block is mapped
def faults():
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for _ in range(10):
        t = torch.empty(2 << 20)             # 8 MiB, written once and freed
        t.fill_(1.0)
        del t
    return (resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before) / 10
print(faults())
with malloc.keep_freed_memory():
    faults()                                 # the first block of the heap is new memory
    print(faults())
"""


@glibc
def test_keep_freed_memory_removes_the_faults_of_blocks_mapped_afresh_each_step():
    """In a child process: the fix cannot be undone."""
    out = subprocess.run(
        [sys.executable, "-c", _FIX], capture_output=True, text=True, timeout=120, check=True
    ).stdout.split()
    before, after = float(out[0]), float(out[1])
    assert before >= 2048 * 0.9  # 2,048 pages of an 8 MiB block, each time
    assert after < 50, (before, after)


def test_verify_runs_the_malloc_fix_last_and_the_compute_fixes_on_top_of_it(monkeypatch):
    """malloc and cpu_threads found: the threads trial runs with the runs as the script is; after
    the last of them the malloc fix (on top of the threads fix) and bf16 autocast (on top of
    both). The malloc run probes again, and bf16's estimate is its ratio; the malloc row is
    checked in this process's system time a step against the threads run."""
    monkeypatch.setattr(rules, "_load", lambda: (1.0, 2))
    applied = []

    @contextlib.contextmanager
    def keep():
        applied.append("malloc")
        yield

    monkeypatch.setattr(malloc, "keep_freed_memory", keep)
    loader = torch.utils.data.DataLoader(list(range(4)), num_workers=2)
    facts = RunFacts(loaders=[loader], torch_threads=2, probes={"bf16": 0.5, "fp32_s": 0.02})
    again = RunFacts(loaders=[loader], torch_threads=2, probes={"bf16": 0.75, "fp32_s": 0.02})
    base = make_summary(0.100, {"forward": 0.040, "backward": 0.040})  # fwd+bwd 80 ms
    found = [
        Finding("amp", "warning", "t", "f", est_step_s=0.06, est_gain_s=0.04),
        Finding("cpu_threads", "warning", "t", "f", est_step_s=0.04, est_gain_s=0.06),
        Finding("malloc", "info", "t", "f", est_step_s=0.092, est_gain_s=0.008),
    ]
    runs = []  # (what was applied, advise)
    # System time a step: 13 ms as the script is, 12 ms in the threads run, 2 ms with the
    # memory kept (in the order of the runs); forward+backward's CPU time 50 ms.
    sys_s = iter([0.013, 0.012, 0.013, 0.002])
    monkeypatch.setattr(
        verify.StepCpu,
        "median_s",
        lambda self, steps=None, system=False: next(sys_s) if system else 0.050,
    )
    monkeypatch.setattr(verify.Alternating, "halves", lambda self: (base, base))
    monkeypatch.setattr(verify.Alternating, "cpu_halves", lambda self: (0.050, 0.040))

    def run_steps(ctx, advise):
        n = len(applied)
        with ctx:
            runs.append((torch.get_num_threads(), len(applied) > n, advise))
            if advise and len(runs) == 1:
                return base, [1.0], found, facts
            return base, [1.0], [], (again if advise else None)

    rows = {r.rule: r for r in verify.verify(run_steps)}
    # base, threads, the last run as the script is, then malloc (+ threads, probing again),
    # then bf16 on top of both.
    threads_now = torch.get_num_threads()
    assert [(t, m, a) for t, m, a in runs] == [
        (threads_now, False, True),
        (1, False, False),
        (threads_now, False, False),
        (1, True, True),
        (1, True, False),
    ]
    m = rows["malloc"]
    assert m.fix == "malloc thresholds + 1 torch thread" and m.on_top_of == "1 torch thread"
    assert m.phases == (verify.SYSTEM_TIME,) and m.phase_gain_s == pytest.approx(0.010)
    assert m.estimated_gain_s == pytest.approx(0.012)  # all of the threads run's system time
    amp = rows["amp"]
    assert amp.fix == "bf16 autocast + malloc thresholds + 1 torch thread"
    assert amp.paired and amp.phases == (verify.CPU_TIME,)
    # The re-probed ratio (0.75: 25 % saved) of the other steps' 50 ms of CPU time.
    assert amp.estimated_gain_s == pytest.approx(0.25 * 0.050)
    text = verify.format_rows(list(rows.values()), 8)
    assert "cannot be undone" in text and "system time a step against the run with 1 torch" in text


@glibc
def test_step_cpu_records_the_system_time_of_each_step(tmp_path, monkeypatch):
    """The verify trials' clock: the system time a step (faulting 32 MiB in, each step) on any
    number of torch threads, where forward+backward's CPU time needs one."""
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent(_SCRIPT))
    monkeypatch.chdir(tmp_path)
    clock = verify.StepCpu()
    with contextlib.redirect_stdout(io.StringIO()), clock:
        with _doctor.doctor(out=None, progress=False, file=io.StringIO(), probe=False):
            runpy.run_path(str(script), run_name="__main__")
    sys_s = clock.median_s(system=True)
    assert sys_s is not None and sys_s > 0
    if torch.get_num_threads() != 1:
        assert clock.median_s() is None
