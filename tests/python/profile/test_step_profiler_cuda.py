"""The step profiler's CUDA-event timeline on a real GPU: kernels of known duration
(torch.cuda._sleep, calibrated here) are charged to the phase that launched them even when a
later phase waits for them; no synchronization inside a step (set_sync_debug_mode("error"));
host-to-device copies seen by the hooks; NVTX mirroring. Skipped without a CUDA device or a CUDA
build (the same timeline logic runs on a simulated GPU in test_profile.py)."""

import time

import pytest
import torch
from profile_helpers import assert_phases

import torchspeed
import torchspeed.profile as tsp

pytestmark = [
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
    pytest.mark.skipif(
        not getattr(torchspeed._C, "with_cuda", False), reason="torchspeed built without CUDA"
    ),
]


@pytest.fixture(scope="module")
def cycles_per_ms():
    """torch.cuda._sleep cycles per millisecond on this GPU, measured with events."""
    torch.cuda.synchronize()
    n = 10_000_000
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda._sleep(n)  # warm
    a.record()
    torch.cuda._sleep(n)
    b.record()
    b.synchronize()
    return n / a.elapsed_time(b)


def gpu_sleep(ms, cycles_per_ms):
    torch.cuda._sleep(int(ms * cycles_per_ms))


def test_queued_kernels_are_charged_to_the_phase_that_launched_them(cycles_per_ms):
    prof = tsp.StepProfiler(device="cuda", warmup=0)
    with prof:
        for _ in range(8):
            with tsp.phase("data_wait"):
                time.sleep(0.003)  # the GPU has drained: 3 ms exposed
            with tsp.phase("forward"):
                gpu_sleep(12, cycles_per_ms)
            with tsp.phase("backward"):
                gpu_sleep(6, cycles_per_ms)
            with tsp.phase("optimizer"):
                gpu_sleep(2, cycles_per_ms)
                torch.cuda.synchronize()  # loss.item(): a host timer charges ~20 ms here
            prof.step()
    h = prof.history()
    assert h.clock == "cuda" and len(h) == 8
    assert_phases(h, {"forward": 12e6, "backward": 6e6, "optimizer": 2e6, "data_wait": 3e6})


def test_no_synchronization_inside_the_step(cycles_per_ms):
    prof = tsp.StepProfiler(device="cuda", warmup=0)
    x = torch.randn(1024, 1024, device="cuda")
    prof.start()
    torch.cuda.set_sync_debug_mode("error")
    try:
        for _ in range(20):
            with tsp.phase("forward"):
                y = x @ x
            with tsp.phase("backward"):
                gpu_sleep(1, cycles_per_ms)
                y.add_(1)
            prof.step()
    finally:
        torch.cuda.set_sync_debug_mode(0)
    prof.stop()  # the one synchronization: after the last step
    assert len(prof.history()) == 20


def test_hooks_time_and_count_host_to_device_copies():
    model = torch.nn.Linear(256, 256).cuda()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    pageable = torch.randn(4096, 256)
    pinned = torch.randn(4096, 256).pin_memory()
    prof = tsp.StepProfiler(hooks=True, step_on="optimizer", device="cuda")
    with prof:
        for i in range(6):
            x = pageable.to("cuda") if i % 2 else pinned.to("cuda", non_blocking=True)
            model(x).sum().backward()
            opt.step()
            opt.zero_grad()
    f = prof.facts()
    assert f.device_type == "cuda"
    assert f.counters.get("h2d_pageable") == 3 and f.counters.get("h2d_blocking") == 3
    assert sum(prof.history().phase_ns["h2d"]) > 0


def test_nvtx_mirror_runs():
    assert torchspeed._C.profile.nvtx_available()
    prof = tsp.StepProfiler(device="cuda", nvtx=True, warmup=0)
    with prof:
        for _ in range(3):
            with tsp.range("nvtx.range"), tsp.phase("forward"):
                torch.ones(8, device="cuda").sum()
            prof.step()
    assert prof.steps == 3
