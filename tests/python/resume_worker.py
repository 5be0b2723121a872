"""A training run for the kill-and-resume test: a model with dropout, torchspeed's fused AdamW,
torchspeed's native loader (shuffled, 2 workers), a GradScaler and a WarmupLR schedule,
checkpointed after every optimizer step by a CheckpointManager. Prints "step N" after each
checkpoint; with --resume it continues from the newest valid checkpoint. Writes the final params
to <out>/final.pt.

    python resume_worker.py <out_dir> [--resume] [--steps N]
"""

import argparse
import sys
from pathlib import Path

import torch
from torch import nn

import torchspeed
from torchspeed.checkpoint import CheckpointManager
from torchspeed.optim.lr_scheduler import WarmupLR


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--resume", action="store_true")
    ap.add_argument("--epochs", type=int, default=3)
    args = ap.parse_args()
    out = Path(args.out)
    torch.manual_seed(0)
    torch.set_num_threads(1)
    g = torch.Generator().manual_seed(1)
    x, y = torch.randn(96, 16, generator=g), torch.randn(96, 4, generator=g)
    loader = torchspeed.data.DataLoader(
        torchspeed.data.TensorSource(x, y), batch_size=8, shuffle=True, num_workers=2, seed=7
    )
    model = nn.Sequential(nn.Linear(16, 32), nn.Dropout(0.2), nn.GELU(), nn.Linear(32, 4))
    opt = torchspeed.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.05)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**8, growth_interval=3)
    steps_per_epoch = len(loader)
    sched = WarmupLR(opt, warmup_steps=5, total_steps=args.epochs * steps_per_epoch)
    manager = CheckpointManager(out / "ckpt", keep=2)
    step = 0
    if args.resume:
        found = manager.load_latest(
            model=model, optimizer=opt, loader=loader, scaler=scaler, scheduler=sched
        )
        step = found or 0
    while step < args.epochs * steps_per_epoch:
        epoch = step // steps_per_epoch
        if step % steps_per_epoch == 0:
            loader.set_epoch(epoch)
        for xb, yb in loader:
            loss = nn.functional.mse_loss(model(xb), yb)
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()
            opt.zero_grad()
            sched.step()
            step += 1
            manager.save(
                step, model=model, optimizer=opt, loader=loader, scaler=scaler, scheduler=sched
            )
            print(f"step {step}", flush=True)
            if step % steps_per_epoch == 0:
                break
    torch.save({n: p.detach().clone() for n, p in model.named_parameters()}, out / "final.pt")
    return 0


if __name__ == "__main__":
    sys.exit(main())
