"""The `torchspeed` command run as a user would after `pip install`: from an empty folder, against
the installed package (the benchmarks ship in it), results in ./torchspeed_results."""

import json
import os
import shutil
import subprocess
import sys

import pytest

torchspeed = pytest.importorskip("torchspeed")


def run_cli(args, cwd, **env):
    e = dict(os.environ, **env)
    e.pop("TORCHSPEED_RESULTS_DIR", None)
    e.update(env)
    return subprocess.run(
        [sys.executable, "-m", "torchspeed.cli", *args],
        cwd=cwd,
        env=e,
        capture_output=True,
        text=True,
        timeout=600,
    )


def test_bench_runs_from_an_empty_folder_and_writes_torchspeed_results(tmp_path):
    r = run_cli(["bench", "grad_stats", "--quick"], cwd=str(tmp_path))
    assert r.returncode == 0, r.stderr[-3000:]
    path = tmp_path / "torchspeed_results" / "bench_grad_stats_cpu.json"
    rec = json.loads(path.read_text())
    labels = {row["label"] for row in rec["rows"]}
    assert any("torchspeed" in lab for lab in labels) and any("torch" in lab for lab in labels)
    assert rec["command"].startswith("torchspeed bench grad_stats --quick")
    assert rec["machine"]["cpu_model"]
    assert "results written to" in r.stdout


def test_results_dir_env_and_a_stray_bench_folder_is_not_run(tmp_path):
    # A bench/ folder in the current directory used to be run by `torchspeed bench`: no more.
    (tmp_path / "bench").mkdir()
    (tmp_path / "bench" / "bench_optim.py").write_text("raise SystemExit(99)\n")
    r = run_cli(["bench", "optim", "--help"], cwd=str(tmp_path))
    assert r.returncode == 0, r.stderr
    assert "torchspeed bench optim" in r.stdout and "--quick" in r.stdout
    out = tmp_path / "elsewhere"
    r = run_cli(
        ["bench", "grad_stats", "--quick"], cwd=str(tmp_path), TORCHSPEED_RESULTS_DIR=str(out)
    )
    assert r.returncode == 0, r.stderr[-3000:]
    assert (out / "bench_grad_stats_cpu.json").exists()
    assert not (tmp_path / "torchspeed_results").exists()


def test_unknown_benchmark_is_a_usage_error(tmp_path):
    r = run_cli(["bench", "nope"], cwd=str(tmp_path))
    assert r.returncode == 2
    assert "invalid choice: 'nope'" in r.stderr and "grad_stats" in r.stderr
    from torchspeed import benchmarks

    with pytest.raises(ValueError, match="name must be one of optim, grad_stats"):
        benchmarks.run("nope")


def test_console_script_and_module_entry_points(tmp_path):
    exe = shutil.which("torchspeed")
    if exe is None:
        pytest.skip("the torchspeed console script is not on PATH (not a pip install?)")
    r = subprocess.run([exe, "bench", "--help"], cwd=str(tmp_path), capture_output=True, text=True)
    assert r.returncode == 0 and "loader_gpu" in r.stdout, r.stderr
    for module, args, expected in (
        ("torchspeed.benchmarks", ["optim", "--help"], "--device"),
        ("torchspeed", ["bench", "--help"], "loader_gpu"),
    ):
        r = subprocess.run(
            [sys.executable, "-m", module, *args], cwd=str(tmp_path), capture_output=True, text=True
        )
        assert r.returncode == 0 and expected in r.stdout, (module, r.stderr)


