"""Every example in examples/python runs in its short mode, from a temporary folder, against the
installed package (scripts/consumer.sh builds and runs the C++ ones)."""

import os
import subprocess
import sys

import pytest

pytest.importorskip("torchspeed")

EXAMPLES = os.path.join(os.path.dirname(__file__), "..", "..", "examples", "python")


def _env():
    e = dict(os.environ, OMP_NUM_THREADS="1")
    for k in ("PYTHONPATH", "TORCHSPEED_RESULTS_DIR"):
        e.pop(k, None)
    return e


def _run(args, cwd, timeout=300):
    return subprocess.run(
        [sys.executable, *args],
        cwd=cwd,
        env=_env(),
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def _example(name):
    return os.path.abspath(os.path.join(EXAMPLES, name))


def test_every_python_example_is_covered():
    # A new example must be added here (or to the consumer script) so that CI runs it.
    covered = {
        "optim_amp.py",
        "loader_resume.py",
        "profile_doctor.py",
        "ddp_accumulate.py",
        "train_plain_torch.py",
        "prune_int8.py",
    }
    found = {f for f in os.listdir(EXAMPLES) if f.endswith(".py")}
    assert found <= covered, sorted(found - covered)


def test_optim_amp(tmp_path):
    r = _run([_example("optim_amp.py"), "--quick", "--device", "cpu"], str(tmp_path))
    assert r.returncode == 0, r.stdout + r.stderr
    assert "the same parameters as torch.optim.AdamW" in r.stdout
    assert "float32 masters" in r.stdout


def test_loader_resume(tmp_path):
    pytest.importorskip("PIL")
    r = _run([_example("loader_resume.py"), "--quick"], str(tmp_path))
    assert r.returncode == 0, r.stdout + r.stderr
    assert "bitwise those of the uninterrupted run" in r.stdout


def test_prune_int8(tmp_path):
    r = _run([_example("prune_int8.py"), "--quick"], str(tmp_path))
    assert r.returncode == 0, r.stdout + r.stderr
    assert "state_dict loaded into a fresh model: identical outputs" in r.stdout
    assert "int8 (" in r.stdout and "test accuracy" in r.stdout


def test_profile_doctor(tmp_path):
    out = tmp_path / "out"
    r = _run([_example("profile_doctor.py"), "--quick", "--out", str(out)], str(tmp_path))
    assert r.returncode == 0, r.stdout + r.stderr
    assert "phase" in r.stdout and "step" in r.stdout
    assert (out / "trace.json").exists() and (out / "summary.json").exists()
    assert "conv_bias_before_bn" in (out / "summary.json").read_text()


def test_train_plain_torch_under_the_doctor(tmp_path):
    r = _run(
        [
            "-m",
            "torchspeed.cli",
            "doctor",
            "--steps",
            "4",
            "--stop-script",  # the report is what this test checks: the rest of the epoch is not
            "--out",
            str(tmp_path / "doc"),
            "--",
            "python",
            _example("train_plain_torch.py"),
            "--epochs",
            "1",
        ],
        str(tmp_path),
    )
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    assert (tmp_path / "doc" / "summary.json").exists()


@pytest.mark.skipif(sys.platform != "linux", reason="torchrun with Gloo on Linux")
def test_ddp_accumulate_under_torchrun(tmp_path):
    save = tmp_path / "params.pt"
    r = _run(
        [
            "-m",
            "torch.distributed.run",
            "--standalone",
            "--nproc-per-node",
            "2",
            _example("ddp_accumulate.py"),
            "--steps",
            "2",
            "--accumulation-steps",
            "2",
            "--save",
            str(save),
        ],
        str(tmp_path),
    )
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    assert save.exists()


def test_prune_int8_if_present(tmp_path):
    # Written by the pruning/int8 work; run here in its short mode once it exists.
    path = _example("prune_int8.py")
    if not os.path.exists(path):
        pytest.skip("examples/python/prune_int8.py is not in this tree yet")
    r = _run([path, "--quick"], str(tmp_path))
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
