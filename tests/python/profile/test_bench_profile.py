"""The profile benchmark's pieces (torchspeed.benchmarks.profile): its C floor probe ships as
floor.c beside the module and runs, and its table prints every row."""

import os
import platform
import shutil

import pytest

from torchspeed.benchmarks.profile import floor, table


def test_floor_c_ships_with_the_package_and_runs():
    assert os.path.isfile(floor._FLOOR_C)
    if platform.machine() not in ("x86_64", "AMD64") or not shutil.which("cc"):
        pytest.skip("the probe reads the x86 TSC and needs cc")
    got = floor.floor_probe(1, 20_000)
    for what in ("empty", "rdtsc", "clock_gettime", "gate", "scope"):
        assert got[what]["median_ns"] >= 0, got
    assert got["scope"]["median_ns"] >= got["empty"]["median_ns"]


def test_table_rows_and_format():
    t = table.Table()
    t.add("1. C++ range", "TORCHSPEED_RANGE, profiling off", 1.234, "ns/range", iqr=0.1, note="x")
    t.add("2. Python range", "with tsp.range", 250.0, "ns")
    text = t.format("# header")
    assert text.splitlines()[0] == "# header" and " 1.23 " in text and "250.0" in text
    assert table.verdict(1.0, 2.0) == "met" and table.verdict(3.0, 2.0) == "MISSED"
