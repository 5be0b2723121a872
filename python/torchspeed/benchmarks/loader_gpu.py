"""GPU check for the loader: is H2D hidden behind compute, and is next() sync-free?

A fixed-duration CUDA "model" step (torch.cuda._sleep) consumes batches. We compare the mean step
time fed by torchspeed's loader (device="cuda", side-stream prefetch) with the step time on
synthetic data already on the GPU; the target is <= 1.05x whenever the loader's throughput exceeds
the model's demand. torch.cuda.set_sync_debug_mode("error") during iteration proves that no
host-device synchronization happens inside next(). Needs a CUDA machine; exits 0 with a message
otherwise.

    torchspeed bench loader_gpu [--step-ms 20] [--batches 100]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import torch

from ..data import DataLoader, TensorSource
from .harness import Harness


def cycles_for(ms: float) -> int:
    """Calibrates torch.cuda._sleep cycles for a step of `ms` milliseconds."""
    n = 1_000_000
    torch.cuda.synchronize()
    t = time.perf_counter()
    torch.cuda._sleep(n)
    torch.cuda.synchronize()
    per_ms = n / ((time.perf_counter() - t) * 1e3)
    return int(per_ms * ms)


def run(loader_iter, cycles: int, batches: int) -> float:
    torch.cuda.synchronize()
    t = time.perf_counter()
    n = 0
    for x, _y in loader_iter:
        torch.cuda._sleep(cycles)  # the "model": reads nothing, takes a fixed time
        x.float().mean()  # touch the batch on the current stream
        n += 1
        if n == batches:
            break
    torch.cuda.synchronize()
    return (time.perf_counter() - t) / n


def main(argv=None) -> int:
    p = argparse.ArgumentParser(
        prog="torchspeed bench loader_gpu", description=__doc__.split("\n\n")[0]
    )
    p.add_argument("--step-ms", type=float, default=20.0)
    p.add_argument("--batches", type=int, default=100)
    p.add_argument("--quick", action="store_true", help="20 batches (a smoke run)")
    p.add_argument("--batch", type=int, default=256)
    p.add_argument("--workers", type=int, default=max(1, (os.cpu_count() or 2) - 1))
    a = p.parse_args(argv)
    if a.quick:
        a.batches = min(a.batches, 20)
    if not torch.cuda.is_available():
        print("bench_loader_gpu: no CUDA device; nothing to check")
        return 0
    n = a.batch * (a.batches + 10)
    x = torch.randint(0, 255, (n, 3, 224, 224), dtype=torch.uint8)
    y = torch.randint(0, 1000, (n,))
    cycles = cycles_for(a.step_ms)
    xs, ys = x[: a.batch].cuda(), y[: a.batch].cuda()
    synthetic = run(((xs, ys) for _ in range(a.batches + 1)), cycles, a.batches)

    dl = DataLoader(
        TensorSource(x, y),
        batch_size=a.batch,
        shuffle=True,
        seed=0,
        num_workers=a.workers,
        pin_memory=True,
        device="cuda",
        persistent_workers=True,
    )
    run(iter(dl), cycles, 5)  # warm-up: threads, pinned slots, caching allocator
    it = iter(dl)
    torch.cuda.set_sync_debug_mode("error")  # any host sync inside next() raises
    try:
        fed = run(it, cycles, a.batches)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    h = Harness(
        "bench_loader_gpu",
        "torchspeed bench loader_gpu " + " ".join(argv or []),
        device="cuda",
        measure_bandwidth=False,
    )
    group = f"{a.step_ms:g} ms steps, batch {a.batch}"
    h.record(group, "synthetic batches on the GPU", 1.0 / synthetic, "steps/s", anchor=True)
    h.record(group, "torchspeed DataLoader(device=cuda)", 1.0 / fed, "steps/s")
    h.details = {
        "step_ms_synthetic": synthetic * 1e3,
        "step_ms_loader": fed * 1e3,
        "ratio": fed / synthetic,
        "target": 1.05,
        "loader_stats": dl.stats(),
    }
    print(json.dumps(h.details, indent=2, default=str))
    h.finish()
    return 0 if fed / synthetic <= 1.05 else 1


if __name__ == "__main__":
    sys.exit(main())
