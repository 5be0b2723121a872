"""What the CUDA sections of test_lowbit.py (Adam) and test_lowbit_one_moment.py (Lion, SGD)
share: the skip marks, the "CUDA" device (TORCHSPEED_CUDA_TESTS_ON_CPU=1 runs that side on the
CPU: a dry run of the test code, proving nothing about the kernels), the gradients of one call
(an inf and a NaN in the first tensor), copies with the same strides, and bitwise comparison."""

from __future__ import annotations

import os

import pytest
import torch

import torchspeed

CUDA_ON_CPU = os.environ.get("TORCHSPEED_CUDA_TESTS_ON_CPU") == "1"
CUDA = "cpu" if CUDA_ON_CPU else "cuda"


def _cuda_skip_reason():
    if CUDA_ON_CPU:
        return None
    if not torch.cuda.is_available():
        return "needs a CUDA device"
    if not getattr(torchspeed._C, "with_cuda", False):
        return "torchspeed built without CUDA"
    return None


needs_cuda = pytest.mark.skipif(_cuda_skip_reason() is not None, reason=str(_cuda_skip_reason()))
needs_real_cuda = pytest.mark.skipif(CUDA_ON_CPU, reason="needs a CUDA device (CPU dry run)")


def bits(t):
    """The bytes of t's elements (a NaN equals the same NaN, unlike torch.equal)."""
    return t.detach().cpu().reshape(-1).contiguous().view(torch.uint8)


def call_grads(d, seed):
    """Gradients for the call `d` (its "params"): an inf at element 5 of the first tensor (an int8
    block with an infinite moment: absmax inf, codes 0) and a NaN at element 70000 (the last
    chunk's short block: NaN skipped by the absmax)."""
    g = torch.Generator().manual_seed(seed)
    grads = [torch.randn(p.shape, generator=g).to(p.dtype) * 0.1 for p in d["params"]]
    grads[0][5] = float("inf")
    grads[0][70000] = float("nan")
    return grads


def to_device(d, device):
    """A copy of the call's tensors on `device`, with the same strides."""
    return {
        k: [
            torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device=device).copy_(t)
            for t in ts
        ]
        for k, ts in d.items()
    }


def assert_same_bits(cpu, dev, where):
    for key in cpu:
        for i, (a, b) in enumerate(zip(cpu[key], dev[key])):
            assert torch.equal(bits(a), bits(b)), f"{where}: {key}[{i}] differs"
