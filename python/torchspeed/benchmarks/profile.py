"""torchspeed.profile against torch.profiler, side by side in one process, next to the physical
floor of timing a scope.

1. C++ range: ns per TORCHSPEED_RANGE in a tight C++ loop, profiling off and on (the ring wraps:
   the steady state), with the floor measured in the same run by a small C probe (one rdtsc, an
   empty two-timestamp scope into a thread-local ring, a disabled gate) when a C compiler exists,
   and instructions per range from callgrind (tests/cpp/profile/callgrind_ranges.sh) when
   valgrind and the built profile_range_loop exist.
2. Python range: ns per `with` block (timeit loops, median of repeats) for a bare `with`, the
   torchspeed ranges and phases, torch.profiler.record_function outside and inside an active
   torch.profiler.profile, and the decorator form against a plain call.
3. Training step: an MLP step (AdamW) whose batch is calibrated here to ~10 ms on one thread, run
   as paired, alternating blocks (plain, V, then V, plain on the next repeat), the slowdown of each
   variant against the plain block next to it (median of the per-block median step times):
   StepProfiler with phase() ranges and step() (always-on), StepProfiler(hooks=True) with no code
   changes, torch.profiler.profile with and without record_function; and a ~1 ms step for the
   always-on mode. The always-on mode is also measured step-interleaved with plain steps (drift
   cancels), and alone (its ranges and step() with no work inside).
4. Memory: RSS and malloc'd heap over always-on steps of a trivial step (the ring and the step
   history are bounded: no growth once the history is full), next to torch.profiler's.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import gc
import json
import math
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import timeit
from pathlib import Path
from typing import Callable, Dict, List, Optional, Sequence

import torch

import torchspeed.profile as tsp
from torchspeed import _C
from torchspeed.benchmarks.harness import machine_info, results_dir

_P = _C.profile

# Targets (shared/research/profiler.md §5): C1, C2, C3, C5.
TARGET_CPP_OFF_NS = 2.0
TARGET_CPP_ON_NS = 30.0
TARGET_PY_ON_NS = 600.0
TARGET_STEP10_PCT = 1.0
TARGET_STEP1_PCT = 3.0


def median_iqr(xs: Sequence[float]):
    xs = sorted(xs)
    if len(xs) < 2:
        return xs[0], 0.0, xs[0], xs[0]
    q = statistics.quantiles(xs, n=4, method="inclusive")
    return statistics.median(xs), q[2] - q[0], q[0], q[2]


def verdict(value: float, target: float) -> str:
    return "met" if value <= target else "MISSED"


class Table:
    """Rows of every section; printed as one table, written as the JSON's rows."""

    def __init__(self):
        self.rows: List[Dict] = []

    def add(self, group: str, label: str, median: float, unit: str, **extra) -> Dict:
        row = {"group": group, "label": label, "median": median, "unit": unit, **extra}
        self.rows.append(row)
        print(f"  {group:<22} {label:<52} {_fmt(median):>10} {unit}", flush=True)
        return row

    def format(self, header: str) -> str:
        head = (
            f"{'group':<22} {'measurement':<52} {'median':>10} {'IQR':>8} {'unit':<8} {'note':<s}"
        )
        lines = [header, head, "-" * 128]
        last = None
        for r in self.rows:
            if last is not None and r["group"] != last:
                lines.append("")
            last = r["group"]
            iqr = _fmt(r["iqr"]) if r.get("iqr") is not None else "-"
            lines.append(
                f"{r['group']:<22} {r['label']:<52} {_fmt(r['median']):>10} {iqr:>8} "
                f"{r['unit']:<8} {r.get('note', '')}"
            )
        return "\n".join(lines)


def _fmt(x) -> str:
    if x is None:
        return "-"
    if isinstance(x, str):
        return x
    ax = abs(x)
    if ax >= 1000:
        return f"{x:,.0f}"
    if ax >= 100:
        return f"{x:.1f}"
    if ax >= 10:
        return f"{x:.2f}"
    return f"{x:.3f}" if ax < 1 else f"{x:.2f}"


# ---- 1. C++ range ------------------------------------------------------------------------------

