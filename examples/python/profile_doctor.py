"""The step profiler and the doctor in a training loop of your own.

    python examples/python/profile_doctor.py --out /tmp/prof        # 60 steps
    python examples/python/profile_doctor.py --quick                # 12 steps (what CI runs)

A small conv net trained on synthetic images from torch's DataLoader (a map-style Dataset with a
per-sample cost, like decode + augmentation). `StepProfiler(hooks=True)` covers the plain torch code
(the loader's iterator, module forwards, backward, the optimizer step) and explicit phase/range
markers add names of our own; `prof.report()` prints the per-phase breakdown (median, p90, share)
and the doctor's ranked advice, and the run writes a Chrome trace (open it in ui.perfetto.dev), a
PNG of the step times and summary.json to --out.

For a script you do not want to edit: `torchspeed doctor --steps 100 -- python train.py ARGS`.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, Dataset

import torchspeed.profile as tsp


class SlowImages(Dataset):
    """Random 3x32x32 images with a little CPU work per sample (stands in for decode + augment)."""

    def __len__(self) -> int:
        return 4096

    def __getitem__(self, i: int):
        g = torch.Generator().manual_seed(i)
        x = torch.rand(3, 32, 32, generator=g)
        for _ in range(20):
            x = (x * 0.9 + 0.05).clamp_(0, 1)
        return x, i % 10


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--out", default=None, help="output folder (default: a temporary one)")
    ap.add_argument("--quick", action="store_true", help="12 steps")
    args = ap.parse_args(argv)
    steps = 12 if args.quick else args.steps
    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Conv2d(3, 16, 3, padding=1),
        nn.BatchNorm2d(16),
        nn.ReLU(),  # conv bias before BN: a lint
        nn.Conv2d(16, 32, 3, stride=2, padding=1),
        nn.ReLU(),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(32, 10),
    )
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    loader = DataLoader(SlowImages(), batch_size=32, shuffle=True, num_workers=0)  # a data-wait

    with tsp.StepProfiler(hooks=True, warmup=2) as prof:
        for step, (x, y) in enumerate(loader):
            if step == steps:
                break
            with tsp.range("augment"):  # a named range: in the trace, time stays with its phase
                x = torch.flip(x, dims=[3]) if step % 2 else x
            with tsp.phase("forward"):
                loss = F.cross_entropy(model(x), y)
            with tsp.phase("backward"):
                loss.backward()
            opt.step()  # the hooks time it as "optimizer"
            opt.zero_grad()
            prof.step(samples=x.shape[0])

    print(prof.report())  # the breakdown, then the ranked advice (here: data wait, workers)
    out = args.out or tempfile.mkdtemp(prefix="profile_doctor-")
    os.makedirs(out, exist_ok=True)
    prof.export_chrome_trace(os.path.join(out, "trace.json"))
    png = prof.write_png(os.path.join(out, "steps.png"))  # None without matplotlib
    s = prof.summary()
    findings = prof.advice(s)
    with open(os.path.join(out, "summary.json"), "w") as f:
        json.dump(
            {
                "step_median_ms": s.step_median_s * 1e3,
                "shares": {p: s.phases[p].share for p in tsp.PHASES},
                "advice": [f.rule for f in findings],
            },
            f,
            indent=1,
        )
    print(f"\nwrote trace.json{', steps.png' if png else ''} and summary.json to {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
