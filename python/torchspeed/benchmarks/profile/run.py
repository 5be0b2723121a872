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
import json
import os
import platform
import sys
import time
from pathlib import Path
from typing import Dict, List

from ... import _C
from ..harness import machine_info, results_dir
from .cpp_range import cpp_section, kernel_clocksource
from .memory import memory_section
from .python_range import python_section
from .step import step_section
from .table import Table

_P = _C.profile

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