_FLOOR_C = r"""
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <x86intrin.h>
typedef struct { uint64_t b, e; uint32_t name; uint8_t phase; } ev_t;  /* 24 bytes */
#define RING 65536
static __thread ev_t ring[RING];
static __thread uint64_t pos;
atomic_bool g_on;
__attribute__((noinline)) void record(uint64_t b, uint64_t e, uint32_t name) {
  ev_t* x = &ring[pos++ & (RING - 1)];
  x->b = b; x->e = e; x->name = name; x->phase = 255;
}
static double now(void) {
  struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec * 1e9 + t.tv_nsec;
}
#define BAR() __asm__ __volatile__("" ::: "memory")
int main(int argc, char** argv) {
  long n = atol(argv[2]); const char* w = argv[1]; uint64_t sink = 0;
  for (long i = 0; i < RING; ++i) record(0, 0, 0);  /* the ring is touched before timing */
  double t0 = now();
  if (!strcmp(w, "empty")) { for (long i = 0; i < n; ++i) BAR(); }
  else if (!strcmp(w, "rdtsc")) { for (long i = 0; i < n; ++i) { sink += __rdtsc(); BAR(); } }
  else if (!strcmp(w, "gate")) {
    for (long i = 0; i < n; ++i) {
      if (atomic_load_explicit(&g_on, memory_order_relaxed)) record(__rdtsc(), __rdtsc(), 1);
      BAR();
    }
  } else if (!strcmp(w, "scope")) {
    for (long i = 0; i < n; ++i) { uint64_t b = __rdtsc(); BAR(); record(b, __rdtsc(), 1); }
  } else if (!strcmp(w, "clock_gettime")) {
    for (long i = 0; i < n; ++i) { sink += (uint64_t)now(); BAR(); }
  } else return 2;
  double t1 = now();
  printf("%.4f %llu\n", (t1 - t0) / n, (unsigned long long)(sink & 1));
  return 0;
}
"""


def floor_probe(repeats: int, n: int) -> Dict:
    """The physical floor on this machine, measured now: a C program (cc -O2) in a temp folder."""
    if platform.machine() not in ("x86_64", "AMD64"):
        return {"skipped": f"the probe reads the x86 TSC; this is {platform.machine()}"}
    cc = shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")
    if cc is None:
        return {"skipped": "no C compiler (cc) on PATH"}
    with tempfile.TemporaryDirectory() as tmp:
        src, exe = os.path.join(tmp, "floor.c"), os.path.join(tmp, "floor")
        Path(src).write_text(_FLOOR_C)
        r = subprocess.run([cc, "-O2", "-o", exe, src], capture_output=True, text=True)
        if r.returncode != 0:
            return {"skipped": f"cc failed: {r.stderr.strip()[:200]}"}
        out: Dict = {"compiler": cc}
        for what in ("empty", "rdtsc", "clock_gettime", "gate", "scope"):
            vals = []
            for _ in range(repeats):
                p = subprocess.run([exe, what, str(n)], capture_output=True, text=True)
                vals.append(float(p.stdout.split()[0]))
            m, iqr, _, _ = median_iqr(vals)
            out[what] = {"median_ns": m, "iqr_ns": iqr, "repeats": vals, "n": n}
    return out


def repo_root() -> Optional[Path]:
    for base in (Path.cwd(), Path(__file__).resolve().parents[3]):
        if (base / "tests/cpp/profile/callgrind_ranges.sh").exists():
            return base
    return None


def callgrind_counts() -> Dict:
    """Instructions per range (tests/cpp/profile/callgrind_ranges.sh), or why it was skipped."""
    root = repo_root()
    if root is None:
        return {"skipped": "not in a source tree (tests/cpp/profile/callgrind_ranges.sh missing)"}
    binary = Path(
        os.environ.get(
            "TORCHSPEED_RANGE_LOOP_BIN", root / "build/release/tests/cpp/profile_range_loop"
        )
    )
    if not binary.exists():
        return {"skipped": f"{binary} not built"}
    if shutil.which("valgrind") is None:
        return {"skipped": "valgrind not found"}
    r = subprocess.run(
        ["bash", str(root / "tests/cpp/profile/callgrind_ranges.sh"), str(binary)],
        capture_output=True,
        text=True,
    )
    if r.returncode == 77:
        return {"skipped": r.stdout.strip()}
    out: Dict = {"script_rc": r.returncode, "output": r.stdout.strip()}
    for line in r.stdout.splitlines():
        # "profile range, profiling off: 9.98 instructions per range (budget 12) ok"
        for mode in ("off", "on"):
            if f"profiling {mode}:" in line:
                parts = line.split(":", 1)[1].split()
                out[mode] = {"instructions": float(parts[0]), "budget": float(parts[5].rstrip(")"))}
    if "off" not in out or "on" not in out:
        out["skipped"] = f"could not parse: {r.stdout.strip()[:200]} {r.stderr.strip()[:200]}"
    return out


