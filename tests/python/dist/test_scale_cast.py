"""torchspeed.ops.scale_cast_, the reducer's bucket pass (torchspeed/dist/_ops.py): every ISA
against a torch reference (bit for bit), in place, opcheck, and bad input refused before writing."""

from __future__ import annotations

import pytest
import torch
from dist_helpers import DIST_MISSING, PAIRS, scale_cast_reference

import torchspeed

pytestmark = pytest.mark.skipif(DIST_MISSING is not None, reason=str(DIST_MISSING))


@pytest.mark.parametrize("src_dtype,out_dtype", PAIRS, ids=lambda d: str(d).split(".")[-1])
@pytest.mark.parametrize("n", [0, 1, 7, 8, 17, 33, 1000, 70000])
def test_scale_cast_matches_torch_bit_for_bit(device, src_dtype, out_dtype, n):
    g = torch.Generator().manual_seed(n)
    src = (torch.randn(n, generator=g, dtype=torch.float64) * 100).to(src_dtype).to(device)
    out = torch.empty(n, dtype=out_dtype, device=device)
    scale = 1.0 / 3.0
    torchspeed.ops.scale_cast_(out, src, scale)
    torch.testing.assert_close(out, scale_cast_reference(src, scale, out_dtype), rtol=0, atol=0)


def test_scale_cast_extremes_round_like_torch(device):
    src = torch.tensor(
        [0.0, -0.0, 1e-45, -3.4e38, 3.4e38, 65504.0, 65520.0, 1e-8, float("inf"), -float("inf")]
        + [1.0 + 2.0**-8, 1.0 + 3 * 2.0**-8, 1.0 + 2.0**-11],
        device=device,
    )
    for dtype in (torch.bfloat16, torch.float16):
        out = torch.empty(len(src), dtype=dtype, device=device)
        torchspeed.ops.scale_cast_(out, src, 1.0)
        torch.testing.assert_close(out, src.to(dtype), rtol=0, atol=0, equal_nan=True)
    nan = torch.full((9,), float("nan"), device=device)
    out = torch.empty(9, dtype=torch.bfloat16, device=device)
    torchspeed.ops.scale_cast_(out, nan, 0.5)
    assert out.float().isnan().all()


def test_scale_cast_in_place(device):
    x = torch.arange(100, dtype=torch.float32, device=device)
    torchspeed.ops.scale_cast_(x, x, 0.5)
    torch.testing.assert_close(x, torch.arange(100, dtype=torch.float32, device=device) * 0.5)


@pytest.mark.parametrize(
    "make,match",
    [
        (lambda: (torch.empty(4), torch.empty(5)), "out must have as many elements as src"),
        (
            lambda: (torch.empty(4, dtype=torch.float32), torch.empty(4, dtype=torch.float64)),
            "float64 -> float64",
        ),
        (lambda: (torch.empty(4, dtype=torch.int32), torch.empty(4)), "out must be float32"),
        (lambda: (torch.empty(4, 2).t(), torch.empty(8)), "out must be contiguous"),
        (lambda: (torch.empty(8), torch.empty(4, 2).t()), "src must be contiguous"),
        (lambda: (torch.empty(1).expand(4), torch.empty(4)), "out must be contiguous|overlap"),
    ],
)
def test_scale_cast_rejects_bad_input_before_writing(make, match):
    out, src = make()
    before = out.clone() if out.dtype.is_floating_point else None
    with pytest.raises(RuntimeError, match=match):
        torchspeed.ops.scale_cast_(out, src, 2.0)
    if before is not None and out.is_contiguous():
        assert torch.equal(out, before) or before.isnan().any()


def test_scale_cast_rejects_overlap_and_nonfinite_scale():
    buf = torch.zeros(16)
    with pytest.raises(RuntimeError, match="must be src itself or not overlap it"):
        torchspeed.ops.scale_cast_(buf[4:12], buf[0:8], 2.0)
    with pytest.raises(RuntimeError, match="scale must be finite"):
        torchspeed.ops.scale_cast_(buf, buf, float("inf"))
    with pytest.raises(RuntimeError, match="must be a dense"):
        torchspeed.ops.scale_cast_(torch.zeros(3).to_sparse(), torch.zeros(3), 1.0)


def test_scale_cast_opcheck():
    out = torch.empty(33, dtype=torch.bfloat16)
    src = torch.randn(33)
    torch.library.opcheck(torch.ops.torchspeed.scale_cast_.default, (out, src, 0.25))
