"""The int8 Linear's CUDA kernels (csrc/kernels/cuda/quant_int8_linear.cu: quantize_rows_int8 and the
mma.sync int8 GEMM with its fused epilogue), through ``torch.ops.torchspeed.int8_linear`` on CUDA
(the weight passed as the int8 [N, K] tensor itself), bit for bit against the contract of
kernels/cuda/api.cuh computed here with an int64 matmul: odd shapes (M, N, K = 1, tile edges, K
not a multiple of 16: the unaligned loader), extreme values (all +-127, K = 65536: int32 exact),
every output dtype, bias and ReLU, a row of zeros and a row with inf. Skipped without CUDA or
without the op."""

from __future__ import annotations

import pytest
import torch

pytestmark = [
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
    pytest.mark.skipif(
        not hasattr(torch.ops.torchspeed, "int8_linear"),
        reason="torch.ops.torchspeed.int8_linear (the op glue) is not in this build",
    ),
]


def quantize_rows(x):
    """api.cuh: absmax per row (fp32), scale = absmax / 127 (1 for a zero row, NaN with inf/NaN),
    q = clamp(round_half_even(x * (1 / scale)), -127, 127)."""
    v = x.float()
    absmax = v.abs().amax(dim=1)
    scale = torch.where(absmax == 0, torch.ones_like(absmax), absmax / 127.0)
    scale = torch.where(torch.isfinite(v).all(dim=1), scale, torch.full_like(scale, float("nan")))
    q = torch.clamp(torch.round(v * (1.0 / scale)[:, None]), -127, 127)
    q = torch.nan_to_num(q, nan=0.0).to(torch.int8)
    return q, scale


def reference(x, w, w_scale, bias, relu, out_dtype):
    q, a_scale = quantize_rows(x)
    acc = q.long() @ w.long().t()  # exact
    assert acc.abs().max().item() < 2**31
    out = acc.to(torch.int32).float() * (a_scale[:, None] * w_scale[None, :])
    if bias is not None:
        out = out + bias[None, :]
    if relu:
        out = torch.where(out < 0, torch.zeros_like(out), out)
    return out.to(out_dtype)


def run(x, w, w_scale, bias, relu):
    try:
        out = torch.ops.torchspeed.int8_linear(
            x.cuda(), w.cuda(), w_scale.cuda(), None if bias is None else bias.cuda(), relu
        )
    except NotImplementedError as e:  # the CUDA kernel is not registered in this build
        pytest.skip(f"int8_linear has no CUDA kernel here: {e}")
    torch.cuda.synchronize()
    return out.cpu()


def rand_int8(*shape, gen):
    return torch.randint(-127, 128, shape, generator=gen, dtype=torch.int8)


SHAPES = [
    (1, 1, 1),
    (1, 4096, 4096),  # GEMV-like
    (3, 5, 7),  # everything unaligned
    (17, 129, 33),  # K % 16 != 0: guarded byte loader
    (128, 128, 64),  # exactly one tile
    (129, 257, 65),  # one past every tile edge
    (300, 200, 1024),  # several K tiles, aligned cp.async path
    (64, 48, 4000),
]


@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize(
    "dtype", [torch.float32, torch.bfloat16, torch.float16], ids=["fp32", "bf16", "fp16"]
)
def test_int8_linear_cuda_equals_the_int64_reference(shape, dtype):
    m, n, k = shape
    gen = torch.Generator().manual_seed(m * 7 + n + k)
    x = (torch.randn(m, k, generator=gen) * 3).to(dtype)
    w = rand_int8(n, k, gen=gen)
    w_scale = torch.rand(n, generator=gen) * 0.01 + 1e-4
    bias = torch.randn(n, generator=gen)
    for b, relu in ((bias, True), (None, False)):
        out = run(x, w, w_scale, b, relu)
        want = reference(x, w, w_scale, b, relu, dtype)
        assert out.dtype == dtype and out.shape == (m, n)
        torch.testing.assert_close(out, want, rtol=0, atol=0, equal_nan=True)


def test_int8_linear_cuda_extremes_are_exact_in_int32():
    k = 65536
    x = torch.full((3, k), 5.0)
    x[1] = -5.0
    x[2, ::2] = -5.0  # alternating signs: the sum cancels exactly
    w = torch.full((130, k), 127, dtype=torch.int8)
    w[1::2] = -127
    w_scale = torch.full((130,), 1e-6)
    out = run(x, w, w_scale, None, False)
    want = reference(x, w, w_scale, None, False, torch.float32)
    torch.testing.assert_close(out, want, rtol=0, atol=0)


def test_int8_linear_cuda_zero_row_and_nonfinite_row():
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(4, 96, generator=gen)
    x[1] = 0.0
    x[2, 5] = float("inf")
    w = rand_int8(40, 96, gen=gen)
    w_scale = torch.rand(40, generator=gen) * 0.01
    bias = torch.randn(40, generator=gen)
    out = run(x, w, w_scale, bias, False)
    torch.testing.assert_close(out[1], bias, rtol=0, atol=0)  # zero row: scale 1, acc 0
    assert torch.isnan(out[2]).all()  # a row holding inf has a NaN scale
    want = reference(x, w, w_scale, bias, False, torch.float32)
    torch.testing.assert_close(out[[0, 3]], want[[0, 3]], rtol=0, atol=0)