def cpp_range_cost(t: Table, repeats: int, target_s: float) -> Dict:
    was = _P.enabled()
    res: Dict = {"clock_source": _P.clock_source(), "ns_per_tick": _P.ns_per_tick()}
    try:
        ns: Dict[str, int] = {}
        for mode, on in (("off", False), ("on", True)):
            _P.set_enabled(on)
            probe = _P._range_loop_ns(200_000)
            ns[mode] = max(200_000, int(math.ceil(target_s / max(probe, 0.05) * 1e9)))
        vals: Dict[str, List[float]] = {"off": [], "on": []}
        walls: Dict[str, List[float]] = {"off": [], "on": []}
        for _ in range(repeats):  # off and on alternate
            for mode, on in (("off", False), ("on", True)):
                _P.set_enabled(on)
                w0 = time.perf_counter()
                vals[mode].append(_P._range_loop_ns(ns[mode]))
                walls[mode].append(time.perf_counter() - w0)
    finally:
        _P.set_enabled(was)
    g = "1. C++ range"
    for mode, target in (("off", TARGET_CPP_OFF_NS), ("on", TARGET_CPP_ON_NS)):
        m, iqr, _, _ = median_iqr(vals[mode])
        res[mode] = {
            "median_ns": m,
            "iqr_ns": iqr,
            "repeats_ns": vals[mode],
            "n_per_repeat": ns[mode],
            "wall_s_per_repeat": walls[mode],
        }
        t.add(
            g,
            f"TORCHSPEED_RANGE, profiling {mode} ({ns[mode] / 1e6:.1f}M/rep)",
            m,
            "ns/range",
            iqr=iqr,
            note=f"target <= {target:g} ns: {verdict(m, target)}; "
            f"min rep {min(walls[mode]) * 1e3:.0f} ms",
        )
    return res


def cpp_section(t: Table, quick: bool) -> Dict:
    print("1. C++ range cost", flush=True)
    reps = 5 if quick else 9
    res = cpp_range_cost(t, reps, 0.06)
    g = "1. C++ range"
    floor = floor_probe(5 if quick else 7, 2_000_000 if quick else 5_000_000)
    res["floor"] = floor
    if "skipped" in floor:
        t.add(g, "floor probe (rdtsc, scope, gate)", "skipped", "", note=floor["skipped"])
    else:
        notes = {
            "empty": "empty loop iteration (the probe's baseline)",
            "rdtsc": "floor: one __rdtsc()",
            "clock_gettime": "floor: clock_gettime(MONOTONIC), vDSO",
            "gate": "floor: disabled gate (relaxed load + branch)",
            "scope": "floor: 2x rdtsc + 24 B store into a TLS ring",
        }
        for what in ("rdtsc", "clock_gettime", "gate", "scope", "empty"):
            f = floor[what]
            t.add(g, notes[what], f["median_ns"], "ns", iqr=f["iqr_ns"], note="C probe, cc -O2")
        for mode, fl in (("off", "gate"), ("on", "scope")):
            res[f"{mode}_over_floor"] = res[mode]["median_ns"] / floor[fl]["median_ns"]
    t.add(
        g,
        "clock",
        f"{res['clock_source']}",
        "",
        note=f"{res['ns_per_tick']:.4f} ns/tick ({1 / res['ns_per_tick']:.3f} GHz); "
        f"kernel clocksource {kernel_clocksource()}",
    )
    cg = callgrind_counts()
    res["callgrind"] = cg
    if "skipped" in cg:
        t.add(g, "callgrind instructions/range", "skipped", "", note=cg["skipped"])
    else:
        for mode in ("off", "on"):
            c = cg[mode]
            t.add(
                g,
                f"callgrind, profiling {mode}",
                c["instructions"],
                "instr",
                note=f"budget {c['budget']:g} (tests/cpp/profile/callgrind_ranges.sh)",
            )
    return res


def kernel_clocksource() -> str:
    try:
        return (
            Path("/sys/devices/system/clocksource/clocksource0/current_clocksource")
            .read_text(encoding="utf-8")
            .strip()
        )
    except OSError:
        return "unknown"


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