def test_int8_linear_bench_as_an_avx2_host(tmp_path):
    # The flag re-runs the benchmark in a fresh process with every library held to AVX2; the rows
    # carry each int8 output's error against fp32.
    if "avx2" not in torchspeed._C.cpu_isas_compiled():
        pytest.skip("this build has no avx2 kernels")
    r = run_cli(["bench", "int8_linear", "--quick", "--as-avx2-host"], cwd=str(tmp_path))
    assert r.returncode == 0, r.stderr[-3000:]
    assert "held to AVX2" in r.stdout
    rec = json.loads(
        (tmp_path / "torchspeed_results" / "bench_int8_linear_avx2_host_cpu.json").read_text()
    )
    assert rec["command"] == "torchspeed bench int8_linear --quick --as-avx2-host"
    impls = {row["impl"] for row in rec["rows"]}
    assert impls == {"fp32", "torch.ao", "avx2"}
    for row in rec["rows"]:
        if row["impl"] == "fp32":
            continue
        assert 0.0 < row["rel_err"] < 0.05, row
        assert row["min_s"] > 0 and row["gmacs"] > 0, row


_BAD_ARGS = {
    "doctor --warmup -1": ["doctor", "--warmup", "-1", "--", "python", "{script}"],
    "doctor --steps 0": ["doctor", "--steps", "0", "--", "python", "{script}"],
    "doctor --verify 1": ["doctor", "--verify", "1", "--", "python", "{script}"],
    "doctor --device cuda without CUDA": ["doctor", "--device", "cuda", "--", "python", "{script}"],
    "doctor -- missing.py": ["doctor", "--", "python", "{tmp}/missing.py"],
    "doctor -- -m missing": ["doctor", "--", "python", "-m", "no_such_module_xyz"],
    "doctor -- python -c": ["doctor", "--", "python", "-c", "print(1)"],
    "doctor --out <file>": ["doctor", "--out", "{file}", "--", "python", "{script}"],
    "doctor --out <unwritable>": ["doctor", "--out", "{file}/sub", "--", "python", "{script}"],
    "demo --data-dir <file>": ["demo", "--quick", "--data-dir", "{file}"],
    "demo --data-dir <unwritable>": ["demo", "--quick", "--data-dir", "{file}/sub"],
    "demo --out <file>": ["demo", "--quick", "--out", "{file}"],
    "demo --out <unwritable>": ["demo", "--quick", "--out", "{file}/sub/deeper"],
}


@pytest.mark.parametrize("case", list(_BAD_ARGS))
def test_every_bad_argument_is_a_one_line_usage_error_with_status_2(case, tmp_path):
    # Issue 23 item 20: these were Python tracebacks with status 1.
    if "cuda" in case:
        import torch

        if torch.cuda.is_available():
            pytest.skip("CUDA is available here")
    (tmp_path / "train.py").write_text("open('ran', 'w').write('x')\n")
    (tmp_path / "afile").write_text("")
    fill = {
        "script": str(tmp_path / "train.py"),
        "tmp": str(tmp_path),
        "file": str(tmp_path / "afile"),
    }
    args = [a.format(**fill) for a in _BAD_ARGS[case]]
    r = run_cli(args, cwd=str(tmp_path))
    assert r.returncode == 2, (r.returncode, r.stderr[-2000:])
    assert "Traceback" not in r.stderr, r.stderr[-2000:]
    last = r.stderr.strip().splitlines()[-1]
    assert last.startswith(f"torchspeed {args[0]}: error: "), r.stderr
    assert not (tmp_path / "ran").exists()  # nothing ran
    assert sorted(p.name for p in tmp_path.iterdir()) == ["afile", "train.py"]  # nothing made


def test_an_unwritable_out_folder_is_refused_for_a_user_without_root(tmp_path):
    import os as _os

    if _os.geteuid() == 0:
        pytest.skip("root may write anywhere (the file-as-parent case covers it)")
    ro = tmp_path / "ro"
    ro.mkdir(mode=0o500)
    (tmp_path / "train.py").write_text("")
    r = run_cli(["doctor", "--out", str(ro / "o"), "--", str(tmp_path / "train.py")], str(tmp_path))
    assert r.returncode == 2 and "is not writable" in r.stderr, r.stderr


