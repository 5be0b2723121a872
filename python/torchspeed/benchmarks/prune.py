"""Pruning masks (torchspeed.prune) against what a PyTorch user would write instead, side by side
in one process, for an fp32 weight of N x N (N = 4096 full, 2048 --quick):

- apply a 2:4 mask in place: ``apply_mask_`` (bit-packed mask, 1/32 of the weight's bytes) vs a
  memcpy of the weight (``copy_``: the S6 target is <= 1.5x its time) and torch.nn.utils.prune's
  forward (``weight_orig * weight_mask``, a dense fp32 mask);
- build the masks: 50% magnitude (``magnitude_mask`` vs torch.nn.utils.prune.L1Unstructured's
  compute_mask) and 2:4 (``nm_mask`` vs topk per group + scatter);
- a fused AdamW step on the weight with a packed mask vs without one, and torch.optim.AdamW
  (foreach) followed by the masking multiply.

Mask memory (bytes) is in each mask row's JSON (``mask_bytes``) and printed after the table.

    torchspeed bench prune [--quick] [--device cpu|cuda]
"""

from __future__ import annotations

import argparse
from typing import Optional, Sequence

import torch
import torch.nn.utils.prune as torch_prune

import torchspeed
from torchspeed.benchmarks.harness import Harness
from torchspeed.prune import apply_mask_, magnitude_mask, nm_mask


def _topk_nm(w: torch.Tensor, n: int, m: int) -> torch.Tensor:
    g = w.abs().reshape(-1, m)
    keep = torch.zeros_like(g, dtype=torch.bool)
    return keep.scatter_(1, g.topk(n, dim=1).indices, True).reshape(w.shape)


def main(argv: Optional[Sequence[str]] = None) -> int:
    ap = argparse.ArgumentParser(prog="torchspeed bench prune", description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="2048 x 2048 (a smoke run)")
    ap.add_argument("--device", default="cpu")
    args = ap.parse_args(list(argv) if argv is not None else None)
    dev = args.device
    size = 2048 if args.quick else 4096
    h = Harness("bench_prune", "torchspeed bench prune " + " ".join(argv or []), device=dev)
    torch.manual_seed(0)
    w0 = torch.randn(size, size, device=dev)
    n = w0.numel()
    wbytes = 4 * n
    packed = nm_mask(w0, 2, 4)
    dense_mask = torch.ones_like(w0)
    apply_mask_(dense_mask, packed)  # the same 2:4 mask as fp32 {0,1}, torch.nn.utils.prune's form
    memory = {"packed (torchspeed)": packed.numel(), "dense fp32 (torch.nn.utils.prune)": wbytes}

    group = f"apply 2:4 mask {size}x{size}"
    w = w0.clone()
    src = w0.clone()
    h.add(group, "memcpy (w.copy_(w0))", lambda: w.copy_(src), bytes_moved=2 * wbytes, anchor=True)
    h.add(
        group,
        "torch prune fwd: orig * mask",
        lambda: torch.mul(src, dense_mask, out=w),
        bytes_moved=3 * wbytes,
        anchor=True,
        mask_bytes=wbytes,
    )
    h.add(
        group,
        "torchspeed apply_mask_ (packed)",
        lambda: apply_mask_(w, packed),
        bytes_moved=2 * wbytes + packed.numel(),
        mask_bytes=packed.numel(),
    )

    group = f"build 50% magnitude {size}x{size}"
    l1 = torch_prune.L1Unstructured(amount=0.5)
    h.add(
        group,
        "torch L1Unstructured.compute_mask",
        lambda: l1.compute_mask(w0, default_mask=torch.ones_like(w0)),
        anchor=True,
        repeats=3,
        mask_bytes=wbytes,
    )
    h.add(
        group,
        "torchspeed magnitude_mask",
        lambda: magnitude_mask(w0, n // 2),
        repeats=3,
        mask_bytes=(n + 7) // 8,
    )

    group = f"build 2:4 {size}x{size}"
    h.add(
        group,
        "torch topk per group + scatter",
        lambda: _topk_nm(w0, 2, 4),
        anchor=True,
        mask_bytes=n,
    )
    h.add(group, "torchspeed nm_mask", lambda: nm_mask(w0, 2, 4), mask_bytes=(n + 7) // 8)

    group = f"AdamW step {size}x{size}"
    p = torch.nn.Parameter(w0.clone())
    p.grad = torch.randn_like(p) * 1e-2
    ref = torch.nn.Parameter(w0.clone())
    ref.grad = p.grad.clone()
    ref_opt = torch.optim.AdamW([ref], lr=1e-3, weight_decay=0.01, foreach=True)

    def torch_step():
        ref_opt.step()
        with torch.no_grad():
            ref.mul_(dense_mask)

    # param, grad, exp_avg, exp_avg_sq: read 4, write 3 arrays of 4 bytes per element.
    step_bytes = 7 * wbytes
    h.add(
        group,
        "torch AdamW(foreach) + mul_(mask)",
        torch_step,
        bytes_moved=step_bytes + 2 * wbytes,
        anchor=True,
    )
    plain = torchspeed.optim.AdamW([p], lr=1e-3, weight_decay=0.01)
    h.add(group, "torchspeed AdamW, no mask", plain.step, bytes_moved=step_bytes)
    q = torch.nn.Parameter(w0.clone())
    q.grad = p.grad.clone()
    masked = torchspeed.optim.AdamW([q], lr=1e-3, weight_decay=0.01)
    masked.set_mask(q, packed)
    h.add(
        group,
        "torchspeed AdamW, packed 2:4 mask",
        masked.step,
        bytes_moved=step_bytes + packed.numel(),
    )
    h.finish()
    print(f"mask memory for one {size}x{size} fp32 weight ({wbytes} bytes):")
    for k, v in memory.items():
        print(f"  {k:<36} {v:>12} bytes  ({v / wbytes:.4f} of the weight)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