# ---- 3. Training step --------------------------------------------------------------------------


class Workload:
    """An MLP training step (AdamW, cross-entropy) on a fixed pool of batches."""

    def __init__(self, width: int, batch: int, seed: int = 0):
        g = torch.Generator().manual_seed(seed)
        torch.manual_seed(seed)
        self.width, self.batch = width, batch
        self.model = torch.nn.Sequential(
            torch.nn.Linear(width, width),
            torch.nn.ReLU(),
            torch.nn.Linear(width, width),
            torch.nn.ReLU(),
            torch.nn.Linear(width, 10),
        )
        self.opt = torch.optim.AdamW(self.model.parameters(), lr=1e-4)
        self.loss_fn = torch.nn.CrossEntropyLoss()
        self.batches = [
            (torch.randn(batch, width, generator=g), torch.randint(0, 10, (batch,), generator=g))
            for _ in range(8)
        ]
        self.i = 0

    def params(self) -> int:
        return sum(p.numel() for p in self.model.parameters())

    def plain(self) -> None:
        x, y = self.batches[self.i & 7]
        self.i += 1
        loss = self.loss_fn(self.model(x), y)
        loss.backward()
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)

    def tsp_phases(self, prof) -> None:
        with tsp.phase("data_wait"):
            x, y = self.batches[self.i & 7]
            self.i += 1
        with tsp.phase("forward"):
            loss = self.loss_fn(self.model(x), y)
        with tsp.phase("backward"):
            loss.backward()
        with tsp.phase("optimizer"):
            self.opt.step()
            self.opt.zero_grad(set_to_none=True)
        prof.step(self.batch)

    def torch_phases(self) -> None:
        rf = torch.profiler.record_function
        with rf("data_wait"):
            x, y = self.batches[self.i & 7]
            self.i += 1
        with rf("forward"):
            loss = self.loss_fn(self.model(x), y)
        with rf("backward"):
            loss.backward()
        with rf("optimizer"):
            self.opt.step()
            self.opt.zero_grad(set_to_none=True)


def calibrate(width: int, target_s: float) -> int:
    """The batch size that makes one step of Workload(width) take ~target_s here (linear fit of
    the fastest step time at two batch sizes)."""

    def fastest(batch: int) -> float:  # the min: a busy neighbour only ever adds time
        w = Workload(width, batch)
        for _ in range(3):
            w.plain()
        ts = []
        for _ in range(9):
            t0 = time.perf_counter()
            w.plain()
            ts.append(time.perf_counter() - t0)
        return min(ts)

    b0, b1 = 16, 256
    t0, t1 = fastest(b0), fastest(b1)
    slope = max((t1 - t0) / (b1 - b0), 1e-9)
    b = b0 + (target_s - t0) / slope
    return int(min(8192, max(8, round(b / 8) * 8)))


def _run_block(w: Workload, variant: str, warmup: int, steps: int) -> Dict:
    """One block of `steps` timed steps (after `warmup` untimed ones) in one variant; returns the
    block's mean step time (its wall time / steps: what throughput sees) and median step time."""
    times: List[float] = []
    pc = time.perf_counter
    extra: Dict = {}
    if variant == "plain":
        step = w.plain
        ctx = contextlib.nullcontext()
    elif variant == "always_on":
        prof = tsp.StepProfiler(device="cpu")
        ctx = prof

        def step():
            w.tsp_phases(prof)

    elif variant == "hooks":
        prof = tsp.StepProfiler(hooks=True, device="cpu", step_on="optimizer")
        ctx = prof
        step = w.plain
    elif variant in ("torch_profiler_rf", "torch_profiler"):
        ctx = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU])
        step = w.torch_phases if variant == "torch_profiler_rf" else w.plain
    else:
        raise ValueError(variant)
    e0 = None
    with ctx:
        for _ in range(warmup):
            step()
        t_block = pc()
        for _ in range(steps):
            t0 = pc()
            step()
            times.append(pc() - t0)
        t_block = pc() - t_block
        e0 = pc()
    extra["exit_s"] = pc() - e0
    if variant in ("always_on", "hooks"):
        s = prof.summary(gather=False)
        extra["profiler_steps"] = prof.steps
        extra["profiler_step_median_s"] = s.step_median_s
        extra["shares"] = {p: s.share(p) for p in tsp.PHASES}
    return {
        "mean_s": t_block / steps,
        "median_s": statistics.median(times),
        **extra,
    }


