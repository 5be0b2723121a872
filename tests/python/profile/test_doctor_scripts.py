"""The doctor on small unmodified scripts of each loop shape (a manual SGD update, an LBFGS closure,
torch.optim with clipping, a script that pickles its model mid-run, a forked DataLoader): the
script's exit status, stdout and files are the same as without the doctor, and each report has a
breakdown that says what ended a step. Also: the dominant layer named, torch.compile without graph
breaks, the doctor's own errors contained, --steps reporting while the script runs on."""

import copy
import io
import os
import runpy
import subprocess
import sys
import textwrap
import warnings

import pytest
import torch
from profile_helpers import _assert_hooks_removed

from torchspeed.profile import _doctor, rules
from torchspeed.profile import attribution as attribution_mod

_MODEL = """
import copy, pickle, sys
import torch
from torch import nn
torch.manual_seed(0)
torch.set_num_threads(1)

class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.small = nn.Linear(32, 32)
        self.big = nn.Linear(32, 4096)   # the dominant layer, by construction

    def forward(self, x):
        return self.big(torch.relu(self.small(x)))

model = Net()
x, y = torch.randn(64, 32), torch.randint(0, 4096, (64,))

def loss_fn():
    return nn.functional.cross_entropy(model(x), y)
"""

SCRIPTS = {
    "manual_sgd": """
for i in range(12):
    loss = loss_fn()
    model.zero_grad()
    loss.backward()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(p.grad, alpha=-0.1)
    print(f"{i} {loss.item():.10f}")
torch.save(model.state_dict(), "final.pt")
""",
    "lbfgs": """
opt = torch.optim.LBFGS(model.parameters(), lr=0.5, max_iter=3)
for i in range(8):
    def closure():
        opt.zero_grad()
        loss = loss_fn()
        loss.backward()
        return loss
    print(f"{i} {opt.step(closure).item():.10f}")
torch.save(model.state_dict(), "final.pt")
""",
    "torch_optim": """
opt = torch.optim.Adam(model.parameters(), lr=1e-3)
for i in range(10):
    loss = loss_fn()
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
    opt.zero_grad()
    print(f"{i} {loss.item():.10f}")
torch.save(model.state_dict(), "final.pt")
""",
    "pickles_its_model": """
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for i in range(10):
    loss = loss_fn()
    loss.backward()
    opt.step()
    opt.zero_grad()
    if i == 5:   # mid-run, while the doctor's hooks are installed
        torch.save(model, "model_mid.pt")
        blob = pickle.dumps(model)
        twin = copy.deepcopy(model)
        assert all(k.split(".")[0] in ("small", "big") for k in model.state_dict())
        again = torch.load("model_mid.pt", weights_only=False)
        assert torch.equal(again(x), twin(x)) and torch.equal(pickle.loads(blob)(x), twin(x))
        print("pickled", len(model._forward_pre_hooks), len(model._forward_hooks))
    print(f"{i} {loss.item():.10f}")
torch.save(model.state_dict(), "final.pt")
""",
    "forked_loader": """
ds = torch.utils.data.TensorDataset(torch.randn(96, 32), torch.randint(0, 4096, (96,)))
loader = torch.utils.data.DataLoader(
    ds, batch_size=16, num_workers=2, multiprocessing_context="fork",
    generator=torch.Generator().manual_seed(0), shuffle=True,
)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for epoch in range(2):
    for xb, yb in loader:
        loss = nn.functional.cross_entropy(model(xb), yb)
        loss.backward()
        opt.step()
        opt.zero_grad()
        print(f"{epoch} {loss.item():.10f}")
torch.save(model.state_dict(), "final.pt")
""",
}
# What the report says ended each step.
SOURCES = {
    "manual_sgd": "no optimizer step was seen",
    "lbfgs": "each LBFGS.step() ended a step (3.0 forwards of the model per step",
    "torch_optim": "each Adam.step() ended a step",
    "pickles_its_model": "each SGD.step() ended a step",
    "forked_loader": "each SGD.step() ended a step",
}


def _write(tmp_path, name):
    path = tmp_path / f"{name}.py"
    path.write_text(textwrap.dedent(_MODEL) + textwrap.dedent(SCRIPTS[name]))
    return str(path)


def _run_plain(script, cwd, monkeypatch, capfd):
    monkeypatch.chdir(cwd)
    argv = list(sys.argv)
    try:
        sys.argv = [script]
        runpy.run_path(script, run_name="__main__")
    finally:
        sys.argv = argv
    return capfd.readouterr()


def _state(path):
    return torch.load(path, weights_only=True)


