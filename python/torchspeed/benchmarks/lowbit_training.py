"""Training quality of the low-bit optimizer states: the same model, data and seed trained with
torch's AdamW (the anchor, fp32 moments) and with torchspeed's optimizers at each ``state_dtype``,
side by side in one process. Prints the final loss of each (mean of the last 10 % of the steps)
against the anchor's, the state bytes per parameter, and writes the loss curves as JSON and, with
matplotlib, as a PNG (``lowbit_training.png``) beside it.

Two tasks (``--task``), both of which really learn:

- ``teacher`` (default): a 3-layer MLP (every weight >= 4096 elements, so int8 applies to all of
  them) regresses a fixed random teacher network's tanh outputs from fresh Gaussian inputs each
  step, so the loss falls by orders of magnitude and the moments see both large early and small
  late gradients.
- ``lm``: a small causal transformer language model (byte-level, pre-norm, 2 layers of width 128,
  context 64) on real text: the source of a fixed list of Python standard-library modules, the
  last 10 % of it held out. Its rows add the held-out loss (nats per byte) after the last step,
  the number a user of a language model would compare.

    torchspeed bench lowbit_training [--task teacher|lm] [--quick] [--steps N]
                                     [--optimizers adamw,lion,sgd]
"""

from __future__ import annotations

import argparse
import json
import math
import os
from typing import Dict, List, Optional, Sequence

import torch
from torch import nn

from torchspeed._progress import progress_bar
from torchspeed.benchmarks.harness import machine_info, results_dir

STATE_DTYPES = ("fp32", "bf16", "int8")
#: Learning rates per optimizer (Lion's is 10x smaller than AdamW's, as its paper advises).
LR = {"adamw": 1e-3, "lion": 1e-4, "sgd": 0.05}


def _model(width: int) -> nn.Module:
    return nn.Sequential(
        nn.Linear(128, width), nn.GELU(), nn.Linear(width, width), nn.GELU(), nn.Linear(width, 32)
    )