def step_section(t: Table, quick: bool) -> Dict:
    print("3. Training step overhead", flush=True)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return _step_section(t, quick)
    finally:
        torch.set_num_threads(threads)


def _paired(w: Workload, variants: List[str], repeats: int, warmup: int, steps: int) -> Dict:
    """For each repeat and each variant: a plain block and the variant's block next to each other,
    the order flipped every repeat (plain, V, V', plain, plain, V'', ...)."""
    out: Dict = {
        v: {"blocks": [], "plain_blocks": [], "ratio": [], "ratio_mean": []} for v in variants
    }
    for r in range(repeats):
        order = variants if r % 2 == 0 else list(reversed(variants))
        for v in order:
            pair = ("plain", v) if r % 2 == 0 else (v, "plain")
            got = {k: _run_block(w, k, warmup, steps) for k in pair}
            out[v]["blocks"].append(got[v])
            out[v]["plain_blocks"].append(got["plain"])
            out[v]["ratio"].append(got[v]["median_s"] / got["plain"]["median_s"])
            out[v]["ratio_mean"].append(got[v]["mean_s"] / got["plain"]["mean_s"])
        if (r + 1) % 5 == 0 or r + 1 == repeats:
            print(f"    repeat {r + 1}/{repeats} done", flush=True)
    return out


def instrumentation_alone(repeats: int, n: int) -> Dict:
    """us per step of the always-on instrumentation with no work inside: four phase() ranges and
    step() in a running StepProfiler (what the always-on mode adds to any step)."""
    prof = tsp.StepProfiler(device="cpu")
    vals = []
    with prof:
        for _ in range(repeats):
            t0 = time.perf_counter()
            for _ in range(n):
                with tsp.phase("data_wait"):
                    pass
                with tsp.phase("forward"):
                    pass
                with tsp.phase("backward"):
                    pass
                with tsp.phase("optimizer"):
                    pass
                prof.step(1)
            vals.append((time.perf_counter() - t0) / n * 1e6)
    m, iqr, _, _ = median_iqr(vals)
    return {"median_us": m, "iqr_us": iqr, "repeats_us": vals, "n": n}


def interleaved(w: Workload, pairs: int, chunk: int) -> Dict:
    """The always-on mode against plain steps in one running StepProfiler, alternating step by
    step (plain, instrumented, plain, ...): a drift of the machine hits both alike. The slowdown is
    median(instrumented) / median(plain) - 1 per chunk of `chunk` pairs; median and IQR of those."""
    prof = tsp.StepProfiler(device="cpu")
    pc = time.perf_counter
    plain: List[float] = []
    inst: List[float] = []
    with prof:
        for _ in range(4):
            w.tsp_phases(prof)
        for i in range(2 * pairs):
            if i & 1:
                t0 = pc()
                w.tsp_phases(prof)
                inst.append(pc() - t0)
            else:
                t0 = pc()
                w.plain()
                plain.append(pc() - t0)
    ratios = [
        100 * (statistics.median(inst[k : k + chunk]) / statistics.median(plain[k : k + chunk]) - 1)
        for k in range(0, pairs - chunk + 1, chunk)
    ]
    m, iqr, q1, q3 = median_iqr(ratios)
    return {
        "pairs": pairs,
        "chunk": chunk,
        "plain_median_s": statistics.median(plain),
        "instrumented_median_s": statistics.median(inst),
        "added_us": (statistics.median(inst) - statistics.median(plain)) * 1e6,
        "slowdown_pct": m,
        "slowdown_iqr_pct": iqr,
        "slowdown_q1_pct": q1,
        "slowdown_q3_pct": q3,
        "chunk_slowdowns_pct": ratios,
    }