@pytest.mark.parametrize("name", list(SCRIPTS))
def test_the_script_runs_as_without_the_doctor_and_the_report_has_a_breakdown(
    name, tmp_path, monkeypatch, capfd
):
    script = _write(tmp_path, name)
    plain, doc = tmp_path / "plain", tmp_path / "doctor"
    plain.mkdir()
    doc.mkdir()
    want = _run_plain(script, plain, monkeypatch, capfd)
    monkeypatch.chdir(doc)
    report = io.StringIO()
    status = _doctor.run(
        ["python", script], out=str(tmp_path / "out"), png=False, progress=False, file=report
    )
    got = capfd.readouterr()
    assert status == 0
    assert got.out == want.out  # the script's stdout is its own, line for line
    assert "torchspeed" not in got.err, got.err  # nothing of the doctor's on the script's stderr
    a, b = _state(plain / "final.pt"), _state(doc / "final.pt")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)  # bit-identical
    if name == "pickles_its_model":
        assert "pickled 0 0" in got.out  # no hook of the doctor's on the model
    text = report.getvalue()
    for row in ("forward", "backward", "optimizer", "step"):
        assert f"\n{row} " in text, text
    assert SOURCES[name] in text, text
    assert "where the forward time goes" in text
    # The script's separate clip_grad_norm_ could fold into torchspeed's optimizer.
    assert ("clip_grad_norm_ calls" in text) == (name == "torch_optim"), text
    _assert_hooks_removed()


def test_the_oversized_linear_is_named_the_dominant_layer(tmp_path, monkeypatch, capfd):
    script = _write(tmp_path, "torch_optim")
    monkeypatch.chdir(tmp_path)
    report = io.StringIO()
    with _doctor.doctor(out=None, progress=False, file=report) as prof:
        runpy.run_path(script, run_name="__main__")
    att = prof.facts().attribution
    assert att is not None and att.dominant().name == "big", att.format()
    assert att.dominant().detail == "Linear(32 -> 4096)"
    assert att.dominant().share > 0.4  # 128x the small layer's multiply-adds (noise: a loaded box)
    text = report.getvalue()
    lines = text.split("where the forward time goes")[1].splitlines()
    assert "big (Linear(32 -> 4096)" in lines[1], text  # first row of the module table
    assert any("aten::" in line and "[64, 4096]" in line for line in lines), text
    # The rule names it when forward+backward are most of the step (they are here, unless other
    # processes stretch the rest of the step).
    s = prof.summary()
    findings = prof.advice(s)
    layer = [f for f in findings if f.rule == "dominant_layer"]
    if s.share("forward") + s.share("backward") >= rules.AMP_MIN_COMPUTE_SHARE:
        assert layer and layer[0].title.startswith("big (Linear(32 -> 4096)) is "), findings


def test_layers_are_named_when_the_script_drops_its_model_before_the_report(tmp_path, monkeypatch):
    """The model is a local of main(), gone when the script ends and the report is written
    (found by a new user: every row read "? (?)"): names and descriptions are taken when the
    modules are first seen."""
    script = tmp_path / "local_model.py"
    script.write_text(
        textwrap.dedent(
            """
            import torch
            from torch import nn
            def main():
                torch.manual_seed(0)
                torch.set_num_threads(1)
                model = nn.Sequential(nn.Linear(32, 32), nn.ReLU(), nn.Linear(32, 4096))
                opt = torch.optim.SGD(model.parameters(), lr=0.01)
                x, y = torch.randn(64, 32), torch.randint(0, 4096, (64,))
                for _ in range(12):
                    loss = nn.functional.cross_entropy(model(x), y)
                    opt.zero_grad()
                    loss.backward()
                    opt.step()
            main()
            """
        )
    )
    monkeypatch.chdir(tmp_path)
    report = io.StringIO()
    status = _doctor.run(
        ["python", str(script)], out=str(tmp_path / "out"), png=False, progress=False, file=report
    )
    assert status == 0
    text = report.getvalue()
    rows = text.split("where the forward time goes")[1].splitlines()[1:5]
    assert "2 (Linear(32 -> 4096)" in rows[0], text
    assert not any("?" in row for row in rows), text


def test_torch_compile_of_a_model_under_the_doctor_has_no_graph_break(tmp_path):
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
    compiled = torch.compile(model, backend="eager")
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x = torch.randn(4, 8)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")  # the script's own filters, before the doctor's
        with _doctor.doctor(out=None, progress=False, file=io.StringIO()) as prof:
            for _ in range(6):
                compiled(x).sum().backward()
                opt.step()
                opt.zero_grad()
    assert prof.steps == 6
    assert not counters["graph_break"], dict(counters["graph_break"])
    assert not [w for w in caught if "global hooks" in str(w.message)]  # not the user's warning
    assert torch.equal(compiled(x), model(x))
    _assert_hooks_removed()


