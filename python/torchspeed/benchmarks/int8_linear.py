"""Int8Linear (torchspeed.quant) against fp32 ``nn.Linear`` and torch.ao's dynamic quantized
Linear (``torch.ao.quantization.quantize_dynamic``), side by side in one process with the same
threads, at M = 1, 32, 256, 2048 and K = N = 1024..4096, on every int8 path this CPU runs
(``TORCHSPEED_CPU_ISA`` forced per row). Every timing includes the activation quantization and the
epilogue (the module's forward).

MACs = M * N * K. The ceilings assumed, per core and cycle (x threads x the clock /proc/cpuinfo
reports): fp32 AVX-512 FMA 32 MACs (2 x 16), fp32 AVX2 FMA 16; int8 avx2 32 (the vpmaddubsw +
vpmaddwd + vpaddd sequence on two ports: 2x AVX2 fp32, quant_prune.md §2.3), avx512 64 (the same
on 512 bits; about 1.33x fp32 on Skylake-SP's two ports, quant_prune.md §2.3), avx512_vnni 128
(2 x vpdpbusd of 64), amx 1024 (one 16x16x64 tdpbusd per 16 cycles). M = 1 is memory-bound: the
GB/s column counts the weight bytes read (fp32: 4 N K, int8: N K).

    torchspeed bench int8_linear [--quick] [--threads T] [--paths avx2,amx] [--as-avx2-host]

--as-avx2-host measures what an AVX2-only CPU (AMD Zen 2/3, older Xeons) would see, on this one:
it re-runs the benchmark with every library held to AVX2 (MKL_ENABLE_INSTRUCTIONS=AVX2,
ONEDNN_MAX_CPU_ISA=AVX2, FBGEMM_ENABLE_INSTRUCTIONS=AVX2 for torch.ao, ATEN_CPU_CAPABILITY=avx2)
and torchspeed forced to its avx2 path. The cores stay this CPU's (ports, clock, caches), so it
is a proxy for the anchors' ISA, not for a Zen 3 core.
"""

from __future__ import annotations

import argparse
import os
import sys
import warnings
from typing import Dict, List, Optional, Sequence

import torch
from torch import nn

from torchspeed.benchmarks.harness import Harness

# MACs per cycle per core (see the docstring).
CEILING_MACS_PER_CYCLE = {
    "fp32": 32,  # AVX-512 FMA; 16 on an AVX2-only CPU
    "scalar": 2,
    "avx2": 32,
    "avx512": 64,
    "avx512_vnni": 128,
    "amx": 1024,
}
_LEVELS = ["scalar", "avx2", "avx512", "avx512_vnni", "amx"]


