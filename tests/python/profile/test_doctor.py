"""The doctor (torchspeed.profile.doctor, `torchspeed doctor`) on odd blocks and scripts: bad
arguments refused before anything runs, the script's argv, exit status, exceptions and sys state
its own, every hook removed on every way out."""

import io
import json
import os
import subprocess
import sys
import textwrap

import pytest
import torch
from profile_helpers import (
    _assert_hooks_removed,
    _load_trace,
    _model,
    _train_step,
)

import torchspeed.profile as tsp
from torchspeed.profile import _doctor

# ---- the doctor -----------------------------------------------------------------------------------


@pytest.mark.parametrize("steps", [0, -1, "5", 1.5])
def test_doctor_rejects_bad_steps_before_running_the_block(steps):
    ran = []
    with pytest.raises(ValueError, match=r"torchspeed\.profile\.doctor: steps must be an int >= 1"):
        with tsp.doctor(steps=steps, out=None, progress=False):
            ran.append(1)
    assert ran == []
    _assert_hooks_removed()


def test_doctor_block_without_an_optimizer_step_has_nothing_to_report(tmp_path):
    out, buf = tmp_path / "out", io.StringIO()
    m, _ = _model()
    with tsp.doctor(steps=5, out=str(out), progress=False, file=buf):
        m(torch.randn(2, 4))
    assert "no step was seen" in buf.getvalue() and "nothing to report" in buf.getvalue()
    assert not out.exists()
    _assert_hooks_removed()


def test_doctor_stop_is_not_swallowed_by_the_blocks_except_exception(tmp_path):
    m, opt = _model()
    buf, steps, swallowed = io.StringIO(), 0, 0
    with tsp.doctor(steps=3, out=str(tmp_path / "o"), png=False, progress=False, file=buf) as prof:
        for _ in range(1000):
            try:
                _train_step(m, opt)
                steps += 1
            except Exception:
                swallowed += 1
    assert swallowed == 0 and steps == 2 and prof.steps == 3
    assert "written:" in buf.getvalue()
    for f in ("report.txt", "summary.json", "trace.json"):
        assert (tmp_path / "o" / f).exists()
    json.loads((tmp_path / "o" / "summary.json").read_text())
    _assert_hooks_removed()


def test_doctor_with_an_unwritable_out_fails_first_or_still_prints_the_report(tmp_path):
    (tmp_path / "afile").write_text("")
    bad = str(tmp_path / "afile" / "sub")
    m, opt = _model()
    ran, buf = 0, io.StringIO()
    try:
        with tsp.doctor(steps=3, out=bad, png=False, progress=False, file=buf):
            for _ in range(5):
                _train_step(m, opt)
                ran += 1
    except (OSError, ValueError):
        pass
    assert ran == 0 or "data_wait" in buf.getvalue()


_SCRIPT = textwrap.dedent(
    """
    import json, sys
    import torch
    from torch import nn
    print("ARGV " + json.dumps(sys.argv))
    print("NAME " + __name__)
    sys.path.append("/added/by/the/script")
    mode = sys.argv[1] if len(sys.argv) > 1 else "ok"
    m = nn.Linear(4, 2)
    opt = torch.optim.SGD(m.parameters(), lr=0.1)

    def step():
        m(torch.randn(8, 4)).sum().backward()
        opt.step()
        opt.zero_grad()

    if __name__ == "__main__":
        if mode == "exit3":
            step(); step(); sys.exit(3)
        if mode == "exitstr":
            step(); step(); sys.exit("bad config: lr must be > 0")
        if mode == "raise":
            step(); step(); raise RuntimeError("the script failed")
        if mode == "interrupt":
            step(); step(); raise KeyboardInterrupt
        if mode == "forever":
            while True:
                try:
                    step()
                except Exception:
                    print("SWALLOWED")
        for _ in range(2):
            step()
        print("DONE")
    """
)


@pytest.fixture
def script(tmp_path):
    p = tmp_path / "train.py"
    p.write_text(_SCRIPT)
    return str(p)


def _run(argv, tmp_path, **kw):
    return _doctor.run(argv, out=str(tmp_path / "out"), png=False, progress=False, **kw)