def test_an_error_inside_the_doctor_stops_profiling_and_the_script_runs_on(
    tmp_path, monkeypatch, capfd
):
    script = _write(tmp_path, "torch_optim")
    plain = tmp_path / "plain"
    plain.mkdir()
    want = _run_plain(script, plain, monkeypatch, capfd)

    def broken(self, module):
        raise RuntimeError("a bug in the sampler")

    monkeypatch.setattr(attribution_mod.ModuleSampler, "enter", broken)
    monkeypatch.chdir(tmp_path)
    report = io.StringIO()
    status = _doctor.run(["python", script], out=None, progress=False, file=report)
    got = capfd.readouterr()
    assert status == 0 and got.out == want.out
    assert "internal error in the profiler" in got.err and "a bug in the sampler" in got.err
    a, b = _state(plain / "final.pt"), _state(tmp_path / "final.pt")
    assert all(torch.equal(a[k], b[k]) for k in a)
    _assert_hooks_removed()


def test_cli_steps_reports_while_the_script_runs_on_with_its_stdout_its_own(tmp_path):
    script = _write(tmp_path, "manual_sgd")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    plain = subprocess.run(
        [sys.executable, script], cwd=tmp_path, capture_output=True, text=True, timeout=300
    )
    out = tmp_path / "o"
    r = subprocess.run(
        [sys.executable, "-m", "torchspeed", "doctor", "--steps", "3", "--no-png"]
        + ["--out", str(out), "--", "python", script],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )
    assert plain.returncode == 0 and r.returncode == 0, r.stderr[-3000:]
    assert r.stdout == plain.stdout  # all 12 iterations ran, and the report went to stderr
    assert "torchspeed.profile:" in r.stderr and "written:" in r.stderr
    assert (out / "summary.json").exists() and (out / "report.txt").exists()
    # The report was written after step 3, before the script's last iterations.
    assert r.stderr.index("written:") < len(r.stderr)
    report = (out / "report.txt").read_text()
    assert "no optimizer step was seen" in report


def test_steps_then_stop_keeps_the_old_behaviour_for_a_block(tmp_path):
    m = torch.nn.Linear(4, 2)
    opt = torch.optim.SGD(m.parameters(), lr=0.1)
    ran = 0
    with _doctor.doctor(steps=3, out=None, progress=False, file=io.StringIO(), then="stop"):
        for _ in range(10):
            m(torch.randn(2, 4)).sum().backward()
            opt.step()
            ran += 1
    assert ran == 2  # the 3rd opt.step() ended the block (StopRun from its hook)
    ran = 0
    with _doctor.doctor(steps=3, out=None, progress=False, file=io.StringIO(), then="continue"):
        for _ in range(10):
            m(torch.randn(2, 4)).sum().backward()
            opt.step()
            ran += 1
    assert ran == 10
    with pytest.raises(ValueError, match="then must be 'stop' or 'continue'"):
        with _doctor.doctor(then="later"):
            pass
    _assert_hooks_removed()


def test_deepcopy_of_a_model_inside_the_doctor_block():
    m = torch.nn.Linear(4, 2)
    opt = torch.optim.SGD(m.parameters(), lr=0.1)
    with _doctor.doctor(out=None, progress=False, file=io.StringIO()):
        for _ in range(5):
            m(torch.randn(2, 4)).sum().backward()
            opt.step()
            twin = copy.deepcopy(m)
    assert not twin._forward_pre_hooks and not twin._forward_hooks


def test_step_on_auto_needs_hooks_and_bad_step_on_is_named():
    import torchspeed.profile as tsp

    with pytest.raises(ValueError, match="step_on='auto' needs hooks=True"):
        tsp.StepProfiler(step_on="auto")
    with pytest.raises(ValueError, match="step_on must be None, 'optimizer' or 'auto'"):
        tsp.StepProfiler(hooks=True, step_on="backward")


def test_facts_keep_the_torch_threads_and_the_loader_workers_after_the_loader_is_gone():
    """cpu_threads reads torch's threads and the most loader workers alive at once; the loader
    may be gone (the script returned) when the rules run."""
    import gc

    from torch import nn

    model = nn.Linear(4, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with _doctor.doctor(out=None, progress=False, file=io.StringIO()) as prof:
        loader = torch.utils.data.DataLoader(torch.randn(8, 4), batch_size=4, num_workers=2)
        for _ in range(2):
            for x in loader:
                model(x).sum().backward()
                opt.step()
                opt.zero_grad()
        del loader
        gc.collect()
        facts = prof.facts()
    assert facts.loader_workers == 2
    assert facts.torch_threads == torch.get_num_threads()
