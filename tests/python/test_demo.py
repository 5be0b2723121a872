"""`torchspeed demo --quick` run as a user would after `pip install`: from an empty folder, against
the installed package (not the source tree), with its dataset cache in a temporary folder. Checks
the printed table, summary.json (finite, positive figures; accuracies in [0, 1]), demo.png and the
Chrome traces, then that the cached dataset is reused and a half-written one is rebuilt."""

import json
import math
import os
import subprocess
import sys

import pytest

torchspeed = pytest.importorskip("torchspeed")
pytest.importorskip("PIL")


def _run(args, cwd, **env):
    e = dict(os.environ)
    for k in ("TORCHSPEED_RESULTS_DIR", "TORCHSPEED_DEMO_DATA", "PYTHONPATH"):
        e.pop(k, None)
    e.update(env)
    return subprocess.run(
        [sys.executable, "-m", "torchspeed.cli", "demo", *args],
        cwd=cwd,
        env=e,
        capture_output=True,
        text=True,
        timeout=600,
    )


@pytest.fixture(scope="module")
def quick(tmp_path_factory):
    work = tmp_path_factory.mktemp("demo")
    cache = work / "cache"
    r = _run(
        ["--quick", "--no-progress", "--device", "cpu"],
        cwd=str(work),
        TORCHSPEED_DEMO_DATA=str(cache),
    )
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    return work, cache, r


def test_table_and_doctor_report_are_printed(quick):
    _, _, r = quick
    out = r.stdout
    for row in (
        "wall time, training (s)",
        "images/s",
        "step median (ms)",
        "data_wait",
        "forward",
        "final train loss",
        "held-out accuracy (%)",
        "speedup (torchspeed)",
    ):
        assert row in out, (row, out[-3000:])
    assert "PyTorch (DataLoader+PIL, torch AdamW)" in out and "torchspeed (native loader" in out
    assert "The doctor on the baseline run" in out and "phase" in out and "share" in out
    speed_line = next(line for line in out.splitlines() if line.startswith("images/s"))
    numbers = [float(x.replace(",", "")) for x in speed_line.split()[1:3]]
    assert all(math.isfinite(v) and v > 0 for v in numbers), speed_line
    assert speed_line.rstrip().endswith("x"), speed_line


def test_json_png_and_traces_hold_numbers(quick):
    work, _, _ = quick
    out = work / "torchspeed_results" / "demo"
    rec = json.loads((out / "summary.json").read_text())
    assert rec["config"]["steps"] == 12 and rec["config"]["batch_size"] == 32
    assert set(rec["runs"]) == {"baseline", "torchspeed"}
    for name, run in rec["runs"].items():
        assert run["steps"] == 12, name
        for key in (
            "wall_s",
            "images_per_s",
            "first_batch_s",
            "eval_s",
            "final_train_loss",
            "cpu_ms_per_image",
        ):
            assert math.isfinite(run[key]) and run[key] > 0, (name, key, run[key])
        assert 0.0 <= run["heldout_accuracy"] <= 1.0 and run["heldout_images"] == 160
        assert len(run["losses"]) == len(run["times_s"]) == 12
        assert all(math.isfinite(x) for x in run["losses"])
        assert run["times_s"] == sorted(run["times_s"])
        phases = run["summary"]["phases"]
        assert abs(sum(p["share"] for p in phases.values()) - 1.0) < 1e-6
        assert phases["forward"]["median_ms"] > 0 and phases["backward"]["median_ms"] > 0
        trace = json.loads((out / f"trace_{name}.json").read_text())
        assert trace["traceEvents"], name
    assert math.isfinite(rec["speedup_wall"]) and rec["speedup_wall"] > 0
    assert rec["machine"]["cores"] >= 1 and rec["dataset"]["train"] == 480
    assert "held-out accuracy" in (out / "report.txt").read_text()
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        assert not (out / "demo.png").exists()
    else:
        png = (out / "demo.png").read_bytes()
        assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 10_000