def test_bench_all_runs_every_benchmark_with_quick(monkeypatch):
    from torchspeed import benchmarks, cli

    calls = []
    monkeypatch.setattr(benchmarks, "run", lambda name, argv: calls.append((name, argv)) or 0)
    assert cli.main(["bench", "all"]) == 0
    assert [name for name, _ in calls] == list(benchmarks.BENCHMARKS)
    assert all(argv == ["--quick"] for _, argv in calls)
    calls.clear()
    assert benchmarks.run_all(["--full", "--device", "cpu"]) == 0
    assert all(argv == ["--device", "cpu"] for _, argv in calls)


def test_bench_all_skips_a_benchmark_that_lacks_an_extra_and_reports_failures(monkeypatch):
    from torchspeed import benchmarks

    def fake(name, argv):
        if name == "loader":
            raise SystemExit("torchspeed bench loader: needs PIL (pip install 'torchspeed[bench]')")
        return 1 if name == "quant" else 0

    monkeypatch.setattr(benchmarks, "run", fake)
    assert benchmarks.run_all([]) == 1


def test_harness_records_rates_against_their_anchor(tmp_path, monkeypatch, capsys):
    from torchspeed.benchmarks.harness import Harness

    monkeypatch.setenv("TORCHSPEED_RESULTS_DIR", str(tmp_path))
    h = Harness("bench_rates", "test", measure_bandwidth=False)
    h.record("loader", "torch", 100.0, "img/s", anchor=True)
    h.record("loader", "torchspeed", 250.0, "img/s")
    h.details["workload"] = {"images": 4}
    table = h.finish()
    assert "250 img/s" in table and "2.50x" in table
    rec = json.loads((tmp_path / "bench_rates_cpu.json").read_text())
    assert rec["rows"][1]["speedup_vs_best_anchor"] == pytest.approx(2.5)
    assert rec["details"] == {"workload": {"images": 4}}


def test_harness_times_interleaved_variants_round_robin(tmp_path, monkeypatch):
    from torchspeed.benchmarks.harness import Harness

    monkeypatch.setenv("TORCHSPEED_RESULTS_DIR", str(tmp_path))
    calls = []
    h = Harness("bench_rr", "test", measure_bandwidth=False)
    rows = h.add_interleaved(
        "g",
        [
            dict(label="anchor", fn=lambda: calls.append("a"), anchor=True, bytes_moved=8, n=1),
            dict(label="ours", fn=lambda: calls.append("b"), bytes_moved=8, n=2),
        ],
        warmup=1,
        repeats=3,
    )
    # One warmup round, then three timed rounds, each calling every variant in turn.
    assert calls == ["a", "b"] * 4
    assert [r["label"] for r in rows] == ["anchor", "ours"] and rows[0]["anchor"]
    assert rows[1]["n"] == 2 and rows[1]["interleaved"] and rows[1]["repeats"] == 3
    assert rows[1]["gbps"] == pytest.approx(8 / rows[1]["median_s"] / 1e9)
    h.finish()
    rec = json.loads((tmp_path / "bench_rr_cpu.json").read_text())
    assert [r["label"] for r in rec["rows"]] == ["anchor", "ours"]


def test_doctor_stop_script_needs_steps(tmp_path):
    (tmp_path / "train.py").write_text("")
    r = run_cli(["doctor", "--stop-script", "--", str(tmp_path / "train.py")], str(tmp_path))
    assert r.returncode == 2 and "--stop-script needs --steps N" in r.stderr.splitlines()[-1]


@pytest.mark.parametrize("command", [["-m", "torchspeed", "info"], ["-m", "torchspeed.info"]])
def test_output_into_a_closed_pipe_ends_quietly(command):
    """`torchspeed info | head -1`: the reader is gone before the command writes; it ends with
    status 1 and no traceback (a new user saw BrokenPipeError tracebacks)."""
    read, write = os.pipe()
    os.close(read)
    try:
        r = subprocess.run(
            [sys.executable, *command], stdout=write, stderr=subprocess.PIPE, text=True, timeout=120
        )
    finally:
        os.close(write)
    assert r.returncode == 1 and "Traceback" not in r.stderr, r.stderr
