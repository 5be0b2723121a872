"""Shared pytest fixtures: run a test once per CPU ISA this machine can execute (`cpu_isa`), or
once per device, the CPU once per ISA and CUDA (`device`), as extension-cpp's
_test_correctness(device) does. What this machine lacks is skipped with the reason."""

import pytest
import torch

import torchspeed

_ORDER = ["scalar", "avx2", "avx512"]


def runnable_isas():
    compiled = torchspeed._C.cpu_isas_compiled().split(",")
    best = _ORDER.index(torchspeed._C.cpu_isa_detected())
    return [isa for isa in _ORDER if isa in compiled and _ORDER.index(isa) <= best]


def pytest_report_header(config):
    return (
        f"torchspeed {torchspeed.__version__}, torch {torch.__version__}, CPU ISAs run: "
        f"{', '.join(runnable_isas())} (compiled: {torchspeed._C.cpu_isas_compiled()})"
    )


def cuda_skip_reason():
    """Why the CUDA variant of a test cannot run here, or None."""
    if not torch.cuda.is_available():
        return "needs a CUDA device"
    if not getattr(torchspeed._C, "with_cuda", False):
        return "torchspeed built without CUDA"
    return None


@pytest.fixture(params=_ORDER)
def cpu_isa(request, monkeypatch):
    """Forces TORCHSPEED_CPU_ISA for the test; an ISA this CPU or build lacks is skipped with the
    reason (never counted as a pass)."""
    return _force_isa(request.param, monkeypatch)


@pytest.fixture(params=[f"cpu-{isa}" for isa in _ORDER] + ["cuda"])
def device(request, monkeypatch):
    """The device the test runs on: "cpu" (once per ISA, TORCHSPEED_CPU_ISA forced) or "cuda"."""
    if request.param == "cuda":
        reason = cuda_skip_reason()
        if reason:
            pytest.skip(reason)
        return "cuda"
    _force_isa(request.param.split("-", 1)[1], monkeypatch)
    return "cpu"


def _force_isa(isa, monkeypatch):
    if isa not in runnable_isas():
        pytest.skip(
            f"CPU ISA {isa} not runnable here (compiled: "
            f"{torchspeed._C.cpu_isas_compiled()}, CPU: {torchspeed._C.cpu_isa_detected()})"
        )
    monkeypatch.setenv("TORCHSPEED_CPU_ISA", isa)
    assert torchspeed.cpu_isa() == isa
    return isa
