"""The 2:4 export to torch's semi-structured sparse format (prune/semi_structured.py): the reason
reported on CPU, the matmul on CUDA (skipped with the reason without one)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.utils.prune  # noqa: F401 (the reference: torch.nn.utils.prune)
from torch import nn
from torch.testing import assert_close

import torchspeed.prune as prune

pytestmark = pytest.mark.skipif(
    not hasattr(torch.ops.torchspeed, "nm_mask"), reason="built without the prune area"
)


def test_to_semi_structured_reports_reason_on_cpu():
    lin = nn.Linear(64, 64)
    prune.nm_sparse(lin, "weight", n=2, m=4)
    report = prune.to_semi_structured(lin)
    assert "CUDA" in report["<root>"] and isinstance(lin.weight, nn.Parameter)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="semi-structured sparsity needs CUDA")
def test_to_semi_structured_matmul_cuda():
    if torch.cuda.get_device_capability()[0] < 8:
        pytest.skip("semi-structured sparsity needs sm80+")
    lin = nn.Linear(256, 128).half().cuda()
    prune.nm_sparse(lin, "weight", n=2, m=4)
    x = torch.randn(64, 256, dtype=torch.half, device="cuda")
    dense = lin(x)
    report = prune.to_semi_structured(lin)
    assert report["<root>"] == "converted", report
    assert_close(lin(x), dense, rtol=1e-2, atol=1e-2)
