"""Section 1, the C++ range: ns per TORCHSPEED_RANGE in a tight C++ loop, profiling off and on,
next to the floor (floor.py) and callgrind's instructions per range."""

from __future__ import annotations

import math
import os
import shutil
import subprocess
import time
from pathlib import Path
from typing import Dict, List, Optional

from ... import _C
from .floor import floor_probe
from .table import TARGET_CPP_OFF_NS, TARGET_CPP_ON_NS, Table, median_iqr, verdict

_P = _C.profile


def repo_root() -> Optional[Path]:
    for base in (Path.cwd(), Path(__file__).resolve().parents[4]):
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
