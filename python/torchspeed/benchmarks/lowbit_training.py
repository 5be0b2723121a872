"""Training quality of the low-bit optimizer states: the same model, data and seed trained with
torch's AdamW (the anchor, fp32 moments) and with torchspeed's optimizers at each ``state_dtype``,
side by side in one process. Prints the final loss of each (mean of the last 10 % of the steps)
against the anchor's, the state bytes per parameter, and writes the loss curves as JSON and, with
matplotlib, as a PNG (``lowbit_training.png``) beside it.

The task really learns: a 3-layer MLP (every weight >= 4096 elements, so int8 applies to all of
them) regresses a fixed random teacher network's tanh outputs from fresh Gaussian inputs each
step, so the loss falls by orders of magnitude and the moments see both large early and small
late gradients.

    torchspeed bench lowbit_training [--quick] [--steps N] [--optimizers adamw,lion,sgd]
"""

from __future__ import annotations

import argparse
import json
import math
import os
from typing import Dict, List, Optional, Sequence

import torch
from torch import nn

from torchspeed.benchmarks.harness import machine_info, results_dir

STATE_DTYPES = ("fp32", "bf16", "int8")
#: Learning rates per optimizer (Lion's is 10x smaller than AdamW's, as its paper advises).
LR = {"adamw": 1e-3, "lion": 1e-4, "sgd": 0.05}


def _model(width: int) -> nn.Module:
    return nn.Sequential(
        nn.Linear(128, width), nn.GELU(), nn.Linear(width, width), nn.GELU(), nn.Linear(width, 32)
    )


def _optimizer(kind: str, sd: Optional[str], params):
    import torchspeed.optim as ts

    lr = LR[kind]
    if sd is None:  # the torch anchor
        if kind == "adamw":
            return torch.optim.AdamW(params, lr=lr, fused=True)
        if kind == "sgd":
            return torch.optim.SGD(params, lr=lr, momentum=0.9)
        return None  # torch has no Lion
    if kind == "adamw":
        return ts.AdamW(params, lr=lr, state_dtype=sd)
    if kind == "lion":
        return ts.Lion(params, lr=lr, state_dtype=sd)
    return ts.SGD(params, lr=lr, momentum=0.9, state_dtype=sd)


