"""Benchmark harness: warm-up, median of N timed runs, the anchor side by side in one process,
a measured STREAM-triad bandwidth as the physical limit, a printed table and a JSON record.

    h = Harness("bench_optim", "torchspeed bench optim --quick")
    h.add("torch fused AdamW", fn, bytes_moved=28 * n, group="flat 1e8")
    h.finish()  # prints the table, writes JSON to results_dir()

A benchmark that measures a rate itself (a loader's images/s over whole epochs) records it with
``h.record(group, label, rate, "img/s", anchor=...)``; ``h.details`` holds whatever else its JSON
should carry.
"""

import datetime
import json
import os
import platform
import statistics
import time
from typing import Callable, Dict, List, Optional, Sequence

import torch


def results_dir() -> str:
    """Where every benchmark writes its JSON (created): $TORCHSPEED_RESULTS_DIR, else
    ./torchspeed_results in the current folder."""
    out = os.environ.get("TORCHSPEED_RESULTS_DIR") or os.path.join(
        os.getcwd(), "torchspeed_results"
    )
    os.makedirs(out, exist_ok=True)
    return out


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def time_fns(
    fns: Sequence[Callable[[], object]], warmup: int = 2, repeats: int = 7, device: str = "cpu"
) -> List[Dict]:
    """Median / min / stdev wall time in seconds of each of `fns`, after `warmup` untimed calls of
    each, timed round-robin (fns[0], fns[1], ..., then again): a machine whose speed drifts during
    the run (a VM's memory bandwidth, a neighbour's load) moves every variant alike, so their
    ratios stay fair where one-after-another timing would compare different minutes."""
    for _ in range(warmup):
        for fn in fns:
            fn()
    _sync(device)
    times: List[List[float]] = [[] for _ in fns]
    for _ in range(repeats):
        for fn, ts in zip(fns, times):
            t0 = time.perf_counter()
            fn()
            _sync(device)
            ts.append(time.perf_counter() - t0)
    return [
        {
            "median_s": statistics.median(ts),
            "min_s": min(ts),
            "stdev_s": statistics.stdev(ts) if len(ts) > 1 else 0.0,
            "repeats": repeats,
        }
        for ts in times
    ]


def time_fn(
    fn: Callable[[], object], warmup: int = 2, repeats: int = 7, device: str = "cpu"
) -> Dict:
    """Median / min / stdev wall time of fn() in seconds, after `warmup` untimed calls."""
    return time_fns([fn], warmup, repeats, device)[0]


def machine_info(device: str = "cpu") -> Dict:
    import torchspeed
    from torchspeed.info import cpu_model_name

    cpu_model = cpu_model_name() or platform.processor()
    info = {
        "cpu_model": cpu_model,
        "cores": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "cpu_isa": torchspeed.cpu_isa(),
        "last_level_cache_mib": last_level_cache_bytes() >> 20,
        "torch": torch.__version__,
        "torchspeed": torchspeed.__version__,
        "device": device,
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
    }
    if device.startswith("cuda"):
        info["gpu"] = torch.cuda.get_device_name(0)
    return info


def last_level_cache_bytes() -> int:
    """Size of the CPU's largest cache (sysfs), or 0 when unknown."""
    sizes = []
    base = "/sys/devices/system/cpu/cpu0/cache"
    try:
        for entry in os.listdir(base):
            try:
                with open(os.path.join(base, entry, "size"), encoding="utf-8") as f:
                    text = f.read().strip()
            except OSError:
                continue
            mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(text[-1:], 1)
            sizes.append(int(text.rstrip("KMG")) * mult)
    except (OSError, ValueError):
        return 0
    return max(sizes, default=0)


