"""The demo's baseline run (idiomatic PyTorch: torch's DataLoader + PIL, torch.optim.AdamW) as an
ordinary training script with no torchspeed part in its loop, for trying the doctor on it as on
any user's script (docs/PROFILE.md, bench/RESULTS.md):

    torchspeed doctor -- python -m torchspeed.demo.baseline_script --quick
    torchspeed doctor --verify 8 -- python -m torchspeed.demo.baseline_script --steps 40
"""

from __future__ import annotations

import argparse

import torch
import torch.nn.functional as F

from . import dataset, train
from .cli import DEFAULTS


def main(argv=None) -> int:
    """The demo's baseline training as an ordinary PyTorch script, with no torchspeed part in the
    loop, so the doctor can be tried on it as on any user's script:

        torchspeed doctor -- python -m torchspeed.demo.baseline_script --quick
        torchspeed doctor --verify 8 -- python -m torchspeed.demo.baseline_script --steps 40

    The same model, data, transforms, loader, optimizer and schedule as the demo's first run."""

    ap = argparse.ArgumentParser(
        prog="python -m torchspeed.demo.baseline_script",
        description="The demo's idiomatic-PyTorch training run as a plain script.",
    )
    ap.add_argument("--quick", action="store_true", help="the small dataset and sizes")
    ap.add_argument("--steps", type=int, default=None)
    ap.add_argument("--batch-size", type=int, default=None)
    ap.add_argument("--image-size", type=int, default=None)
    ap.add_argument("--workers", type=int, default=None, help="default: the cores")
    ap.add_argument("--data-dir", default=None)
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    name = "quick" if args.quick else "full"
    steps, batch, size = DEFAULTS[name]
    steps = args.steps or steps
    cfg = train.Config(
        device="cpu",
        steps=steps,
        batch_size=args.batch_size or batch,
        image_size=args.image_size or size,
        workers=dataset.cpu_count() if args.workers is None else args.workers,
        lr=args.lr,
        seed=args.seed,
    )
    manifest = dataset.prepare(name, args.data_dir, seed=args.seed, progress=False)
    torch.manual_seed(cfg.seed)
    model = train.SmallResNet(len(manifest["classes"]), cfg.width)
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, train._lr_factor(cfg.steps))
    loader, _ = train._torch_loaders(cfg, manifest, cfg.seed)
    step = 0
    model.train()
    while step < cfg.steps:
        for x, y in loader:
            loss = F.cross_entropy(model(x), y)
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            sched.step()
            step += 1
            if step % 20 == 0 or step == cfg.steps:
                print(f"step {step}: loss {loss.item():.4f}", flush=True)
            if step == cfg.steps:
                break
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