def train(kind: str, sd: Optional[str], steps: int, width: int, batch: int) -> Dict:
    """Loss per step of one run; None when the optimizer does not exist (torch has no Lion)."""
    torch.manual_seed(0)
    model, teacher = _model(width), _model(width // 2 if width > 64 else width)
    for p in teacher.parameters():
        p.requires_grad_(False)
    opt = _optimizer(kind, sd, model.parameters())
    if opt is None:
        return {}
    g = torch.Generator().manual_seed(1)
    losses: List[float] = []
    for _ in range(steps):
        x = torch.randn(batch, 128, generator=g)
        with torch.no_grad():
            y = torch.tanh(teacher(x))
        loss = nn.functional.mse_loss(model(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        losses.append(float(loss.detach()))
    n = sum(p.numel() for p in model.parameters())
    state = getattr(opt, "state_bytes", None)
    state_bytes = state() if callable(state) else _torch_state_bytes(opt)
    return {"losses": losses, "state_bytes_per_param": state_bytes / n}


def _torch_state_bytes(opt) -> int:
    return sum(
        v.numel() * v.element_size()
        for s in opt.state.values()
        for k, v in s.items()
        if isinstance(v, torch.Tensor) and k != "step"
    )


def _finite(x: Optional[float]) -> Optional[float]:
    """x, or None (JSON null) for a NaN or inf: a diverged run stays standard JSON."""
    return x if x is not None and math.isfinite(x) else None


def _final(losses: Sequence[float]) -> float:
    tail = losses[-max(1, len(losses) // 10) :]
    return sum(tail) / len(tail)


def _plot(runs: Dict[str, Dict], path: str) -> Optional[str]:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    kinds = sorted({k.split(" ")[0] for k in runs})
    fig, axes = plt.subplots(1, len(kinds), figsize=(5.5 * len(kinds), 4), squeeze=False)
    for ax, kind in zip(axes[0], kinds):
        for name, r in runs.items():
            if name.split(" ")[0] != kind or not r:
                continue
            ax.plot(r["losses"], label=name, linewidth=0.9, alpha=0.85)
        ax.set_yscale("log")
        ax.set_xlabel("step")
        ax.set_ylabel("training loss (MSE)")
        ax.set_title(f"{kind}: state_dtype side by side")
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def main(argv: Optional[Sequence[str]] = None) -> int:
    ap = argparse.ArgumentParser(prog="torchspeed bench lowbit_training", description=__doc__)
    ap.add_argument("--quick", action="store_true", help="200 steps of a narrower model (CI)")
    ap.add_argument("--steps", type=int, default=None, help="steps per run (default 3000)")
    ap.add_argument("--optimizers", default="adamw,lion,sgd", help="comma list: adamw,lion,sgd")
    ap.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    args = ap.parse_args(argv)
    kinds = [k for k in args.optimizers.split(",") if k]
    bad = [k for k in kinds if k not in LR]
    if bad or not kinds:
        ap.error(f"--optimizers must be a comma list of {', '.join(LR)}, got {args.optimizers!r}")
    steps = args.steps if args.steps is not None else (200 if args.quick else 3000)
    if steps < 10:
        ap.error(f"--steps must be >= 10, got {steps}")
    if args.threads is not None and args.threads < 1:
        ap.error(f"--threads must be >= 1, got {args.threads}")
    threads = torch.get_num_threads()
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    try:
        return _run(kinds, steps, args.quick)
    finally:
        torch.set_num_threads(threads)


def _run(kinds: List[str], steps: int, quick: bool) -> int:
    width, batch = (128, 64) if quick else (512, 256)
    info = machine_info("cpu")
    print(
        f"# bench_lowbit_training ({info.get('cpu_model') or '?'}, torch {torch.__version__}; "
        f"{steps} steps, MLP 128-{width}-{width}-32, batch {batch}, seed 0)"
    )
    runs: Dict[str, Dict] = {}
    for kind in kinds:
        runs[f"{kind} torch"] = train(kind, None, steps, width, batch)
        for sd in STATE_DTYPES:
            runs[f"{kind} torchspeed {sd}"] = train(kind, sd, steps, width, batch)
    print(f"{'run':<28} {'first loss':>11} {'final loss':>11} {'vs ref':>9} {'state B/param':>14}")
    rows = []
    for name, r in runs.items():
        if not r:
            continue
        kind = name.split(" ")[0]
        ref_run = runs.get(f"{kind} torch") or runs.get(f"{kind} torchspeed fp32")
        final, ref = _final(r["losses"]), _final(ref_run["losses"])
        rel = final / ref - 1.0 if ref > 0 else None  # None: no finite reference (JSON null)
        rows.append(
            {
                "run": name,
                "first_loss": _finite(r["losses"][0]),
                "final_loss": _finite(final),
                "vs_reference": _finite(rel),
                "state_bytes_per_param": r["state_bytes_per_param"],
            }
        )
        print(
            f"{name:<28} {r['losses'][0]:>11.4g} {final:>11.4g} "
            + (f"{100 * rel:>+8.2f}% " if rel is not None else f"{'-':>9} ")
            + f"{r['state_bytes_per_param']:>14.2f}"
        )
    out = results_dir()
    os.makedirs(out, exist_ok=True)
    path = os.path.join(out, "lowbit_training.json")
    rec = {
        "machine": info,
        "steps": steps,
        "width": width,
        "batch": batch,
        "rows": rows,
        "curves": {k: [_finite(x) for x in v["losses"]] for k, v in runs.items() if v},
    }
    with open(path, "w", encoding="utf-8") as f:
        json.dump(rec, f)
    png = _plot(runs, os.path.join(out, "lowbit_training.png"))
    print(f"results written to {path}" + (f" and {png}" if png else " (no matplotlib: no PNG)"))
    return 0
