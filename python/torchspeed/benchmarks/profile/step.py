"""Section 3, the training step: the slowdown of each profiler against plain steps of a calibrated
MLP, in paired alternating blocks, step-interleaved, and the always-on instrumentation alone."""

from __future__ import annotations

import contextlib
import statistics
import time
from typing import Dict, List

import torch

from ... import profile as tsp
from .table import TARGET_STEP1_PCT, TARGET_STEP10_PCT, Table, median_iqr, verdict

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
