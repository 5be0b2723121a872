"""The int8 Linear's CUDA kernels (csrc/kernels/cuda/quant_int8_linear.cu) against bf16 on the GPU, side
by side in one process: ``torch.ops.torchspeed.int8_linear`` (per-row activation quantization +
the mma.sync int8 GEMM with its fused epilogue, bf16 in and out, the int8 [N, K] weight) vs
``torch.matmul`` in bf16 (cuBLAS) and, as the int8 anchor, ``torch._int_mm`` followed by the
scaling in separate kernels. Compute-bound at M = N = K = 8192 (goal: >= 1.6x bf16; ceiling 2x).
Skipped (exit 0, with the reason) without CUDA or without the op.

    torchspeed bench int8_gemm_cuda [--quick] [--device cuda]
"""

from __future__ import annotations

import argparse
from typing import Optional, Sequence

import torch

from torchspeed.benchmarks.harness import Harness


def _rows(h: Harness, op, n: int, dev: str) -> None:
    """One M = N = K = n group: bf16 cuBLAS (the anchor), torch._int_mm + scaling, torchspeed."""
    m = k = n
    x = torch.randn(m, k, device=dev, dtype=torch.bfloat16)
    w = torch.randn(n, k, device=dev, dtype=torch.bfloat16)
    wq = torch.randint(-127, 128, (n, k), device=dev, dtype=torch.int8)
    ws = torch.rand(n, device=dev) * 0.01
    xq = torch.randint(-127, 128, (m, k), device=dev, dtype=torch.int8)
    xs = torch.rand(m, device=dev) * 0.01
    flops = 2.0 * m * n * k
    group = f"GEMM {m}x{n}x{k}"
    h.add(group, "torch.matmul bf16 (cuBLAS)", lambda: x @ w.t(), anchor=True, flops=flops)
    if hasattr(torch, "_int_mm"):

        def int_mm_scaled():
            acc = torch._int_mm(xq, wq.t())
            return (acc.float() * (xs[:, None] * ws[None, :])).to(torch.bfloat16)

        # not an anchor: the speedup column is against bf16; its TFLOP/s are printed below
        h.add(group, "torch._int_mm + separate scaling", int_mm_scaled, flops=flops)
    h.add(
        group,
        "torchspeed int8_linear (quantize rows + int8 mma + epilogue)",
        lambda: op(x, wq, ws, None, False),
        flops=flops,
    )


def main(argv: Optional[Sequence[str]] = None) -> int:
    ap = argparse.ArgumentParser(
        prog="torchspeed bench int8_gemm_cuda", description=__doc__.splitlines()[0]
    )
    ap.add_argument("--quick", action="store_true", help="M = N = K = 4096 only")
    ap.add_argument("--device", default="cuda")
    args = ap.parse_args(list(argv) if argv is not None else None)
    if not (args.device.startswith("cuda") and torch.cuda.is_available()):
        print("bench int8_gemm_cuda: skipped (needs a CUDA device)")
        return 0
    op = getattr(torch.ops.torchspeed, "int8_linear", None)
    if op is None:
        print("bench int8_gemm_cuda: skipped (torch.ops.torchspeed.int8_linear is not built)")
        return 0
    dev = args.device
    h = Harness(
        "bench_int8_gemm_cuda",
        "torchspeed bench int8_gemm_cuda " + " ".join(argv or []),
        device=dev,
    )
    for n in [4096] if args.quick else [4096, 8192]:
        _rows(h, op, n, dev)
    for row in h.rows:
        row["tflops"] = row["flops"] / row["median_s"] / 1e12
    h.finish()
    for row in h.rows:
        print(f"{row['group']:<22} {row['label']:<60} {row['tflops']:8.1f} TFLOP/s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
