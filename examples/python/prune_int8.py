"""Prune while training, then quantize to int8: torchspeed.prune + torchspeed.quant.

    python examples/python/prune_int8.py --final-sparsity 0.9 --steps 600
    python examples/python/prune_int8.py --quick          # a few seconds (CI)

An MLP learns a synthetic classification task. From --start to --end the pruner raises every
Linear weight's sparsity along Zhu & Gupta's cubic schedule; between pruning steps the fused
AdamW keeps the pruned weights at exactly zero inside its update pass (it reads the bit-packed
masks). At the end it prints the accuracy, the sparsity per layer, the mask bytes vs the weight
bytes, and checks that the pruned model's state_dict loads into a fresh model. Then
torchspeed.quant.quantize_dynamic swaps every Linear for an Int8Linear (exact int8 GEMM, per-channel
weights, per-row dynamic activations) and it prints the int8 model's accuracy and forward time
next to the fp32 one's.
"""

from __future__ import annotations

import argparse
import time

import torch
from torch import nn

import torchspeed
import torchspeed.prune as prune


def make_data(n: int, dim: int, classes: int, seed: int):
    g = torch.Generator().manual_seed(seed)
    centers = torch.randn(classes, dim, generator=torch.Generator().manual_seed(0)) * 0.35
    y = torch.randint(0, classes, (n,), generator=g)
    x = centers[y] + torch.randn(n, dim, generator=g)
    return x, y


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=600)
    ap.add_argument("--start", type=int, default=100)
    ap.add_argument("--end", type=int, default=400)
    ap.add_argument("--frequency", type=int, default=50)
    ap.add_argument("--final-sparsity", type=float, default=0.9)
    ap.add_argument("--method", default="unstructured", choices=["unstructured", "global", "nm"])
    ap.add_argument("--quick", action="store_true", help="a short run (CI)")
    args = ap.parse_args()
    if args.quick:
        args.steps, args.start, args.end, args.frequency = 120, 20, 80, 20

    torch.manual_seed(0)
    dim, classes = 32, 8
    model = nn.Sequential(nn.Linear(dim, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(),
                          nn.Linear(256, classes))
    opt = torchspeed.optim.AdamW(model.parameters(), lr=2e-3, weight_decay=0.01)
    final = None if args.method == "nm" else args.final_sparsity
    pruner = prune.GradualPruner(model, final_sparsity=final, start_step=args.start,
                                 end_step=args.end, frequency=args.frequency,
                                 method=args.method, optimizer=opt)
    x, y = make_data(4096, dim, classes, seed=1)
    xt, yt = make_data(2048, dim, classes, seed=2)
    for step in range(args.steps):
        idx = torch.randint(0, x.shape[0], (128,))
        loss = nn.functional.cross_entropy(model(x[idx]), y[idx])
        opt.zero_grad()
        loss.backward()
        opt.step()
        s = pruner.step()
        if s is not None:
            print(f"step {step:4d}: pruned to sparsity {s:.3f}, loss {loss.item():.3f}")
    with torch.no_grad():
        acc = (model(xt).argmax(1) == yt).float().mean().item()
    print(f"test accuracy {acc:.3f}")
    for name, value in prune.sparsity(model).items():
        print(f"  sparsity {name:<10} {value:.3f}")
    mask_bytes = sum(b.numel() for n, b in model.named_buffers() if n.endswith("_mask_packed"))
    weight_bytes = sum(m.weight.numel() * 4 for m, _ in prune.prunable_parameters(model))
    print(f"mask bytes {mask_bytes} for {weight_bytes} weight bytes ({weight_bytes / mask_bytes:.0f}x)")
    fresh = nn.Sequential(nn.Linear(dim, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(),
                          nn.Linear(256, classes))
    prune.load_state_dict(fresh, model.state_dict())
    assert torch.equal(fresh(xt), model(xt))
    print("state_dict loaded into a fresh model: identical outputs")

    # int8: the pruned weights' zeros stay zeros (quantized per output channel).
    prune.remove(model)
    qmodel = torchspeed.quant.quantize_dynamic(model)
    with torch.no_grad():
        acc8 = (qmodel(xt).argmax(1) == yt).float().mean().item()
        times = {}
        for name, m in (("fp32", model), ("int8", qmodel)):
            m(xt)  # warm-up (packs nothing: Int8Linear packed its weight once at conversion)
            t0 = time.perf_counter()
            for _ in range(10):
                m(xt)
            times[name] = (time.perf_counter() - t0) / 10 * 1e3
    print(f"int8 ({torchspeed.quant.int8_path()} path): test accuracy {acc8:.3f} (fp32 {acc:.3f})")
    print(f"forward of {xt.shape[0]} rows: fp32 {times['fp32']:.2f} ms, int8 {times['int8']:.2f} ms")
    assert abs(acc8 - acc) <= 0.02, "int8 should cost at most 2 points here"
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
