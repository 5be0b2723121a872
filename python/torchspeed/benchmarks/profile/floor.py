"""The physical floor of timing a scope, measured now: floor.c (next to this file) compiled with
the machine's C compiler and run for each of its probes."""

from __future__ import annotations

import os
import platform
import shutil
import subprocess
import tempfile
from typing import Dict

from .table import median_iqr

_FLOOR_C = os.path.join(os.path.dirname(os.path.abspath(__file__)), "floor.c")


def floor_probe(repeats: int, n: int) -> Dict:
    """The physical floor on this machine, measured now: a C program (cc -O2) in a temp folder."""
    if platform.machine() not in ("x86_64", "AMD64"):
        return {"skipped": f"the probe reads the x86 TSC; this is {platform.machine()}"}
    cc = shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")
    if cc is None:
        return {"skipped": "no C compiler (cc) on PATH"}
    with tempfile.TemporaryDirectory() as tmp:
        src, exe = os.path.join(tmp, "floor.c"), os.path.join(tmp, "floor")
        shutil.copyfile(_FLOOR_C, src)
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