def cpu_ghz() -> float:
    """The clock /proc/cpuinfo reports (GHz), 0 where unknown."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("cpu MHz"):
                    return float(line.split(":", 1)[1]) / 1000.0
    except (OSError, ValueError):
        pass
    return 0.0


def runnable_paths() -> List[str]:
    from torchspeed import _C

    compiled = _C.cpu_isas_compiled().split(",")
    order = ["scalar", "avx2", "avx512", "avx512_vnni", "amx"]
    best = order.index(_C.cpu_isa_detected())
    return [p for p in _LEVELS if p in compiled and order.index(p) <= best]


def _rel_err(y: torch.Tensor, ref: torch.Tensor) -> float:
    """||y - ref|| / ||ref||: the int8 output's error against fp32 (a saturating int16 pair sum
    shows here)."""
    return float((y.float() - ref).norm() / ref.norm().clamp_min(1e-30))


def _ao_linear(lin: nn.Linear) -> nn.Module:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return torch.ao.quantization.quantize_dynamic(
            nn.Sequential(lin), {nn.Linear}, dtype=torch.qint8
        )


# Every library held to AVX2, read when each loads: the benchmark re-runs itself under them.
AVX2_HOST_ENV = {
    "MKL_ENABLE_INSTRUCTIONS": "AVX2",
    "ONEDNN_MAX_CPU_ISA": "AVX2",
    "FBGEMM_ENABLE_INSTRUCTIONS": "AVX2",
    "ATEN_CPU_CAPABILITY": "avx2",
    "TORCHSPEED_CPU_ISA": "avx2",
}


def _as_avx2_host() -> bool:
    return all(os.environ.get(k) == v for k, v in AVX2_HOST_ENV.items())


def main(argv: Optional[Sequence[str]] = None) -> int:
    from torchspeed import _C
    from torchspeed.quant import Int8Linear

    ap = argparse.ArgumentParser(
        prog="torchspeed bench int8_linear", description=__doc__.splitlines()[0]
    )
    ap.add_argument("--quick", action="store_true", help="M = 1, 256 at K = N = 1024 (< 30 s)")
    ap.add_argument("--threads", type=int, default=0, help="torch threads (default: torch's)")
    ap.add_argument("--paths", default="", help="comma-separated int8 paths (default: all here)")
    ap.add_argument(
        "--as-avx2-host",
        action="store_true",
        help="hold MKL, oneDNN, FBGEMM, ATen and torchspeed to AVX2 (an AVX2-only CPU's anchors)",
    )
    args = ap.parse_args(list(argv) if argv is not None else None)
    if args.as_avx2_host and not _as_avx2_host():
        # The libraries read these once, when they load: a fresh process is the only way.
        env = dict(os.environ, **AVX2_HOST_ENV)
        cmd = [sys.executable, "-m", "torchspeed.benchmarks", "int8_linear", *(argv or [])]
        sys.stdout.flush()
        os.execve(sys.executable, cmd, env)
    avx2_host = _as_avx2_host()
    if avx2_host:
        args.paths = "avx2"
    if args.threads:
        torch.set_num_threads(args.threads)
    threads = torch.get_num_threads()
    paths = [p for p in args.paths.split(",") if p] or runnable_paths()
    paths = [p for p in paths if p != "scalar" or args.paths]  # scalar: only when asked
    if args.quick:
        shapes = [(1, 1024), (256, 1024)]
    else:
        shapes = [(m, k) for k in (1024, 2048, 4096) for m in (1, 32, 256, 2048)]
    h = Harness(
        "bench_int8_linear_avx2_host" if avx2_host else "bench_int8_linear",
        "torchspeed bench int8_linear " + " ".join(argv or []),
    )
    ghz = cpu_ghz()
    fp32_ceiling = (
        CEILING_MACS_PER_CYCLE["fp32"]
        if not avx2_host
        and "avx512" in _C.cpu_isas_compiled()
        and (_C.cpu_isa_detected() in ("avx512", "avx512_vnni", "amx"))
        else 16
    )
    if avx2_host:
        print(
            "# as an AVX2-only host: MKL, oneDNN, FBGEMM, ATen "
            f"({torch.backends.cpu.get_cpu_capability()}) and torchspeed held to AVX2"
        )
    saved = os.environ.get("TORCHSPEED_CPU_ISA")
    torch.manual_seed(0)
    try:
        for m, k in shapes:
            n = k
            macs = m * n * k
            group = f"M={m} K=N={k}"
            lin = nn.Linear(k, n)
            x = torch.randn(m, k)
            reps = 3 if macs > 4e9 else 7
            with torch.no_grad():
                h.add(
                    group,
                    "fp32 nn.Linear",
                    lambda lin=lin, x=x: lin(x),
                    bytes_moved=4 * n * k,
                    repeats=reps,
                    anchor=True,
                    macs=macs,
                    impl="fp32",
                )
                ref = lin(x)
                ao = _ao_linear(lin)
                row = h.add(
                    group,
                    "torch.ao dynamic qint8",
                    lambda ao=ao, x=x: ao(x),
                    bytes_moved=n * k,
                    repeats=reps,
                    anchor=True,
                    macs=macs,
                    impl="torch.ao",
                )
                row["rel_err"] = _rel_err(ao(x), ref)
                q = Int8Linear.from_float(lin)
                for p in paths:
                    os.environ["TORCHSPEED_CPU_ISA"] = p
                    row = h.add(
                        group,
                        f"torchspeed Int8Linear [{p}]",
                        lambda q=q, x=x: q(x),
                        bytes_moved=n * k,
                        repeats=reps,
                        macs=macs,
                        impl=p,
                    )
                    row["rel_err"] = _rel_err(q(x), ref)
                    os.environ.pop("TORCHSPEED_CPU_ISA")
    finally:
        if saved is None:
            os.environ.pop("TORCHSPEED_CPU_ISA", None)
        else:
            os.environ["TORCHSPEED_CPU_ISA"] = saved
    # GMAC/s, fraction of the ceiling, speedups against each anchor, from the best of the
    # repeats (min_s): on a shared machine the median also measures the neighbours.
    by_group: Dict[str, Dict[str, float]] = {}
    for r in h.rows:
        by_group.setdefault(r["group"], {})[r["impl"]] = r["min_s"]
    for r in h.rows:
        r["gmacs"] = r["macs"] / r["min_s"] / 1e9
        per_cycle = fp32_ceiling if r["impl"] == "fp32" else CEILING_MACS_PER_CYCLE.get(r["impl"])
        if ghz and per_cycle:
            r["ceiling_gmacs"] = per_cycle * threads * ghz
            r["frac_of_ceiling"] = r["gmacs"] / r["ceiling_gmacs"]
        t = by_group[r["group"]]
        r["speedup_vs_fp32"] = t["fp32"] / r["min_s"]
        r["speedup_vs_torch_ao"] = t["torch.ao"] / r["min_s"]
    h.finish()
    print(
        f"\n# best of the repeats: GMAC/s ({threads} threads, {ghz:.2f} GHz reported; ceilings per "
        f"core per cycle: "
        f"fp32 {fp32_ceiling}, "
        + ", ".join(f"{p} {CEILING_MACS_PER_CYCLE[p]}" for p in paths)
        + ")"
    )
    head = (
        f"{'shape':<18} {'implementation':<36} {'min ms':>9} {'GMAC/s':>8} {'% ceil':>7} "
        f"{'x fp32':>7} {'x ao':>6} {'rel err':>8}"
    )
    print(head)
    print("-" * len(head))
    for r in h.rows:
        frac = f"{100 * r['frac_of_ceiling']:.0f}" if "frac_of_ceiling" in r else "-"
        err = f"{100 * r['rel_err']:.2f}%" if "rel_err" in r else "-"
        print(
            f"{r['group']:<18} {r['label']:<36} {1e3 * r['min_s']:>9.2f} {r['gmacs']:>8.1f} "
            f"{frac:>7} {r['speedup_vs_fp32']:>6.2f}x {r['speedup_vs_torch_ao']:>5.2f}x "
            f"{err:>8}"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
