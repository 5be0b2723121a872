"""Section 4, memory: RSS and malloc'd heap over always-on steps of a trivial step (bounded: no
growth once the history is full), next to torch.profiler's; run in a fresh interpreter."""

from __future__ import annotations

import ctypes
import gc
import json
import os
import subprocess
import sys
import time
from typing import Dict, Optional

import torch

from ... import _C
from ... import profile as tsp
from .table import Table

_P = _C.profile

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
        "from torchspeed.benchmarks.profile.memory import memory_child\n"
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
