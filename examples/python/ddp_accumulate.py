"""Data-parallel training with gradient accumulation: torchspeed.dist.AccumulatingDDP under torchrun.

One machine, 2 processes on Gloo (CPU):

    torchrun --nproc-per-node 2 examples/python/ddp_accumulate.py --steps 20 --accumulation-steps 4

Several machines (run on each; rank 0's host is the rendezvous endpoint):

    torchrun --nnodes 2 --nproc-per-node 8 --rdzv-backend c10d \
        --rdzv-endpoint host0.example.com:29400 --rdzv-id job42 \
        examples/python/ddp_accumulate.py --backend nccl

Each optimizer step is `--accumulation-steps` micro-steps: the first ones only accumulate into the
gradient buckets (no communication); the last one all-reduces each bucket while backward is still
running. The model and data are deterministic formulas shared with examples/cpp/ddp_train.cpp, so
both fronts train to the same parameters (scripts/consumer.sh compares them).
"""

from __future__ import annotations

import argparse
import gc
import math
import os

import torch
import torch.distributed as dist
from torch import nn

import torchspeed
from torchspeed.dist import AccumulatingDDP


def make_model() -> nn.Module:
    model = nn.Sequential(nn.Linear(8, 32), nn.Tanh(), nn.Linear(32, 4))
    with torch.no_grad():  # a formula, not an RNG: the C++ example sets the same values
        for i, p in enumerate(model.parameters()):
            idx = torch.arange(p.numel(), dtype=torch.float64)
            p.copy_((0.3 * torch.sin(idx * 0.7 + i + 1)).reshape(p.shape))
    return model


def micro_batch(step: int, rank: int, micro: int, size: int = 16):
    """The samples of one (optimizer step, rank, micro-step): a fixed formula."""
    i = torch.arange(size * 8, dtype=torch.float64).reshape(size, 8)
    t = 1.3 * step + 0.71 * rank + 0.19 * micro
    x = torch.sin(0.37 * i + t)
    y = torch.cos(x[:, :4] * 2.0 + x[:, 4:] + 0.1 * t)
    return x.float(), y.float()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=20, help="optimizer steps")
    ap.add_argument("--accumulation-steps", type=int, default=4)
    ap.add_argument("--backend", default="gloo", choices=["gloo", "nccl"])
    ap.add_argument("--compression", default=None, choices=[None, "bf16", "fp16"])
    ap.add_argument("--save", default=None, help="rank 0 writes the final params here (torch.save)")
    args = ap.parse_args()

    dist.init_process_group(args.backend)  # RANK, WORLD_SIZE, MASTER_ADDR/PORT from torchrun
    rank, world = dist.get_rank(), dist.get_world_size()
    device = torch.device("cpu")
    if args.backend == "nccl":
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0)))
        torch.cuda.set_device(device)
    k = args.accumulation_steps

    model = AccumulatingDDP(make_model().to(device), accumulation_steps=k,
                            compression=args.compression)
    opt = torchspeed.optim.AdamW(model.parameters(), lr=1e-2)
    for step in range(args.steps):
        total = 0.0
        for j in range(k):
            x, y = (t.to(device) for t in micro_batch(step, rank, j))
            loss = nn.functional.mse_loss(model(x), y) / k
            loss.backward()  # all-reduces only on the k-th micro-step
            total += loss.item()
        assert model.sync_now
        opt.step()
        opt.zero_grad()
        last = step + 1 == args.steps
        if rank == 0 and ((step + 1) % max(1, args.steps // 5) == 0 or last):
            s = model.stats()
            print(
                    f"optimizer step {step + 1}  loss {total:.5f}  buckets {s['buckets']}  "
                    f"comm {s['last_comm_ns'] / 1e6:.2f} ms  exposed {s['last_exposed_ns'] / 1e6:.2f} ms"
                    f"  overlap {s['last_overlap']:.0%}",
                    flush=True,
                )
    if args.save and rank == 0:
        torch.save([p.detach().cpu() for p in model.module.parameters()], args.save)
    if rank == 0:
        mean_abs = math.fsum(p.abs().mean().item() for p in model.parameters())
        print(f"done: {world} ranks x {k} micro-steps x {args.steps} optimizer steps "
              f"(sum of mean |param| {mean_abs:.4f})")
    # Drop every reference to the group (the wrapper holds one) while all ranks are alive, then
    # destroy it together: a group left to interpreter shutdown can abort the process (its Gloo
    # threads outlive Python).
    del model, opt
    gc.collect()
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
