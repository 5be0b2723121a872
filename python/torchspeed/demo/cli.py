"""The ``torchspeed demo`` command line: its arguments, the two training runs and the report
(torchspeed.demo describes the demo; ``python -m torchspeed.demo`` runs this ``main``)."""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import List, Optional

from .._atomic import atomic_write
from .._cli_args import output_folder

_WHO = "torchspeed demo"

DEFAULTS = {  # (steps, batch size, image size): "full" fits 5 minutes on 2 cores, first run included
    "full": (300, 64, 64),
    "quick": (12, 32, 48),
}


def _results_dir() -> str:
    base = os.environ.get("TORCHSPEED_RESULTS_DIR") or os.path.join(
        os.getcwd(), "torchspeed_results"
    )
    return os.path.join(base, "demo")


def build_parser() -> argparse.ArgumentParser:
    from .dataset import ENV_DATA_DIR

    ap = argparse.ArgumentParser(
        prog="torchspeed demo",
        description="Trains the same small CNN as idiomatic PyTorch and with torchspeed, side by "
        "side (docs/DEMO.md).",
    )
    ap.add_argument("--device", default=None, help="cpu or cuda[:N] (default: cuda if available)")
    ap.add_argument(
        "--steps",
        type=int,
        default=None,
        help=f"training steps per run (default {DEFAULTS['full'][0]}, --quick {DEFAULTS['quick'][0]})",
    )
    ap.add_argument(
        "--batch-size",
        type=int,
        default=None,
        help=f"default {DEFAULTS['full'][1]} (--quick {DEFAULTS['quick'][1]})",
    )
    ap.add_argument(
        "--image-size",
        type=int,
        default=None,
        help=f"crop size in pixels (default {DEFAULTS['full'][2]}, --quick {DEFAULTS['quick'][2]})",
    )
    ap.add_argument(
        "--workers",
        type=int,
        default=None,
        help="loader workers in both runs (default: the cores this process may use)",
    )
    ap.add_argument(
        "--out",
        default=None,
        type=output_folder,
        help="output folder (default $TORCHSPEED_RESULTS_DIR/demo, else ./torchspeed_results/demo)",
    )
    ap.add_argument(
        "--data-dir",
        default=None,
        type=output_folder,
        help=f"dataset cache root (default ${ENV_DATA_DIR}, else $XDG_CACHE_HOME/torchspeed or ~/.cache/torchspeed)",
    )
    ap.add_argument(
        "--quick",
        action="store_true",
        help="a short run CI can afford: 480 + 160 images, 12 steps of 32 at 48 px",
    )
    ap.add_argument(
        "--amp",
        choices=("auto", "off", "bf16", "fp16"),
        default="auto",
        help="autocast in every run: auto = fp16 + GradScaler on CUDA, off on the CPU (default)",
    )
    ap.add_argument(
        "--decode-scaling",
        choices=("fast", "accurate", "off"),
        default="fast",
        help="torchspeed loader's JPEG decode-time scaling (default fast)",
    )
    ap.add_argument("--lr", type=float, default=2e-3, help="AdamW learning rate (default 2e-3)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument(
        "--with-doctor-fixes",
        action="store_true",
        help="a third run: torchspeed plus the torch-level fixes the doctor advised for the "
        "baseline run, measured on this machine (channels_last, bf16 autocast where faster; "
        "cudnn.benchmark on CUDA)",
    )
    ap.add_argument("--no-progress", action="store_true", help="no progress bars")
    ap.add_argument(
        "--benchmarks",
        action="store_true",
        help="run the micro-benchmarks instead (optim, grad_stats, loader, quant, ddp; quick sizes)",
    )
    return ap


