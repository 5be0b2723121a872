"""grad_stats (global norm + per-tensor norms + non-finite flag, optionally unscaling in place)
against what a PyTorch user runs instead: torch._foreach_norm + vector_norm of the norms, and
torch._amp_foreach_non_finite_check_and_unscale_ for the AMP variant. Side by side, one process.

Bytes: the read-only pass reads each element once (4 B fp32); the unscale pass reads and writes
(8 B). The torch baseline for "norm + inf check + unscale" needs two passes (12 B).
"""

import argparse
import sys

import torch

import torchspeed
from torchspeed.benchmarks.harness import Harness


def tensor_set(kind: str, device: str, quick: bool = False):
    g = torch.Generator().manual_seed(0)
    if kind == "flat":  # 800 MB: larger than any last-level cache, so DRAM-bound
        sizes = [25_000_000 if quick else 200_000_000]
    elif kind == "mixed":  # a transformer-like list: big matrices, small biases/norms
        sizes = [768 * 3072] * 24 + [768 * 768] * 48 + [768] * 100 + [3072] * 24 + [50257 * 768]
    else:  # many small tensors (adapters)
        sizes = [int(x) for x in torch.randint(256, 4097, (10_000,), generator=g)]
    return [torch.randn(n, generator=g).to(device) for n in sizes]


def bench_set(h: Harness, kind: str, device: str, reps: int, quick: bool) -> None:
    ts = tensor_set(kind, device, quick)
    n = sum(t.numel() for t in ts)
    group = f"{kind} ({len(ts)} t, {n / 1e6:.0f}M)"
    inv = torch.ones(1, device=device)
    found = torch.zeros(1, device=device)

    def torch_norm():
        return torch.linalg.vector_norm(torch.stack(torch._foreach_norm(ts)))

    def torch_norm_check_unscale():
        torch._amp_foreach_non_finite_check_and_unscale_(ts, found, inv)
        return torch.linalg.vector_norm(torch.stack(torch._foreach_norm(ts)))

    h.add(group, "torch _foreach_norm + vector_norm", torch_norm, 4 * n, repeats=reps, anchor=True)
    h.add(
        group,
        "torchspeed grad_stats",
        lambda: torchspeed.ops.grad_stats(ts, per_tensor=True),
        4 * n,
        repeats=reps,
    )
    group += " +unscale"
    h.add(
        group,
        "torch check_and_unscale_ + norm",
        torch_norm_check_unscale,
        12 * n,
        repeats=reps,
        anchor=True,
    )
    h.add(
        group,
        "torchspeed grad_stats(inv_scale)",
        lambda: torchspeed.ops.grad_stats(ts, inv_scale=inv),
        8 * n,
        repeats=reps,
    )


def main(argv=None):
    ap = argparse.ArgumentParser(prog="torchspeed bench grad_stats", description=__doc__)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--quick", action="store_true", help="fewer repeats (CI / demo)")
    args = ap.parse_args(argv)
    reps = 3 if args.quick else 7
    h = Harness(
        "bench_grad_stats",
        "torchspeed bench grad_stats " + " ".join(sys.argv[1:] if argv is None else argv),
        device=args.device,
    )
    for kind in ("flat", "mixed", "small"):
        bench_set(h, kind, args.device, reps, args.quick)
    h.finish()
    return 0


if __name__ == "__main__":
    sys.exit(main())
