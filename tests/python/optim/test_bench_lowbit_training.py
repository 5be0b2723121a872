"""`torchspeed bench lowbit_training`: its rows, JSON and argument errors (the quality numbers are
in bench/RESULTS.md; the 3 % bound is tested in test_lowbit.py / test_lowbit_one_moment.py)."""

import json
import math

import pytest

from torchspeed.benchmarks import lowbit_training


def test_runs_every_state_dtype_beside_the_torch_anchor(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("TORCHSPEED_RESULTS_DIR", str(tmp_path))
    assert lowbit_training.main(["--quick", "--steps", "20", "--optimizers", "sgd,lion"]) == 0
    rec = json.loads((tmp_path / "lowbit_training.json").read_text())
    runs = [r["run"] for r in rec["rows"]]
    # torch has no Lion: its reference is torchspeed's fp32 Lion.
    assert runs == [
        "sgd torch",
        "sgd torchspeed fp32",
        "sgd torchspeed bf16",
        "sgd torchspeed int8",
        "lion torchspeed fp32",
        "lion torchspeed bf16",
        "lion torchspeed int8",
    ]
    by = {r["run"]: r for r in rec["rows"]}
    for r in rec["rows"]:
        assert math.isfinite(r["final_loss"]) and r["final_loss"] < r["first_loss"], r
    # The anchor and torchspeed's fp32 SGD run the same math: the same losses.
    assert by["sgd torchspeed fp32"]["vs_reference"] == pytest.approx(0.0, abs=1e-6)
    assert by["sgd torch"]["state_bytes_per_param"] == pytest.approx(4.0, rel=1e-3)
    assert by["sgd torchspeed int8"]["state_bytes_per_param"] < 1.2
    assert len(rec["curves"]["sgd torchspeed int8"]) == 20
    assert "sgd torchspeed int8" in capsys.readouterr().out


def test_lm_task_learns_real_text_and_reports_the_held_out_loss(tmp_path, monkeypatch):
    monkeypatch.setenv("TORCHSPEED_RESULTS_DIR", str(tmp_path))
    argv = ["--task", "lm", "--quick", "--steps", "30", "--optimizers", "adamw"]
    assert lowbit_training.main(argv) == 0
    rec = json.loads((tmp_path / "lowbit_training_lm.json").read_text())
    assert rec["task"] == "lm" and not (tmp_path / "lowbit_training.json").exists()
    by = {r["run"]: r for r in rec["rows"]}
    assert list(by) == [
        "adamw torch",
        "adamw torchspeed fp32",
        "adamw torchspeed bf16",
        "adamw torchspeed int8",
    ]
    for r in rec["rows"]:
        # Uniform over 256 byte values is ln 256 = 5.55 nats; 30 steps already learn the byte
        # frequencies of source code.
        assert r["first_loss"] > 5.0 and r["final_loss"] < 4.5, r
        assert math.isfinite(r["held_out_loss"]) and r["held_out_loss"] < 4.5, r
    # torch's fused AdamW and torchspeed's fp32 AdamW agree closely (not bitwise: the fused
    # kernels differ in rounding), so the references' relative numbers are near 0.
    assert abs(by["adamw torchspeed fp32"]["held_out_vs_reference"]) < 0.01
    # Tensors under min_lowbit_numel (4096) keep float32 moments (8 B/param); the others take two
    # int8 codes plus a float32 absmax per 256-element block.
    sizes = [p.numel() for p in lowbit_training.LmTask(quick=True).start().parameters()]
    small = sum(n for n in sizes if n < 4096)
    big = sum(n for n in sizes if n >= 4096)
    want = (8 * small + 2 * big * (1 + 4 / 256)) / (small + big)
    got = by["adamw torchspeed int8"]["state_bytes_per_param"]
    assert (
        got == pytest.approx(want, rel=0.02)
        and got < by["adamw torchspeed bf16"]["state_bytes_per_param"]
    )


def test_lm_corpus_is_python_source():
    text = lowbit_training.lm_text(("argparse",))
    assert b"class ArgumentParser" in text
    with pytest.raises(RuntimeError, match="no source for module 'sys'"):
        lowbit_training.lm_text(("sys",))


@pytest.mark.parametrize(
    "argv",
    [
        ["--optimizers", "adam"],
        ["--optimizers", ""],
        ["--steps", "5"],
        ["--threads", "0"],
        ["--task", "gpt"],
    ],
)
def test_bad_arguments_are_usage_errors(argv):
    with pytest.raises(SystemExit) as e:
        lowbit_training.main(argv)
    assert e.value.code == 2