def _step_section(t: Table, quick: bool) -> Dict:
    repeats = 10 if quick else 30
    steps10 = 10
    steps1 = 50
    warmup = 4
    b10 = calibrate(512, 0.010)
    b1 = calibrate(128, 0.001)
    alone = instrumentation_alone(5 if quick else 9, 2000)
    res: Dict = {
        "torch_threads": torch.get_num_threads(),
        "repeats": repeats,
        "warmup_steps_per_block": warmup,
        "instrumentation_alone": alone,
    }
    labels = {
        "always_on": "StepProfiler(cpu) + phase() ranges + step()",
        "hooks": "StepProfiler(hooks=True, cpu), no code changes",
        "torch_profiler_rf": "torch.profiler.profile(CPU) + record_function",
        "torch_profiler": "torch.profiler.profile(CPU), no record_function",
    }
    for name, width, batch, steps, variants, target, pairs in (
        ("10ms", 512, b10, steps10, list(labels), TARGET_STEP10_PCT, 60 if quick else 240),
        ("1ms", 128, b1, steps1, ["always_on"], TARGET_STEP1_PCT, 600 if quick else 2400),
    ):
        w = Workload(width, batch)
        for _ in range(5):
            w.plain()
        got = _paired(w, variants, repeats, warmup, steps)
        plain_all = [b["median_s"] for v in variants for b in got[v]["plain_blocks"]]
        pm, piqr, _, _ = median_iqr(plain_all)
        g = f"3. step ~{name}"
        res[name] = {
            "width": width,
            "batch": batch,
            "params": w.params(),
            "steps_per_block": steps,
            "plain_median_step_s": pm,
            "plain_iqr_s": piqr,
            "variants": got,
        }
        t.add(
            g,
            f"plain MLP {width}x{width}x10, batch {batch}, AdamW",
            pm * 1e3,
            "ms/step",
            iqr=piqr * 1e3,
            note=f"{len(plain_all)} blocks x {steps} steps, 1 thread; the baseline",
        )
        for v in variants:
            d = got[v]
            vm, viqr, _, _ = median_iqr([b["median_s"] for b in d["blocks"]])
            rm, riqr, rq1, rq3 = median_iqr([100 * (x - 1) for x in d["ratio"]])
            tm = statistics.median(100 * (x - 1) for x in d["ratio_mean"])
            added_us = statistics.median(
                (b["median_s"] - p["median_s"]) * 1e6
                for b, p in zip(d["blocks"], d["plain_blocks"])
            )
            d.update(
                {
                    "median_step_s": vm,
                    "iqr_s": viqr,
                    "slowdown_pct": rm,
                    "slowdown_iqr_pct": riqr,
                    "slowdown_q1_pct": rq1,
                    "slowdown_q3_pct": rq3,
                    "slowdown_block_mean_pct": tm,
                    "added_us_per_step": added_us,
                }
            )
            note = (
                f"slowdown {rm:+.2f} % [IQR {rq1:+.2f}..{rq3:+.2f}] ({added_us:+.0f} us); "
                f"by block mean {tm:+.2f} %"
            )
            if v == "always_on":
                note += f"; target <= {target:g} %: {verdict(rm, target)}"
            t.add(g, labels[v], vm * 1e3, "ms/step", iqr=viqr * 1e3, note=note, key=v)
            if v == "always_on":
                il = interleaved(w, pairs, max(10, pairs // 12))
                res[name]["interleaved"] = il
                t.add(
                    g,
                    "  the same, step-interleaved with plain steps",
                    il["instrumented_median_s"] * 1e3,
                    "ms/step",
                    iqr=None,
                    note=f"slowdown {il['slowdown_pct']:+.2f} % [IQR {il['slowdown_q1_pct']:+.2f}.."
                    f"{il['slowdown_q3_pct']:+.2f}] ({il['added_us']:+.0f} us) over "
                    f"{il['pairs']} pairs; target <= {target:g} %: "
                    f"{verdict(il['slowdown_pct'], target)}",
                    key="always_on_interleaved",
                )
        pct = 100 * alone["median_us"] * 1e-6 / pm
        res[name]["instrumentation_alone_pct"] = pct
        t.add(
            g,
            "always-on instrumentation alone (4 phases + step())",
            alone["median_us"],
            "us/step",
            iqr=alone["iqr_us"],
            note=f"= {pct:.3f} % of the plain step (no work inside; noise-free lower bound)",
        )
    return res


# ---- 4. Memory ---------------------------------------------------------------------------------


def rss_kib() -> int:
    with open("/proc/self/statm", encoding="ascii") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") // 1024


class _MallInfo2(ctypes.Structure):
    _fields_ = [
        (n, ctypes.c_size_t)
        for n in (
            "arena",
            "ordblks",
            "smblks",
            "hblks",
            "hblkhd",
            "usmblks",
            "fsmblks",
            "uordblks",
            "fordblks",
            "keepcost",
        )
    ]


def heap_kib() -> Optional[int]:
    """Bytes malloc has handed out and not got back (glibc mallinfo2: every arena plus mmapped
    blocks), in KiB; None without glibc >= 2.33. Unlike RSS it sees growth into freed memory."""
    try:
        f = ctypes.CDLL(None).mallinfo2
    except (OSError, AttributeError):
        return None
    f.restype = _MallInfo2
    m = f()
    return (m.uordblks + m.hblkhd) // 1024


def memory_section(t: Table, quick: bool) -> Dict:
    """Runs memory_child in a fresh interpreter: in this process the earlier sections have freed
    memory that malloc reuses (RSS then moves without any growth), and torch.profiler's events of
    section 3 were freed into the heap the next run would grow into."""
    print("4. Memory (in a fresh process)", flush=True)
    code = (
        "import json, sys\n"
        "from torchspeed.benchmarks.profile import memory_child\n"
        f"print('@@' + json.dumps(memory_child({bool(quick)})))\n"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    line = next((x for x in r.stdout.splitlines() if x.startswith("@@")), None)
    if r.returncode != 0 or line is None:
        why = f"child failed (rc {r.returncode}): {r.stderr.strip()[-300:]}"
        t.add("4. memory", "RSS growth", "failed", "", note=why)
        return {"failed": why}
    got = json.loads(line[2:])
    for row in got.pop("rows"):
        t.add(row.pop("group"), row.pop("label"), row.pop("median"), row.pop("unit"), **row)
    return got


def memory_child(quick: bool) -> Dict:
    """The memory runs (section 4); returns the results and the rows to print."""
    t = _QuietTable()
    res = _memory_runs(t, quick)
    res["rows"] = t.rows
    return res


class _QuietTable(Table):
    def add(self, group: str, label: str, median, unit: str, **extra) -> Dict:
        row = {"group": group, "label": label, "median": median, "unit": unit, **extra}
        self.rows.append(row)
        return row


def _memory_runs(t: Table, quick: bool) -> Dict:
    total = 10_000 if quick else 20_000
    marks = [2_000, 5_000, 10_000] + ([20_000] if not quick else [])
    x = torch.ones(16)
    rf = torch.profiler.record_function

    def tsp_steps(n: int, prof) -> None:
        for _ in range(n):
            with tsp.phase("data_wait"):
                y = x + 1
            with tsp.phase("forward"):
                y = y * 2
            with tsp.phase("backward"):
                y = y - 1
            with tsp.phase("optimizer"):
                x.add_(0)
            prof.step(1)

    def torch_steps(n: int, prof) -> None:
        for _ in range(n):
            with rf("data_wait"):
                y = x + 1
            with rf("forward"):
                y = y * 2
            with rf("backward"):
                y = y - 1
            with rf("optimizer"):
                x.add_(0)

    # torch.profiler keeps every event until it stops: it runs to 5,000 steps only (a rate).
    runs = (
        ("history_1024", "always-on StepProfiler, history 1024", 1024, marks),
        ("history_default", "always-on StepProfiler, history 16384", 16384, marks),
        ("torch_profiler", "torch.profiler.profile(CPU) + record_function", None, marks[:2]),
    )
    res: Dict = {"marks": marks, "steps": total}
    g = "4. memory"
    for key, label, hist, ms in runs:
        gc.collect()
        if hist is None:
            prof = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU])
            run = torch_steps
        else:
            prof = tsp.StepProfiler(device="cpu", history_steps=hist)
            run = tsp_steps
        rss: Dict[int, int] = {}
        heap: Dict[int, Optional[int]] = {}
        done = 0
        t0 = time.perf_counter()
        with prof:
            for m in ms:
                run(m - done, prof)
                done = m
                gc.collect()
                rss[m] = rss_kib()
                heap[m] = heap_kib()
            secs = time.perf_counter() - t0
        growth = rss[ms[-1]] - rss[ms[0]]
        per_k = growth / (ms[-1] - ms[0]) * 1000
        heap_growth = None if heap[ms[0]] is None else heap[ms[-1]] - heap[ms[0]]
        res[key] = {
            "history_steps": hist,
            "rss_kib": rss,
            "heap_kib": heap,
            "heap_growth_kib": heap_growth,
            "growth_kib": growth,
            "growth_kib_per_1000_steps": per_k,
            "us_per_step": secs / done * 1e6,
        }
        note = f"RSS {per_k:.1f} KiB/1k steps; RSS KiB at " + ", ".join(
            f"{k:,}: {v:,}" for k, v in rss.items()
        )
        if heap_growth is not None:
            heap_k = heap_growth / (ms[-1] - ms[0]) * 1000
            note += f"; malloc heap {heap_growth:+,} KiB ({heap_k:.1f} KiB/1k steps)"
        if hist is not None:
            res[key]["kept_steps"] = len(prof.history().step_ns)
            note += f"; {res[key]['kept_steps']:,} steps kept"
        t.add(g, f"{label}, {ms[0]:,} -> {ms[-1]:,} steps", growth, "KiB", note=note)
        del prof
        gc.collect()
    res["dropped_events"] = int(_P.dropped_events())
    return res


# ---- main --------------------------------------------------------------------------------------


def cpu_details() -> Dict:
    out: Dict = {}
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                k, _, v = line.partition(":")
                k = k.strip()
                if k in ("cpu family", "model", "stepping", "cpu MHz") and k not in out:
                    out[k] = v.strip()
                if k == "flags" and "flags" not in out:
                    fl = v.split()
                    out["flags"] = [
                        f for f in ("avx2", "avx512f", "constant_tsc", "nonstop_tsc") if f in fl
                    ]
    except OSError:
        pass
    return out


def cpu_ticks() -> List[int]:
    """The machine's cpu line of /proc/stat (user nice system idle iowait irq softirq steal ...)."""
    try:
        return [
            int(x)
            for x in Path("/proc/stat").read_text(encoding="ascii").split("\n")[0].split()[1:]
        ]
    except (OSError, ValueError):
        return []


def loadavg() -> str:
    """The 1-minute load average (others' work on this machine skews every row), or "?"."""
    try:
        return Path("/proc/loadavg").read_text(encoding="ascii").split()[0]
    except OSError:
        return "?"


def main(argv=None):
    ap = argparse.ArgumentParser(
        prog="torchspeed bench profile",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument("--quick", action="store_true", help="fewer repeats and steps (<= ~60 s)")
    args = ap.parse_args(argv)
    t_start = time.perf_counter()
    load_start = loadavg()
    ticks_start = cpu_ticks()
    command = "torchspeed bench profile " + " ".join(sys.argv[1:] if argv is None else argv)
    machine = machine_info("cpu")
    machine.update(
        {
            "cpu": cpu_details(),
            "python": platform.python_version(),
            "clock_source": _P.clock_source(),
            "ns_per_tick": _P.ns_per_tick(),
            "kernel_clocksource": kernel_clocksource(),
            "ring_capacity": _P.ring_capacity(),
            "loadavg_start": load_start,
        }
    )
    table = Table()
    res = {
        "cpp": cpp_section(table, args.quick),
        "python": python_section(table, args.quick),
        "step": step_section(table, args.quick),
        "memory": memory_section(table, args.quick),
    }
    secs = time.perf_counter() - t_start
    machine["loadavg_end"] = loadavg()
    ticks_end = cpu_ticks()
    steal = "?"
    if len(ticks_start) > 7 and len(ticks_end) > 7:
        d = [b - a for a, b in zip(ticks_start, ticks_end)]
        machine["cpu_ticks_delta"] = d
        machine["steal_pct"] = 100 * d[7] / max(1, sum(d[:8]))
        steal = f"{machine['steal_pct']:.1f} %"
    fam = machine["cpu"]
    header = (
        f"# bench_profile  ({machine['cpu_model']}, family {fam.get('cpu family', '?')} model "
        f"{fam.get('model', '?')}, {machine['cores']} cores, torch {machine['torch']}, "
        f"clock {machine['clock_source']} {1 / machine['ns_per_tick']:.3f} GHz, "
        f"{'--quick, ' if args.quick else ''}{secs:.0f} s; load average "
        f"{load_start} before, {machine['loadavg_end']} after (this run adds ~1); steal {steal})"
    )
    text = table.format(header)
    print("\n" + text, flush=True)
    path = os.path.join(results_dir(), "bench_profile_cpu.json")
    with open(path, "w", encoding="utf-8") as f:
        json.dump(
            {
                "bench": "bench_profile",
                "command": command,
                "machine": machine,
                "quick": args.quick,
                "wall_s": secs,
                "rows": table.rows,
                "results": res,
            },
            f,
            indent=2,
            default=str,
        )
    print(f"results written to {os.path.abspath(path)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
