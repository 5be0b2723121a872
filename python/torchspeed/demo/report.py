"""The demo's outputs: the side-by-side table, summary.json (every figure) and demo.png."""

from __future__ import annotations

import math
import platform
import time
from typing import Optional, Sequence

from .._atomic import atomic_write
from ..profile.summary import PHASES

_SHOWN_PHASES = ("data_wait", "h2d", "forward", "backward", "optimizer", "other")


def _fmt(v: float, digits: int = 1) -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "-"
    return f"{v:,.{digits}f}"


def table(results: Sequence, cfg) -> str:
    base = results[0]
    head = ["", *(r.label for r in results)] + [f"speedup ({r.name})" for r in results[1:]]
    rows = []

    def row(name, values, ratio=None, digits=1):
        cells = [name] + [_fmt(v, digits) for v in values]
        if ratio is not None:
            for v in values[1:]:
                r = ratio(values[0], v)
                cells.append("-" if r is None else f"{r:.2f}x")
        else:
            cells += [""] * (len(values) - 1)
        rows.append(cells)

    def faster(a, b):  # a time: baseline over this run
        return a / b if a and b and a > 0 and b > 0 else None

    def higher(a, b):
        return b / a if a and b and a > 0 else None

    stats = [r.step_stats() for r in results]
    row("wall time, training (s)", [r.wall_s for r in results], faster)
    row("images/s", [r.images_per_s for r in results], higher)
    row(
        "  steps x median step (s)",
        [r.steps * st["median_s"] for r, st in zip(results, stats)],
        faster,
    )
    row(
        "  of the wall: steps > 3x median, excess (s)",
        [st["slow_excess_s"] for st in stats],
        None,
    )
    row(
        "CPU ms per image (all threads + workers)",
        [1e3 * r.cpu_s / r.images for r in results],
        faster,
        2,
    )
    row("loader setup (s, not in the wall time)", [r.setup_s for r in results], faster, 2)
    row("first batch (s, in the wall time)", [r.first_batch_s for r in results], faster, 2)
    row("step median (ms)", [r.summary.step_median_s * 1e3 for r in results], faster)
    row("step p90 / max (ms)", [st["p90_s"] * 1e3 for st in stats], None, 0)
    rows[-1][1 : 1 + len(results)] = [
        f"{st['p90_s'] * 1e3:,.0f} / {st['max_s'] * 1e3:,.0f}" for st in stats
    ]
    for p in _SHOWN_PHASES:
        vals = [r.summary.phases[p].median_s * 1e3 for r in results]
        if p == "h2d" and max(vals) == 0:
            continue
        shares = " / ".join(f"{100 * r.summary.phases[p].share:.0f}%" for r in results)
        row(f"  {p} (ms; share {shares})", vals, None, 2)
    row("final train loss (last 10% of steps)", [r.final_loss for r in results], None, 3)
    row("held-out accuracy (%)", [100 * r.heldout_acc for r in results], None, 1)
    row("held-out eval (s, not in the wall time)", [r.eval_s for r in results], faster)
    widths = [max(len(str(c)) for c in col) for col in zip(head, *rows)]
    lines = [
        "  ".join(
            str(c).ljust(w) if i == 0 else str(c).rjust(w)
            for i, (c, w) in enumerate(zip(r, widths))
        )
        for r in [head] + rows
    ]
    lines.insert(1, "-" * len(lines[0]))
    acc_gap = 100 * abs(results[1].heldout_acc - base.heldout_acc)
    lines.append("")
    cpu_ratio = base.cpu_s / results[1].cpu_s if results[1].cpu_s > 0 else math.nan
    lines.append(
        f"Same {cfg.steps} steps of {cfg.batch_size} images at {cfg.image_size} px, seed {cfg.seed}, "
        f"AdamW lr {cfg.lr:g}, autocast {cfg.amp}: torchspeed is "
        f"{base.wall_s / results[1].wall_s:.2f}x faster in wall time and uses {cpu_ratio:.2f}x "
        f"less CPU per image; held-out accuracy "
        f"{100 * base.heldout_acc:.1f} % vs {100 * results[1].heldout_acc:.1f} % "
        f"({acc_gap:.1f} points apart; chance is 10 %"
        + (
            "; too few steps to learn the task: run more with --steps"
            if max(base.heldout_acc, results[1].heldout_acc) < 0.2
            else ""
        )
        + ")."
    )
    slow = [(r, st) for r, st in zip(results, stats) if st["slow_excess_s"] > 0.1 * r.wall_s]
    for r, st in slow:
        lines.append(
            f"{r.label}: {st['slow_steps']} steps took over 3x the median step and added "
            f"{st['slow_excess_s']:.1f} s to its wall time (machine load or a start-up transient; "
            f"see times_s in summary.json): compare the 'steps x median step' row too."
        )
    for r in results[2:]:
        lines.append(f"{r.label}: {', '.join(r.notes) or 'nothing to apply'}.")
    limit = max(_SHOWN_PHASES, key=lambda p: results[1].summary.phases[p].share)
    lines.append(
        f"torchspeed's step is now {100 * results[1].summary.phases[limit].share:.0f} % {limit} "
        f"(the baseline's: {100 * base.summary.phases[limit].share:.0f} % {limit}, "
        f"{100 * base.summary.phases['data_wait'].share:.0f} % data_wait): "
        + _limit_sentence(limit)
    )
    return "\n".join(lines)