def main(argv: Optional[List[str]] = None) -> int:
    ap = build_parser()
    args, extra = ap.parse_known_args(argv)
    if args.benchmarks:
        from .. import benchmarks

        return benchmarks.run_all(extra)
    if extra:
        ap.error(f"unrecognized arguments: {' '.join(extra)}")
    try:
        import PIL  # noqa: F401
    except ImportError:
        print(
            "torchspeed demo: needs Pillow (its dataset and its PyTorch baseline decode JPEGs with "
            "it): pip install 'torchspeed[demo]'",
            file=sys.stderr,
        )
        return 2
    import torch

    from . import dataset, report, train

    name = "quick" if args.quick else "full"
    steps, batch, size = DEFAULTS[name]
    steps = args.steps if args.steps is not None else steps
    batch = args.batch_size if args.batch_size is not None else batch
    size = args.image_size if args.image_size is not None else size
    workers = args.workers if args.workers is not None else dataset.cpu_count()
    for flag, v, low in (
        ("--steps", steps, 1),
        ("--batch-size", batch, 1),
        ("--image-size", size, 16),
        ("--workers", workers, 0),
    ):
        if v < low:
            ap.error(f"{flag} must be >= {low}, got {v}")
    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    try:
        dev = torch.device(device)
    except RuntimeError as e:
        ap.error(f"--device: {e}")
    if dev.type not in ("cpu", "cuda"):
        ap.error(f"--device must be cpu or cuda[:N], got {device}")
    if dev.type == "cuda" and not torch.cuda.is_available():
        ap.error("--device cuda: CUDA is not available (torch.cuda.is_available() is False)")
    if dev.type == "cuda":
        torch.cuda.set_device(dev)
    amp = args.amp
    if amp == "auto":
        amp = "fp16" if dev.type == "cuda" else "off"
    out = os.path.abspath(args.out or _results_dir())
    os.makedirs(out, exist_ok=True)

    t_start = time.perf_counter()
    manifest = dataset.prepare(name, args.data_dir, seed=args.seed, progress=not args.no_progress)
    n_train = manifest["train"]
    epochs = steps * batch / n_train
    print(
        f"torchspeed demo: {steps} steps of {batch} images at {size} px ({epochs:.2f} epochs of "
        f"{n_train} images), {workers} loader workers, device {device}, autocast {amp}, "
        f"{dataset.cpu_count()} cores; data in {manifest['folder']}"
        + (
            f" (generated in {manifest['generated_s']:.1f} s)"
            if manifest["generated_s"]
            else " (cached)"
        ),
        flush=True,
    )
    cfg = train.Config(
        device=str(dev),
        steps=steps,
        batch_size=batch,
        image_size=size,
        workers=workers,
        lr=args.lr,
        seed=args.seed,
        amp=amp,
        decode_scaling=args.decode_scaling if args.decode_scaling != "off" else False,
        progress=not args.no_progress,
    )
    kinds = ["baseline", "torchspeed"] + (["doctor_fixes"] if args.with_doctor_fixes else [])
    # Untimed, before any run: the process's one-time warm-up would otherwise land in the first
    # run's timed steps (see train.warm_up).
    warmup_s = train.warm_up(cfg, len(manifest["classes"]), channels_last=args.with_doctor_fixes)
    print(f"process warm-up (untimed, before the runs): {warmup_s:.1f} s", flush=True)
    results = []
    rules: List[str] = []
    for kind in kinds:
        results.append(train.run(kind, cfg, manifest, rules))
        if kind == "baseline":
            rules = [f.rule for f in results[0].profiler.advice(results[0].summary)]
        results[-1].profiler.export_chrome_trace(os.path.join(out, f"trace_{kind}.json"))
    total_s = time.perf_counter() - t_start
    text = report.table(results, cfg)
    print()
    print(text)
    print()
    print(
        "The doctor on the baseline run (torchspeed.profile, the same report as `torchspeed doctor`):"
    )
    print(results[0].report)
    rec = report.record(
        results, cfg, manifest, total_s, argv if argv is not None else sys.argv[1:], warmup_s
    )
    atomic_write(os.path.join(out, "summary.json"), json.dumps(rec, indent=1), who=_WHO)
    atomic_write(
        os.path.join(out, "report.txt"),
        text + "\n\nThe doctor on the baseline run:\n" + results[0].report + "\n",
        who=_WHO,
    )
    png = report.write_png(results, os.path.join(out, "demo.png"))
    print()
    print(
        f"results written to {out}: summary.json, report.txt, "
        + ("demo.png, " if png else "(no demo.png: matplotlib is not installed), ")
        + ", ".join(f"trace_{k}.json" for k in kinds)
        + f"; total {total_s:.1f} s"
    )
    return 0
