"""scale_cast_ on CUDA: the kernel equals the CPU kernel bit for bit (skipped without a GPU)."""

from __future__ import annotations

import pytest
import torch
from support import cuda_skip_reason
from dist_helpers import DIST_MISSING, PAIRS

import torchspeed

pytestmark = pytest.mark.skipif(DIST_MISSING is not None, reason=str(DIST_MISSING))


@pytest.mark.parametrize("src_dtype,out_dtype", PAIRS, ids=lambda d: str(d).split(".")[-1])
def test_scale_cast_cuda_kernel_equals_the_cpu_kernel(src_dtype, out_dtype):
    reason = cuda_skip_reason()
    if reason:
        pytest.skip(reason)
    src = (torch.randn(100_003, dtype=torch.float64) * 30).to(src_dtype)
    cpu = torch.empty(src.numel(), dtype=out_dtype)
    gpu = torch.empty(src.numel(), dtype=out_dtype, device="cuda")
    torchspeed.ops.scale_cast_(cpu, src, 0.125)
    torchspeed.ops.scale_cast_(gpu, src.cuda(), 0.125)
    torch.testing.assert_close(gpu.cpu(), cpu, rtol=0, atol=0)