def test_run_passes_argv_through_runs_main_and_restores_sys(script, tmp_path, capsys):
    argv0, path0 = list(sys.argv), list(sys.path)
    assert _run(["python", script, "ok", "--lr", "0.1", "--", "x y"], tmp_path) == 0
    out = capsys.readouterr().out
    assert f"ARGV {json.dumps([script, 'ok', '--lr', '0.1', '--', 'x y'])}" in out
    assert "NAME __main__" in out and "DONE" in out
    assert sys.argv == argv0 and sys.path == path0
    _assert_hooks_removed()


def test_run_returns_the_scripts_exit_status(script, tmp_path, capsys):
    assert _run([sys.executable, script, "exit3"], tmp_path) == 3
    assert "written:" in capsys.readouterr().out
    _assert_hooks_removed()


def test_run_prints_a_sys_exit_message(script, tmp_path, capsys):
    assert _run([script, "exitstr"], tmp_path) == 1
    assert "bad config: lr must be > 0" in capsys.readouterr().err


def test_run_lets_the_scripts_exception_propagate_after_the_report(script, tmp_path, capsys):
    argv0 = list(sys.argv)
    with pytest.raises(RuntimeError, match="the script failed"):
        _run([script, "raise"], tmp_path)
    assert "written:" in capsys.readouterr().out  # the two steps that ran are still reported
    assert sys.argv == argv0
    _assert_hooks_removed()


def test_run_keyboard_interrupt_is_status_130_with_hooks_removed(script, tmp_path, capsys):
    assert _run([script, "interrupt"], tmp_path) == 130
    assert "written:" in capsys.readouterr().out
    _assert_hooks_removed()


def test_run_a_missing_script_is_a_clear_error(tmp_path):
    with pytest.raises(
        FileNotFoundError, match=r"torchspeed doctor: no such script: .*missing\.py"
    ):
        _run(["python", str(tmp_path / "missing.py")], tmp_path)
    _assert_hooks_removed()


def test_run_a_missing_script_fails_before_profiling(tmp_path, capsys):
    with pytest.raises(FileNotFoundError):
        _run(["python", str(tmp_path / "missing.py")], tmp_path)
    assert capsys.readouterr().out == ""


def test_run_accepts_interpreter_options_before_the_script(script, tmp_path, capsys):
    assert _run(["python", "-u", script, "ok"], tmp_path) == 0
    assert "DONE" in capsys.readouterr().out


def test_run_with_dash_m_runs_the_module_as_main(script, tmp_path, monkeypatch, capsys):
    (tmp_path / "my_train_mod.py").write_text(_SCRIPT)
    monkeypatch.chdir(tmp_path)
    assert _run(["python", "-m", "my_train_mod", "ok", "--flag"], tmp_path) == 0
    out = capsys.readouterr().out
    argv_line = next(line for line in out.splitlines() if line.startswith("ARGV "))
    argv = json.loads(argv_line[5:])
    assert argv[0].endswith("my_train_mod.py") and argv[1:] == ["ok", "--flag"]
    assert "NAME __main__" in out and "DONE" in out
    with pytest.raises(ValueError, match="-m needs a module name"):
        _run(["python", "-m"], tmp_path)
    with pytest.raises(ImportError, match="no_such_module_xyz"):
        _run(["-m", "no_such_module_xyz"], tmp_path)
    with pytest.raises(ValueError, match="give the training command"):
        _run(["python"], tmp_path)
    _assert_hooks_removed()


def test_doctor_cli_stops_an_infinite_loop_that_catches_exception(script, tmp_path):
    out = tmp_path / "cli_out"
    # The child imports the torchspeed this test imported (an editable or a site-packages install).
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    p = subprocess.run(
        [
            sys.executable,
            "-m",
            "torchspeed",
            "doctor",
            "--steps",
            "3",
            "--stop-script",
            "--no-png",
            "--out",
            str(out),
            "--",
            "python",
            script,
            "forever",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    assert p.returncode == 0, p.stderr[-3000:]
    assert "SWALLOWED" not in p.stdout
    assert f"ARGV {json.dumps([script, 'forever'])}" in p.stdout
    assert "written:" in p.stderr  # the doctor's report: the script's stdout stays its own
    summary = json.loads((out / "summary.json").read_text())
    assert summary["steps"] >= 1 and "findings" in summary
    trace = _load_trace(out / "trace.json")
    assert sum(e.get("cat") == "step" for e in trace["traceEvents"]) == 3
    assert "phase" in (out / "report.txt").read_text()