def stream_triad_gbps(
    n: Optional[int] = None, device: str = "cpu", repeats: int = 7, inplace: bool = False
) -> float:
    """Measured memory bandwidth of STREAM's triad a = b + s * c in float32, counted as STREAM
    counts it (12 bytes per element), with torch's multithreaded kernel; on CUDA the device copy
    bandwidth.

    inplace=True measures b = b + s * c instead (also 12 bytes per element). STREAM's count leaves
    out the write-allocate read of `a` (the cache reads each line of `a` before writing it), so
    the plain triad under-reports what DRAM moves by up to a third; an optimizer step updates its
    tensors in place and pays no write-allocate, so the in-place triad is its fair limit.
    """
    if n is None:
        # Each array twice the last-level cache (at least 50M floats), so DRAM is measured and
        # not a cache: some servers have hundreds of MB of L3.
        n = (
            50_000_000
            if device.startswith("cuda")
            else max(50_000_000, last_level_cache_bytes() // 2)
        )
    b = torch.rand(n, device=device)
    c = torch.rand(n, device=device)
    if device.startswith("cuda"):
        a = torch.empty(n, device=device)
        t = time_fn(lambda: a.copy_(b), device=device, repeats=repeats)
        return 8 * n / t["median_s"] / 1e9
    if inplace:
        t = time_fn(lambda: b.add_(c, alpha=1e-9), device=device, repeats=repeats)
    else:
        a = torch.empty(n, device=device)
        t = time_fn(lambda: torch.add(b, c, alpha=3.0, out=a), device=device, repeats=repeats)
    return 12 * n / t["median_s"] / 1e9


class Harness:
    def __init__(
        self, name: str, argv_summary: str, device: str = "cpu", measure_bandwidth: bool = True
    ):
        self.name = name
        self.device = device
        self.command = argv_summary
        self.rows: List[Dict] = []
        self.details: Dict = {}  # benchmark-specific figures, written into the JSON as they are
        self.machine = machine_info(device)
        self.bandwidth_gbps: Optional[float] = (
            stream_triad_gbps(device=device) if measure_bandwidth else None
        )
        # CPU: the in-place triad (no write-allocate) is the limit of in-place updates.
        self.inplace_bandwidth_gbps: Optional[float] = (
            stream_triad_gbps(device=device, inplace=True)
            if measure_bandwidth and not device.startswith("cuda")
            else None
        )

    def add(
        self,
        group: str,
        label: str,
        fn: Callable[[], object],
        bytes_moved: Optional[float] = None,
        warmup: int = 2,
        repeats: int = 7,
        anchor: bool = False,
        **extra,
    ) -> Dict:
        return self._timed_row(
            group, label, time_fn(fn, warmup, repeats, self.device), bytes_moved, anchor, extra
        )

    def add_interleaved(
        self, group: str, entries: Sequence[Dict], warmup: int = 2, repeats: int = 7
    ) -> List[Dict]:
        """Rows of variants timed round-robin (see time_fns), so that their ratios are measured in
        the same minutes. Each entry: ``label``, ``fn``, optional ``bytes_moved``, ``anchor`` and
        anything else, which lands in the row as ``add``'s extra keywords do. The variants' data
        must all fit in memory at once."""
        timings = time_fns([e["fn"] for e in entries], warmup, repeats, self.device)
        rows = []
        for e, t in zip(entries, timings):
            extra = {
                k: v for k, v in e.items() if k not in ("label", "fn", "bytes_moved", "anchor")
            }
            extra["interleaved"] = True
            rows.append(
                self._timed_row(
                    group, e["label"], t, e.get("bytes_moved"), e.get("anchor", False), extra
                )
            )
        return rows

    def _timed_row(
        self,
        group: str,
        label: str,
        timing: Dict,
        bytes_moved: Optional[float],
        anchor: bool,
        extra: Dict,
    ) -> Dict:
        row = {"group": group, "label": label, "anchor": anchor, **timing, **extra}
        if bytes_moved:
            row["bytes"] = bytes_moved
            row["gbps"] = bytes_moved / row["median_s"] / 1e9
            if self.bandwidth_gbps:
                row["frac_of_bw"] = row["gbps"] / self.bandwidth_gbps
            if self.inplace_bandwidth_gbps:
                row["frac_of_inplace_bw"] = row["gbps"] / self.inplace_bandwidth_gbps
        self.rows.append(row)
        return row

    def record(
        self, group: str, label: str, rate: float, unit: str, anchor: bool = False, **extra
    ) -> Dict:
        """A rate the benchmark measured itself (higher is better, e.g. images/s over whole
        epochs), compared with the best anchor of its group like the timed rows."""
        row = {
            "group": group,
            "label": label,
            "anchor": anchor,
            "rate": rate,
            "unit": unit,
            **extra,
        }
        self.rows.append(row)
        return row

    def finish(self) -> str:
        # Speedup of each row against the best anchor of its group (a time: the smallest; a rate:
        # the largest).
        best_time: Dict[str, float] = {}
        best_rate: Dict[str, float] = {}
        for r in self.rows:
            if r["anchor"] and "median_s" in r:
                best_time[r["group"]] = min(best_time.get(r["group"], float("inf")), r["median_s"])
            elif r["anchor"]:
                best_rate[r["group"]] = max(best_rate.get(r["group"], 0.0), r["rate"])
        for r in self.rows:
            if "median_s" in r and r["group"] in best_time:
                r["speedup_vs_best_anchor"] = best_time[r["group"]] / r["median_s"]
            elif "rate" in r and best_rate.get(r["group"]):
                r["speedup_vs_best_anchor"] = r["rate"] / best_rate[r["group"]]
        bw = f"{self.bandwidth_gbps:.1f} GB/s" if self.bandwidth_gbps else "n/a"
        cuda = self.device.startswith("cuda")
        if self.inplace_bandwidth_gbps:
            bw += f", in-place triad {self.inplace_bandwidth_gbps:.1f} GB/s"
        lines = [
            f"# {self.name}  ({self.machine['cpu_model']}, {self.machine['cores']} cores, "
            f"ISA {self.machine['cpu_isa']}, torch {self.machine['torch']}, device {self.device}; "
            f"measured bandwidth: {'copy' if cuda else 'triad'} {bw})"
        ]
        bw_head = "% copy" if cuda else "% triad"
        header = (
            f"{'group':<30} {'implementation':<34} {'median ms':>10} {'GB/s':>7} "
            f"{bw_head:>7} {'% ip-triad':>10} {'vs anchor':>9}"
        )
        timed = [r for r in self.rows if "median_s" in r]
        rated = [r for r in self.rows if "rate" in r]
        if timed or not rated:
            lines += [header, "-" * len(header)]
        for r in timed:
            gbps = f"{r['gbps']:.1f}" if "gbps" in r else "-"
            frac = f"{100 * r['frac_of_bw']:.0f}" if "frac_of_bw" in r else "-"
            ifrac = f"{100 * r['frac_of_inplace_bw']:.0f}" if "frac_of_inplace_bw" in r else "-"
            sp = f"{r['speedup_vs_best_anchor']:.2f}x" if "speedup_vs_best_anchor" in r else "-"
            lines.append(
                f"{r['group']:<30} {r['label']:<34} {1e3 * r['median_s']:>10.2f} {gbps:>7} "
                f"{frac:>7} {ifrac:>10} {sp:>9}"
            )
        if rated:
            rate_header = f"{'group':<30} {'implementation':<34} {'rate':>18} {'vs anchor':>9}"
            lines += [rate_header, "-" * len(rate_header)]
        for r in rated:
            sp = f"{r['speedup_vs_best_anchor']:.2f}x" if "speedup_vs_best_anchor" in r else "-"
            rate = f"{r['rate']:,.0f} {r['unit']}"
            lines.append(f"{r['group']:<30} {r['label']:<34} {rate:>18} {sp:>9}")
        table = "\n".join(lines)
        print(table, flush=True)
        path = os.path.join(results_dir(), f"{self.name}_{self.device.split(':')[0]}.json")
        with open(path, "w", encoding="utf-8") as f:
            json.dump(
                {
                    "bench": self.name,
                    "command": self.command,
                    "machine": self.machine,
                    "bandwidth_gbps": self.bandwidth_gbps,
                    "inplace_bandwidth_gbps": self.inplace_bandwidth_gbps,
                    "rows": self.rows,
                    **({"details": self.details} if self.details else {}),
                },
                f,
                indent=2,
                default=str,  # details may hold stats objects
            )
        print(f"results written to {os.path.abspath(path)}")
        return table
