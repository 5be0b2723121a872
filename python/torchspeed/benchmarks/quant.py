"""int8 quantize / dequantize (torchspeed.quant) against what a PyTorch user would write instead,
side by side in one process: the torch reference formula (torchao's quantize_affine:
``clamp(round(x * (1 / scale)) + zp, -128, 127).to(int8)``), and torch's own
``torch.quantize_per_tensor`` / ``quantize_per_channel`` (+ ``int_repr``, what torch.ao uses).

Both are memory-bound: quantize reads 4 bytes and writes 1 per element (5 B), dequantize reads 1
and writes 4 (5 B); the table reports GB/s and the fraction of the measured STREAM triad.

Fake-quant forward + backward (QAT): ``torchspeed.quant.fake_quantize`` (one pass writing y and
the bool mask, then ``grad * mask``) against ``torch.fake_quantize_per_{tensor,channel}_affine``
with autograd, per tensor and per channel, fp32. Bytes counted as the fused minimum: forward reads
x and writes y and the mask (9 B), backward reads grad and mask and writes grad_x (9 B): 18 B.

    torchspeed bench quant [--quick] [--device cpu|cuda] [--fake-quant-only]
"""

from __future__ import annotations

import argparse
from typing import Optional, Sequence

import torch

from torchspeed.benchmarks.harness import Harness
from torchspeed.quant import choose_qparams, dequantize_int8, quantize_int8


def _reference_quantize(x, scale, zp):
    s = scale.reshape(-1, 1) if scale.numel() > 1 else scale
    z = zp.reshape(-1, 1) if zp.numel() > 1 else zp
    return torch.clamp(torch.round(x * (1.0 / s)) + z, -128, 127).to(torch.int8)


def _reference_dequantize(q, scale, zp):
    s = scale.reshape(-1, 1) if scale.numel() > 1 else scale
    z = zp.reshape(-1, 1) if zp.numel() > 1 else zp
    return (q.float() - z) * s


def _rows(h: Harness, x: torch.Tensor, gran: str, dev: str) -> None:
    """One granularity's quantize and dequantize groups (each timed inside h.add)."""
    n, (rows, cols) = x.numel(), x.shape
    scale, zp = choose_qparams(x, gran, symmetric=False)
    group = f"quantize {gran} {rows}x{cols}"
    h.add(
        group,
        "torch reference formula",
        lambda: _reference_quantize(x, scale, zp),
        bytes_moved=5 * n,
        anchor=True,
    )
    if dev == "cpu":
        if gran == "per_tensor":
            s, z = scale.item(), int(zp.item())

            def torch_q():
                return torch.quantize_per_tensor(x, s, z, torch.qint8).int_repr()
        else:
            s64, z64 = scale.double(), zp.long()

            def torch_q():
                return torch.quantize_per_channel(x, s64, z64, 0, torch.qint8).int_repr()

        h.add(group, "torch.quantize_per_* + int_repr", torch_q, bytes_moved=5 * n, anchor=True)
    h.add(
        group,
        "torchspeed.quant.quantize_int8",
        lambda: quantize_int8(x, scale, zp),
        bytes_moved=5 * n,
    )
    q = quantize_int8(x, scale, zp)
    group = f"dequantize {gran} {rows}x{cols}"
    h.add(
        group,
        "torch reference formula",
        lambda: _reference_dequantize(q, scale, zp),
        bytes_moved=5 * n,
        anchor=True,
    )
    h.add(
        group,
        "torchspeed.quant.dequantize_int8",
        lambda: dequantize_int8(q, scale, zp),
        bytes_moved=5 * n,
    )


def _fake_quant_rows(h: Harness, x: torch.Tensor, gran: str) -> None:
    """fwd + bwd of fake-quant: torch's op + autograd (the anchor) vs torchspeed's."""
    from torchspeed.quant import fake_quantize

    n, (rows, cols) = x.numel(), x.shape
    scale, zp = choose_qparams(x, gran, symmetric=False)
    xg = x.detach().clone().requires_grad_()
    grad = torch.randn_like(x)
    if gran == "per_tensor":
        s, z = scale.item(), int(zp.item())

        def torch_fq():
            return torch.fake_quantize_per_tensor_affine(xg, s, z, -128, 127)
    else:

        def torch_fq():
            return torch.fake_quantize_per_channel_affine(xg, scale, zp, 0, -128, 127)

    def ours_fq():
        return fake_quantize(xg, scale, zp)

    group = f"fake-quant fwd+bwd {gran} {rows}x{cols}"
    for name, fq, anchor in (
        (f"torch.fake_quantize_{gran}_affine + autograd", torch_fq, True),
        ("torchspeed.quant.fake_quantize + autograd", ours_fq, False),
    ):
        h.add(
            group,
            name,
            lambda fq=fq: torch.autograd.grad(fq(), xg, grad),
            bytes_moved=18 * n,
            anchor=anchor,
            repeats=11,
        )


def main(argv: Optional[Sequence[str]] = None) -> int:
    ap = argparse.ArgumentParser(prog="torchspeed bench quant", description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="small sizes (a smoke run)")
    ap.add_argument("--device", default="cpu")
    ap.add_argument(
        "--fake-quant-only", action="store_true", help="only the fake-quant fwd+bwd groups"
    )
    args = ap.parse_args(list(argv) if argv is not None else None)
    dev = args.device
    shapes = [(4096, 4096)] if args.quick else [(4096, 4096), (8192, 8192)]
    h = Harness("bench_quant", "torchspeed bench quant " + " ".join(argv or []), device=dev)
    if not args.fake_quant_only:
        for rows, cols in shapes:
            x = torch.randn(rows, cols, device=dev)
            for gran in ("per_tensor", "per_channel"):
                _rows(h, x, gran, dev)
    for rows, cols in [(2048, 4096)] if args.quick else [(4096, 4096)]:
        x = torch.randn(rows, cols, device=dev)
        for gran in ("per_tensor", "per_channel"):
            _fake_quant_rows(h, x, gran)
    h.finish()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
