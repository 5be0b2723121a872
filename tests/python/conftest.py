"""Shared pytest fixtures: run a test once per CPU ISA this machine can execute."""

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


@pytest.fixture(params=_ORDER)
def cpu_isa(request, monkeypatch):
    """Forces TORCHSPEED_CPU_ISA for the test; an ISA this CPU or build lacks is skipped with the
    reason (never counted as a pass)."""
    isa = request.param
    if isa not in runnable_isas():
        pytest.skip(
            f"CPU ISA {isa} not runnable here (compiled: "
            f"{torchspeed._C.cpu_isas_compiled()}, CPU: {torchspeed._C.cpu_isa_detected()})"
        )
    monkeypatch.setenv("TORCHSPEED_CPU_ISA", isa)
    assert torchspeed.cpu_isa() == isa
    return isa
