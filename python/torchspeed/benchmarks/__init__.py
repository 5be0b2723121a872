"""torchspeed's benchmarks, shipped with the package: each measures torchspeed against the anchor a
PyTorch user would pick instead (torch fused AdamW, torch._foreach_norm, torch's DataLoader, torch DDP) side
by side in one process, prints a table and writes a JSON to :func:`harness.results_dir`
($TORCHSPEED_RESULTS_DIR, else ./torchspeed_results).

    torchspeed bench optim --quick        # or: python -m torchspeed.benchmarks optim --quick
    torchspeed bench all [--full]         # every benchmark, in its quick size unless --full
    torchspeed.benchmarks.run("grad_stats", ["--quick"])

`bench/bench_<name>.py` in the source tree are shims that run the same code.
"""

from __future__ import annotations

import importlib
from typing import Optional, Sequence

from .._native import AreaNotBuiltError

# name -> (module, what it measures)
BENCHMARKS = {
    "optim": ("optim", "fused optimizer step vs torch.optim.AdamW (for-loop, foreach, fused)"),
    "grad_stats": ("grad_stats", "global/per-tensor norms + inf check vs torch._foreach_norm"),
    "loader": ("loader", "JPEG loader vs torch DataLoader + PIL (needs Pillow)"),
    "loader_gpu": ("loader_gpu", "H2D copy hidden behind compute, sync-free next() (CUDA)"),
    "profile": ("profile", "profiler ranges + always-on step overhead vs torch.profiler"),
    "quant": ("quant", "int8 quantize/dequantize vs torch's formula and torch.quantize_per_*"),
    "int8_linear": ("int8_linear", "Int8Linear vs fp32 nn.Linear vs torch.ao dynamic int8 Linear"),
    "int8_gemm_cuda": (
        "int8_gemm_cuda",
        "int8 Linear CUDA kernels vs bf16 matmul and torch._int_mm",
    ),
    "prune": ("prune", "packed pruning masks: apply vs memcpy, build vs torch.nn.utils.prune"),
    "ddp": ("ddp", "AccumulatingDDP vs torch DDP + no_sync vs no communication (2 Gloo ranks)"),
    "lowbit_training": (
        "lowbit_training",
        "training loss with bf16/int8 optimizer states vs torch's fp32 AdamW / SGD (curves, PNG)",
    ),
}
# What each benchmark needs beyond torch: pip install torchspeed[bench].
_EXTRAS = {"loader": ("PIL", "numpy")}


def run(name: str, argv: Optional[Sequence[str]] = None) -> int:
    """Runs benchmark `name` with command-line arguments `argv`; returns its exit status."""
    if name not in BENCHMARKS:
        raise ValueError(
            f"torchspeed.benchmarks.run: name must be one of {', '.join(BENCHMARKS)}, got {name!r}"
        )
    for module in _EXTRAS.get(name, ()):
        try:
            importlib.import_module(module)
        except ImportError:
            raise SystemExit(
                f"torchspeed bench {name}: needs {module} (pip install 'torchspeed[bench]')"
            ) from None
    mod = importlib.import_module(f"{__name__}.{BENCHMARKS[name][0]}")
    return int(mod.main(list(argv) if argv is not None else []) or 0)


def run_all(argv: Optional[Sequence[str]] = None) -> int:
    """Runs every benchmark of BENCHMARKS in turn (``torchspeed bench all``), each with ``--quick``
    unless ``argv`` holds ``--full``; the rest of ``argv`` goes to every one. A benchmark whose
    device, area or extra package is missing says so and is skipped. Returns the OR of the exit
    statuses."""
    argv = list(argv or [])
    quick = [] if "--full" in argv else ["--quick"]
    argv = [a for a in argv if a != "--full"]
    print(f"torchspeed bench all: {', '.join(BENCHMARKS)} (each against its torch anchor)\n")
    status = 0
    for i, name in enumerate(BENCHMARKS):
        if i:
            print()
        print(f"=== torchspeed bench {name} {' '.join(quick + argv)}".rstrip(), flush=True)
        try:
            status |= run(name, quick + argv)
        except AreaNotBuiltError as e:  # this build left the benchmark's area out
            print(f"skipped: {e}")
        except SystemExit as e:  # a missing extra package (run's message) or an argparse error
            if isinstance(e.code, str):
                print(f"skipped: {e.code}")
            else:
                status |= int(e.code or 0)
    return status