def test_cache_is_reused_and_a_half_written_one_rebuilt(quick, tmp_path):
    _, cache, _ = quick
    from torchspeed.demo import dataset

    m = dataset.prepare("quick", str(cache), progress=False)
    assert m["generated_s"] == 0.0 and len(m["train_urls"]) == 3 and len(m["val_urls"]) == 1
    # The same bytes from a fresh generation (deterministic), and a cache without its manifest
    # (a run killed before the end) is rebuilt rather than trusted.
    other = tmp_path / "other"
    m2 = dataset.prepare("quick", str(other), progress=False, workers=1)
    assert m2["generated_s"] > 0
    for a, b in zip(m["train_urls"] + m["val_urls"], m2["train_urls"] + m2["val_urls"]):
        assert open(a, "rb").read() == open(b, "rb").read(), (a, b)
    os.remove(os.path.join(m2["folder"], "manifest.json"))
    m3 = dataset.prepare("quick", str(other), progress=False, workers=1)
    assert m3["generated_s"] > 0 and os.path.exists(os.path.join(m3["folder"], "manifest.json"))
    assert not [p for p in os.listdir(other) if ".tmp-" in p]  # no staging folder left behind


def test_bad_options_are_usage_errors(tmp_path):
    r = _run(["--steps", "0"], cwd=str(tmp_path))
    assert r.returncode == 2 and "--steps must be >= 1" in r.stderr
    r = _run(["--device", "tpu"], cwd=str(tmp_path))
    assert r.returncode == 2 and "--device" in r.stderr
    r = _run(["--help"], cwd=str(tmp_path))
    assert r.returncode == 0 and "--with-doctor-fixes" in r.stdout and "--benchmarks" in r.stdout


def test_the_third_run_applies_what_the_doctor_advised_and_only_that(quick):
    """The doctor's findings on the baseline decide the third run's fixes (decisions, not
    timings): channels_last advised -> a channels_last model; not advised -> NCHW, said in the
    notes; bf16 autocast not advised on this CPU -> float32, said too."""
    _, cache, _ = quick
    from torchspeed.demo import dataset, train

    m = dataset.prepare("quick", str(cache), progress=False)
    cfg = train.Config(
        device="cpu", steps=2, batch_size=8, image_size=32, workers=1, progress=False
    )
    advised = train.run("doctor_fixes", cfg, m, ["channels_last", "amp_not_advised"])
    assert any(n.startswith("channels_last model") for n in advised.notes), advised.notes
    assert any("does not advise bf16" in n for n in advised.notes), advised.notes
    assert all(math.isfinite(x) for x in advised.losses)
    plain = train.run("doctor_fixes", cfg, m, [])
    assert any("did not advise channels_last" in n for n in plain.notes), plain.notes
    assert not any(n.startswith("channels_last model") for n in plain.notes)


def test_the_baseline_as_a_plain_script_under_the_doctor(quick, tmp_path):
    """`torchspeed doctor -- python -m torchspeed.demo.baseline_script`: the demo's baseline as a
    user's script; the report names its steps and, on a CPU, says what it measured about bf16
    autocast either way (advised where faster, not advised with the ratio where slower)."""
    _, cache, _ = quick
    # The torchspeed this test imported (the module is new: an older installed package lacks it).
    e = dict(os.environ, TORCHSPEED_DEMO_DATA=str(cache))
    e["PYTHONPATH"] = os.path.dirname(os.path.dirname(torchspeed.__file__))
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "torchspeed.cli",
            "doctor",
            "--steps",
            "6",
            "--stop-script",
            "--no-trace",
            "--no-png",
            "--out",
            str(tmp_path / "doc"),
            "--",
            "python",
            "-m",
            "torchspeed.demo.baseline_script",
            "--quick",
            "--steps",
            "8",
            "--workers",
            "1",
        ],
        cwd=str(tmp_path),
        env=e,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    s = json.load(open(tmp_path / "doc" / "summary.json"))
    rules = {f["rule"] for f in s["findings"]}
    assert s["steps"] >= 1 and not {"amp", "amp_not_advised"} <= rules, rules
    assert "where the forward time goes" in r.stderr