def _limit_sentence(phase: str) -> str:
    if phase == "data_wait":
        return "still input-bound: more cores (or --workers) would go further."
    if phase in ("forward", "backward"):
        return "the model's compute now bounds the step; the loader no longer does."
    if phase == "optimizer":
        return "the optimizer step bounds it."
    return f"{phase} bounds it."


def _summary_dict(s) -> dict:
    return {
        "steps_summarized": s.steps,
        "step_median_ms": s.step_median_s * 1e3,
        "step_mean_ms": s.step_mean_s * 1e3,
        "samples_per_s": s.samples_per_s,
        "clock": s.clock,
        "phases": {
            p: {
                "median_ms": s.phases[p].median_s * 1e3,
                "mean_ms": s.phases[p].mean_s * 1e3,
                "total_s": s.phases[p].total_s,
                "share": s.phases[p].share,
            }
            for p in PHASES
        },
    }


def record(
    results: Sequence, cfg, manifest: dict, total_s: float, argv, warmup_s: float = math.nan
) -> dict:
    import torch

    import torchspeed

    base = results[0]
    try:
        from ..info import cpu_model_name  # type: ignore[attr-defined]

        cpu = cpu_model_name()
    except Exception:  # noqa: BLE001
        cpu = platform.processor() or platform.machine()
    runs = {}
    for r in results:
        runs[r.name] = {
            "label": r.label,
            "wall_s": r.wall_s,
            "steps": r.steps,
            "images": r.images,
            "images_per_s": r.images_per_s,
            "setup_s": r.setup_s,
            "first_batch_s": r.first_batch_s,
            "step_times": {k: v for k, v in r.step_stats().items()},
            "steps_x_median_s": r.steps * r.step_stats()["median_s"],
            "cpu_s": r.cpu_s,
            "cpu_ms_per_image": 1e3 * r.cpu_s / r.images,
            "final_train_loss": r.final_loss,
            "heldout_accuracy": r.heldout_acc,
            "heldout_images": r.heldout_images,
            "eval_s": r.eval_s,
            "speedup_wall": base.wall_s / r.wall_s,
            "summary": _summary_dict(r.summary),
            "phase_total_s": r.phase_total_s,
            "notes": r.notes,
            "losses": r.losses,
            "times_s": r.times_s,
        }
    from .dataset import cpu_count

    return {
        "command": "torchspeed demo " + " ".join(argv),
        "date_utc": time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime()),
        "machine": {
            "cpu_model": cpu,
            "cores": cpu_count(),
            "device": cfg.device,
            "gpu": torch.cuda.get_device_name() if cfg.device.startswith("cuda") else None,
            "torch": torch.__version__,
            "torchspeed": torchspeed.__version__,
            "python": platform.python_version(),
        },
        "config": {
            "steps": cfg.steps,
            "batch_size": cfg.batch_size,
            "image_size": cfg.image_size,
            "workers": cfg.workers,
            "lr": cfg.lr,
            "weight_decay": cfg.weight_decay,
            "seed": cfg.seed,
            "amp": cfg.amp,
            "width": cfg.width,
            "crop_scale": list(cfg.scale),
            "decode_scaling": cfg.decode_scaling,
        },
        "dataset": {
            k: manifest[k]
            for k in (
                "folder",
                "train",
                "val",
                "classes",
                "mean_jpeg_kb",
                "generation_s",
                "generated_s",
            )
            if k in manifest
        },
        "speedup_wall": base.wall_s / results[1].wall_s,
        "heldout_accuracy_gap_points": 100 * abs(results[1].heldout_acc - base.heldout_acc),
        "total_s": total_s,
        "process_warmup_s": warmup_s,
        "runs": runs,
    }


def write_png(results: Sequence, path: str) -> Optional[str]:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    from ..profile.report import _phase_colors

    colors = _phase_colors()
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(13, 4.8), gridspec_kw={"width_ratios": [3, 2]})
    for r in results:
        k = max(1, len(r.losses) // 25)
        smooth = [
            sum(r.losses[max(0, i - k + 1) : i + 1]) / len(r.losses[max(0, i - k + 1) : i + 1])
            for i in range(len(r.losses))
        ]
        (line,) = ax1.plot(
            r.times_s,
            smooth,
            label=f"{r.label}: {r.wall_s:.1f} s, {100 * r.heldout_acc:.1f} % held-out",
        )
        ax1.plot(r.times_s, r.losses, color=line.get_color(), alpha=0.2, linewidth=0.8)
    ax1.set_xlabel("wall time (s)")
    ax1.set_ylabel("train loss")
    ax1.set_title("Train loss against wall time (same steps, same seed)")
    ax1.legend(fontsize=8)
    ax1.grid(alpha=0.3)
    names = [r.label.split(" (")[0] for r in results]
    left = [0.0] * len(results)
    for p in PHASES:
        vals = [r.phase_total_s.get(p, 0.0) for r in results]
        if max(vals) <= 0:
            continue
        ax2.barh(names, vals, left=left, label=p, color=colors.get(p))
        left = [a + b for a, b in zip(left, vals)]
    ax2.invert_yaxis()
    ax2.set_xlabel("seconds over the run, by phase")
    ax2.set_title("Where the time goes")
    ax2.legend(fontsize=8, loc="lower right")
    fig.tight_layout()
    try:
        atomic_write(path, lambda f: fig.savefig(f, format="png", dpi=110), who="torchspeed demo")
    finally:
        plt.close(fig)
    return path