class TeacherTask:
    """Fresh Gaussian inputs each step, a fixed random teacher's tanh outputs as targets (MSE)."""

    loss_name = "MSE"

    def __init__(self, quick: bool):
        self.width, self.batch = (128, 64) if quick else (512, 256)
        self.describe = f"MLP 128-{self.width}-{self.width}-32, batch {self.batch}"

    def start(self) -> nn.Module:
        """The model to train (seeded); also resets the task's data stream."""
        torch.manual_seed(0)
        model = _model(self.width)
        self.teacher = _model(self.width // 2 if self.width > 64 else self.width)
        for p in self.teacher.parameters():
            p.requires_grad_(False)
        self.gen = torch.Generator().manual_seed(1)
        return model

    def loss(self, model: nn.Module) -> torch.Tensor:
        x = torch.randn(self.batch, 128, generator=self.gen)
        with torch.no_grad():
            y = torch.tanh(self.teacher(x))
        return nn.functional.mse_loss(model(x), y)

    def held_out(self, model: nn.Module) -> Optional[float]:
        return None


#: The standard-library modules whose source is the language model's text (about 0.9 MB).
LM_MODULES = (
    "argparse", "typing", "dataclasses", "inspect", "pathlib", "subprocess", "threading",
    "tarfile", "zipfile", "logging", "unittest.case", "email.message", "http.client",
)  # fmt: skip


def lm_text(modules: Sequence[str] = LM_MODULES) -> bytes:
    """The language model's corpus: the source files of `modules`, concatenated."""
    import importlib.util

    parts = []
    for name in modules:
        spec = importlib.util.find_spec(name)
        if spec is None or not spec.origin or not spec.origin.endswith(".py"):
            raise RuntimeError(f"bench lowbit_training: no source for module {name!r}")
        with open(spec.origin, "rb") as f:
            parts.append(f.read())
    return b"\n".join(parts)


class TinyLM(nn.Module):
    """A byte-level causal transformer: token + position embeddings, pre-norm encoder layers under
    a causal mask, a final LayerNorm and a linear head over the 256 byte values."""

    def __init__(self, width: int, layers: int, heads: int, context: int):
        super().__init__()
        self.tok = nn.Embedding(256, width)
        self.pos = nn.Embedding(context, width)
        layer = nn.TransformerEncoderLayer(
            width, heads, 4 * width, dropout=0.0, batch_first=True, norm_first=True
        )
        self.blocks = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.norm = nn.LayerNorm(width)
        self.head = nn.Linear(width, 256)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        t = x.shape[1]
        h = self.tok(x) + self.pos(torch.arange(t, device=x.device))
        mask = nn.Transformer.generate_square_subsequent_mask(t, device=x.device)
        return self.head(self.norm(self.blocks(h, mask=mask, is_causal=True)))


class LmTask:
    """Next-byte prediction on standard-library source (cross-entropy, nats per byte); random
    windows of the first 90 % for training, fixed windows of the last 10 % held out."""

    loss_name = "nats/byte"

    def __init__(self, quick: bool):
        self.width, self.layers, self.context, self.batch = (
            (32, 1, 16, 8) if quick else (128, 2, 64, 16)
        )
        data = torch.frombuffer(bytearray(lm_text()), dtype=torch.uint8).long()
        cut = int(0.9 * data.numel())
        self.train_data, self.val_data = data[:cut], data[cut:]
        g = torch.Generator().manual_seed(2)
        starts = torch.randint(0, self.val_data.numel() - self.context - 1, (64,), generator=g)
        self.val_x, self.val_y = self._windows(self.val_data, starts)
        self.describe = (
            f"byte-level transformer {self.layers} x {self.width}, context {self.context}, "
            f"batch {self.batch}, {data.numel() / 1e6:.2f} MB of text, 10 % held out"
        )

    def _windows(self, data: torch.Tensor, starts: torch.Tensor):
        idx = starts[:, None] + torch.arange(self.context + 1)
        w = data[idx]
        return w[:, :-1], w[:, 1:]

    def start(self) -> nn.Module:
        torch.manual_seed(0)
        model = TinyLM(self.width, self.layers, heads=4, context=self.context)
        self.gen = torch.Generator().manual_seed(1)
        return model

    def _loss(self, model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return nn.functional.cross_entropy(model(x).flatten(0, 1), y.flatten())

    def loss(self, model: nn.Module) -> torch.Tensor:
        hi = self.train_data.numel() - self.context - 1
        starts = torch.randint(0, hi, (self.batch,), generator=self.gen)
        return self._loss(model, *self._windows(self.train_data, starts))

    def held_out(self, model: nn.Module) -> Optional[float]:
        with torch.no_grad():
            return float(self._loss(model, self.val_x, self.val_y))


TASKS = {"teacher": TeacherTask, "lm": LmTask}


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


def train(kind: str, sd: Optional[str], steps: int, task) -> Dict:
    """Loss per step of one run; {} when the optimizer does not exist (torch has no Lion)."""
    model = task.start()
    opt = _optimizer(kind, sd, model.parameters())
    if opt is None:
        return {}
    losses: List[float] = []
    name = f"{kind} {'torch' if sd is None else 'torchspeed ' + sd}"
    bar = progress_bar(steps, name, "step", terminal_only=True)
    for _ in range(steps):
        loss = task.loss(model)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        losses.append(float(loss.detach()))
        bar.update()
    bar.close()
    n = sum(p.numel() for p in model.parameters())
    state = getattr(opt, "state_bytes", None)
    state_bytes = state() if callable(state) else _torch_state_bytes(opt)
    return {
        "losses": losses,
        "held_out": task.held_out(model),
        "state_bytes_per_param": state_bytes / n,
    }


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


#: Steps per point of the plotted curves (a trailing mean), so that runs a per-batch noise would hide
#: stay apart.
_SMOOTH = 25


def _smoothed(losses: Sequence[float]) -> List[float]:
    """The trailing mean of up to _SMOOTH losses at each step."""
    out, total = [], 0.0
    for i, x in enumerate(losses):
        total += x
        if i >= _SMOOTH:
            total -= losses[i - _SMOOTH]
        out.append(total / min(i + 1, _SMOOTH))
    return out


def _plot(runs: Dict[str, Dict], path: str, loss_name: str) -> Optional[str]:
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
            ax.plot(_smoothed(r["losses"]), label=name, linewidth=1.0, alpha=0.85)
        ax.set_yscale("log")
        ax.set_xlabel("step")
        ax.set_ylabel(f"training loss ({loss_name})")
        ax.set_title(f"{kind}: state_dtype side by side ({_SMOOTH}-step mean)")
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def main(argv: Optional[Sequence[str]] = None) -> int:
    ap = argparse.ArgumentParser(prog="torchspeed bench lowbit_training", description=__doc__)
    ap.add_argument("--task", default="teacher", choices=sorted(TASKS), help="what to train")
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
        return _run(kinds, steps, args.task, TASKS[args.task](args.quick))
    finally:
        torch.set_num_threads(threads)


def _run(kinds: List[str], steps: int, task_name: str, task) -> int:
    info = machine_info("cpu")
    print(
        f"# bench_lowbit_training ({info.get('cpu_model') or '?'}, torch {torch.__version__}; "
        f"task {task_name}: {steps} steps, {task.describe}, seed 0)"
    )
    runs: Dict[str, Dict] = {}
    for kind in kinds:
        runs[f"{kind} torch"] = train(kind, None, steps, task)
        for sd in STATE_DTYPES:
            runs[f"{kind} torchspeed {sd}"] = train(kind, sd, steps, task)
    print(
        f"{'run':<28} {'first loss':>11} {'final loss':>11} {'vs ref':>9} {'held-out':>9} "
        f"{'vs ref':>9} {'state B/param':>14}"
    )
    rows = []
    for name, r in runs.items():
        if not r:
            continue
        kind = name.split(" ")[0]
        ref_run = runs.get(f"{kind} torch") or runs.get(f"{kind} torchspeed fp32")
        final, ref = _final(r["losses"]), _final(ref_run["losses"])
        rel = final / ref - 1.0 if ref > 0 else None  # None: no finite reference (JSON null)
        held, held_ref = r["held_out"], ref_run["held_out"]
        held_rel = held / held_ref - 1.0 if held is not None and held_ref else None
        rows.append(
            {
                "run": name,
                "first_loss": _finite(r["losses"][0]),
                "final_loss": _finite(final),
                "vs_reference": _finite(rel),
                "held_out_loss": _finite(held),
                "held_out_vs_reference": _finite(held_rel),
                "state_bytes_per_param": r["state_bytes_per_param"],
            }
        )
        print(
            f"{name:<28} {r['losses'][0]:>11.4g} {final:>11.4g} "
            + (f"{100 * rel:>+8.2f}% " if rel is not None else f"{'-':>9} ")
            + (f"{held:>9.4g} " if held is not None else f"{'-':>9} ")
            + (f"{100 * held_rel:>+8.2f}% " if held_rel is not None else f"{'-':>9} ")
            + f"{r['state_bytes_per_param']:>14.2f}"
        )
    out = results_dir()
    os.makedirs(out, exist_ok=True)
    stem = "lowbit_training" if task_name == "teacher" else f"lowbit_training_{task_name}"
    path = os.path.join(out, f"{stem}.json")
    rec = {
        "machine": info,
        "task": task_name,
        "describe": task.describe,
        "steps": steps,
        "rows": rows,
        "curves": {k: [_finite(x) for x in v["losses"]] for k, v in runs.items() if v},
    }
    with open(path, "w", encoding="utf-8") as f:
        json.dump(rec, f)
    png = _plot(runs, os.path.join(out, f"{stem}.png"), task.loss_name)
    print(f"results written to {path}" + (f" and {png}" if png else " (no matplotlib: no PNG)"))
    return 0
