"""Shared pytest fixtures: run a test once per CPU ISA this machine can execute (`cpu_isa`), or
once per device, the CPU once per ISA and CUDA (`device`), as extension-cpp's
_test_correctness(device) does. What this machine lacks is skipped with the reason."""

import pytest
import torch
from support import _ALL, _ORDER, INT8_PATHS, cuda_skip_reason, runnable_isas  # noqa: F401

import torchspeed


def pytest_report_header(config):
    return (
        f"torchspeed {torchspeed.__version__}, torch {torch.__version__}, CPU ISAs run: "
        f"{', '.join(runnable_isas())} (compiled: {torchspeed._C.cpu_isas_compiled()})"
    )


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


@pytest.fixture(params=list(INT8_PATHS))
def int8_path(request, monkeypatch):
    """Forces each ISA level for the int8 Linear's tests and returns its int8 path's name;
    skipped with the reason where this CPU or build cannot run it."""
    _force_isa(request.param, monkeypatch)
    assert torchspeed._C.cpu_int8_path() == INT8_PATHS[request.param]
    return INT8_PATHS[request.param]


def _force_isa(isa, monkeypatch):
    if isa not in runnable_isas():
        amx = torchspeed._C.cpu_amx_status() if hasattr(torchspeed._C, "cpu_amx_status") else ""
        pytest.skip(
            f"CPU ISA {isa} not runnable here (compiled: "
            f"{torchspeed._C.cpu_isas_compiled()}, CPU: {torchspeed._C.cpu_isa_detected()})"
            + (f"; amx: {amx}" if isa == "amx" and amx else "")
        )
    monkeypatch.setenv("TORCHSPEED_CPU_ISA", isa)
    assert torchspeed.cpu_isa() == isa
    return isa
