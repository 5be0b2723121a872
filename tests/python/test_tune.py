"""torchspeed.tune.max_batch_size: the true limit of a synthetic memory model within its try
budget, an RSS limit on the CPU, and only real out-of-memory errors counted as "does not fit"."""

from __future__ import annotations

import math

import pytest
import torch

from torchspeed.tune import max_batch_size


@pytest.mark.parametrize(
    "true_limit,start,limit",
    [(37, 1, None), (1, 1, None), (64, 4, None), (1000, 3, 200), (500, 8, 4096)],
)
def test_batch_finder_returns_the_true_limit_of_a_synthetic_memory_model(true_limit, start, limit):
    tries = []

    def step(bs):
        tries.append(bs)
        if bs > true_limit:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")

    got = max_batch_size(step, start=start, limit=limit)
    want = min(true_limit, limit) if limit else true_limit
    assert got == want, tries
    assert len(tries) <= 2 * math.ceil(math.log2(max(want, 2))) + 3, tries


def test_batch_finder_errors():
    with pytest.raises(RuntimeError, match="even start=4 does not fit"):
        max_batch_size(lambda bs: (_ for _ in ()).throw(MemoryError()), start=4)
    with pytest.raises(ValueError, match="boom"):
        max_batch_size(lambda bs: (_ for _ in ()).throw(ValueError("boom")))
    with pytest.raises(ValueError, match="limit must be an int >= start"):
        max_batch_size(lambda bs: None, start=8, limit=4)


def test_batch_finder_against_an_rss_limit_on_the_cpu():
    from torchspeed.tune import _reset_peak_rss, peak_rss_bytes

    # The mark reset first, so the base is this process's RSS now, not an earlier test's peak.
    assert _reset_peak_rss()
    base = peak_rss_bytes()
    mib = 1 << 20

    def step(bs):  # bs MiB, touched
        x = torch.ones(bs * mib // 4)
        del x

    got = max_batch_size(step, start=8, limit=1024, rss_limit_bytes=base + 200 * mib)
    # At most 200 MiB (plus the 8 MiB the search cannot resolve) above the base; at least a
    # good part of it (the allocator's, Python's and other threads' pages take some, more in a
    # long test session).
    assert 64 <= got <= 208, got


@pytest.mark.parametrize(
    "error",
    [
        RuntimeError("index out of memory map range"),
        RuntimeError("CUDA out of memory. (a message, not torch.OutOfMemoryError)"),
        RuntimeError("cannot allocate memory for the pinned pool: not really"),
        OSError(12, "Cannot allocate memory"),
    ],
)
def test_only_real_out_of_memory_errors_are_swallowed(error):
    """Issue 23 item 10: any RuntimeError whose text mentioned "out of memory" counted as OOM."""

    def step(bs):
        if bs > 8:
            raise error

    with pytest.raises(type(error), match=str(error.args[-1])[:20]):
        max_batch_size(step, start=1)


def test_the_cpu_allocator_failure_and_memory_error_count_as_out_of_memory():
    """torch's CPU allocator raises a plain RuntimeError ("DefaultCPUAllocator: can't allocate
    memory"): a real allocation, refused by the allocator, counts; so does MemoryError."""

    def step(bs):
        if bs > 37:
            torch.empty(1 << 46, dtype=torch.uint8)  # 64 TiB: refused by the allocator
        if bs > 30:
            raise MemoryError()

    assert max_batch_size(step, start=1) == 30
    assert max_batch_size(lambda bs: bs <= 37 or torch.empty(1 << 46, dtype=torch.uint8)) == 37


@pytest.mark.parametrize(
    "kwargs,error,match",
    [
        (dict(start=1.5), TypeError, "start must be an int, got 1.5"),
        (dict(start=0), ValueError, "start must be an int >= 1, got 0"),
        (dict(limit="8"), TypeError, "limit must be an int, got '8'"),
        (dict(rss_limit_bytes=float("nan")), TypeError, "rss_limit_bytes must be an int"),
        (dict(rss_limit_bytes=0), ValueError, "rss_limit_bytes must be an int >= 1"),
        (dict(max_tries=0), ValueError, "max_tries must be an int >= 1"),
        (dict(verbose="yes"), TypeError, "verbose must be a bool"),
    ],
)
def test_batch_finder_argument_errors(kwargs, error, match):
    calls = []
    with pytest.raises(error, match=match):
        max_batch_size(calls.append, **kwargs)
    assert calls == []  # nothing ran
    with pytest.raises(TypeError, match="step_fn must be callable"):
        max_batch_size(None)
