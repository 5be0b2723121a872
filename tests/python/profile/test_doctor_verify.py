"""`torchspeed doctor --verify`: the script's first steps as it is, then once per applicable fix
applied from outside; each fix's measured gain beside its estimate and the loss drift."""

import contextlib
import textwrap
import time

import pytest
import torch
from profile_helpers import _assert_hooks_removed
from torch import nn

from torchspeed.profile import _doctor, verify

_SCRIPT = """
import time, torch
from torch import nn
torch.manual_seed(0)
class DS(torch.utils.data.Dataset):
    def __len__(self): return 16 * 12
    def __getitem__(self, i):
        t0 = time.perf_counter()
        while time.perf_counter() - t0 < 0.001: pass   # per-sample decode + augmentation
        return torch.randn(64), i % 10
model = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 10))
opt = torch.optim.AdamW(model.parameters(), lr=1e-3, foreach=False)
loader = torch.utils.data.DataLoader(DS(), batch_size=16)
for x, y in loader:
    loss = nn.functional.cross_entropy(model(x), y)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step(); opt.zero_grad()
print("done")
"""


_CONV_SCRIPT = """
import torch
from torch import nn
torch.manual_seed(0)
model = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.ReLU(), nn.Conv2d(16, 16, 3, padding=1),
                      nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(16, 10))
opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
x, y = torch.randn(8, 3, 24, 24), torch.arange(8) % 10
for _ in range(8):
    loss = nn.functional.cross_entropy(model(x), y)
    loss.backward()
    opt.step(); opt.zero_grad()
"""


def _rows(tmp_path, monkeypatch, source, steps):
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent(source))
    monkeypatch.chdir(tmp_path)
    # The malloc rule (page faults a step) depends on the heap's history in this process; with
    # it the compute fixes would run on top of its fix, under another name. Tested on its own.
    monkeypatch.setenv("MALLOC_TOP_PAD_", "0")
    rows, failed = _doctor.verify_script(["python", str(script)], steps=steps)
    assert failed == 0
    return rows, {r.fix: r for r in rows}


def test_verify_measures_each_applicable_fix_beside_its_estimate(tmp_path, monkeypatch, capfd):
    rows, by_fix = _rows(tmp_path, monkeypatch, _SCRIPT, 5)
    assert "done" not in capfd.readouterr().out  # the runs' stdout is dropped
    assert rows[0].fix == "as the script is" and rows[0].rule == ""
    assert rows[-1].fix == "as the script is, again" and rows[-1].rule == ""
    # bf16 autocast: tried either way; advised only where the probe measured it faster (an
    # AMX CPU), else shown as "(not advised)" with the measurement behind that.
    amp = [r for r in rows if r.rule in ("amp", "amp_not_advised")]
    assert len(amp) == 1 and amp[0].advised == (amp[0].rule == "amp"), amp
    # On one step of each pair of its run, against the others: in their CPU time where torch
    # runs one intra-op thread (an earlier test may have set it), else forward+backward's.
    want = (verify.CPU_TIME,) if torch.get_num_threads() == 1 else ("forward", "backward")
    assert amp[0].paired and amp[0].phases == want and amp[0].estimated_gain_s is not None
    # clip_grad_norm_ + torch's AdamW: torchspeed's AdamW with the clip folded in; same math,
    # so the loss hardly drifts (the fused step rounds differently: well under 0.1 %).
    opt_row = by_fix["torchspeed optimizer + max_grad_norm"]
    assert opt_row.loss_drift < 1e-3 and opt_row.phases == ("optimizer",)
    assert opt_row.estimated_gain_s is not None  # the probe timed torchspeed's step
    # No convolution: no channels_last trial.
    assert not any(r.rule == "channels_last" for r in rows)
    # num_workers=0 with 16 ms of per-batch work in the training process: more workers, and the
    # headspace run (the data in memory) whose gain is about the whole data wait.
    assert any(k.endswith("loader workers") for k in by_fix), by_fix
    head = by_fix["headspace (data in memory)"]
    assert head.phase_gain_s > 0.008, head  # 16 samples x 1 ms of busy work per batch, less noise
    text = _doctor_verify_text(rows)
    for r in rows:
        assert r.fix in text
    _assert_hooks_removed()
    for name in ("AdamW", "SGD", "Adam"):
        assert getattr(torch.optim, name).__module__.startswith("torch.optim")


def _doctor_verify_text(rows):
    from torchspeed.profile.verify import format_rows

    text = format_rows(rows, 5)
    assert "phase gain" in text and "estimated" in text and "est/meas" in text
    return text


def test_the_table_says_when_the_runs_as_the_script_is_disagree():
    """A new user's loaded machine: the first run as the script is took 72 ms a step, the last
    0.5 ms; the table said nothing, and the fixes' gains read as measured."""
    from torchspeed.profile.verify import VerifyRow, format_rows

    def rows(first, last):
        return [
            VerifyRow("as the script is", "", None, first, 0.0, 0.0),
            VerifyRow("bf16 autocast", "amp", 0.001, 0.0009, 0.0003, 0.01, 0.0002, ("forward",)),
            VerifyRow("as the script is, again", "", None, last, 0.0, 0.0),
        ]

    noisy = format_rows(rows(0.072, 0.0005), 8)
    assert "took 0.5 ms and 72.0 ms a step: the machine's speed moved" in noisy, noisy
    assert "speed moved" not in format_rows(rows(0.0005, 0.0006), 8)


def test_est_meas_needs_a_measured_gain_the_table_can_show():
    """A phase gain that prints as 0.0 ms gets no ratio (it read 554.31 on the demo)."""
    from torchspeed.profile.verify import VerifyRow, format_rows

    def line(gain):
        rows = [
            VerifyRow("as the script is", "", None, 0.1, 0.0, 0.0),
            VerifyRow("torch.compile(model)", "compile", 0.0149, 0.08, 0.002, 0.0, gain, ("x",)),
        ]
        return format_rows(rows, 8).splitlines()[3]

    assert line(0.0149).split()[9] == "1.00"
    assert line(0.0000269).split()[9] == "-"
    assert line(-0.0100).split()[9] == "-1.49"


def test_verify_tries_channels_last_on_a_cpu_conv_net(tmp_path, monkeypatch):
    rows, by_fix = _rows(tmp_path, monkeypatch, _CONV_SCRIPT, 5)
    cl = [r for r in rows if r.rule == "channels_last"]
    assert len(cl) == 1, rows
    cl = cl[0]
    assert cl.fix == ("channels_last" if cl.advised else "channels_last (not advised)")
    assert cl.estimated_gain_s is not None  # the probe measured the model in both layouts
    assert cl.paired  # side by side: on every other step of one run
    # The same math in another memory layout: the losses agree to rounding.
    assert cl.loss_drift is not None and cl.loss_drift < 1e-3, cl
    # SGD with a torchspeed counterpart: tried too, below the threshold or not.
    assert any(r.rule == "optimizer" for r in rows)
    _assert_hooks_removed()


def test_channels_last_trial_converts_the_model_and_inputs_and_unhooks():
    from torchspeed.profile.verify import channels_last

    seen = []
    model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.ReLU())
    model.register_forward_pre_hook(lambda m, a: seen.append(a[0]))
    params = list(model.parameters())
    with channels_last():
        model(torch.randn(2, 3, 8, 8))
    assert seen[0].is_contiguous(memory_format=torch.channels_last)
    assert model[0].weight.is_contiguous(memory_format=torch.channels_last)
    assert all(a is b for a, b in zip(params, model.parameters()))  # the optimizer's objects
    model(torch.randn(2, 3, 8, 8))
    assert not seen[1].is_contiguous(memory_format=torch.channels_last)  # the hook is gone


def test_channels_last_side_by_side_switches_the_model_only_where_asked(monkeypatch):
    """On an every-other-step run: the model in channels_last on the fix's forwards and back in
    NCHW on the others, copied only at a switch; the inputs converted only on the fix's."""
    from torchspeed.profile.verify import channels_last

    seen = []
    model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.ReLU())
    model.register_forward_pre_hook(lambda m, a: seen.append(a[0]))
    params = list(model.parameters())
    x = torch.randn(2, 3, 8, 8)
    want = model(x).detach()
    seen.clear()
    copies = []
    real_to = nn.Module.to

    def counting_to(self, *a, **kw):
        copies.append(kw.get("memory_format"))
        return real_to(self, *a, **kw)

    monkeypatch.setattr(nn.Module, "to", counting_to)
    pattern = [True, False, False, True, True, False]
    it, layouts = iter(pattern), []
    with channels_last(when=lambda: next(it)):
        for _ in pattern:
            torch.testing.assert_close(model(x), want, rtol=1e-5, atol=1e-6)
            layouts.append(model[0].weight.is_contiguous(memory_format=torch.channels_last))
    assert layouts == pattern
    assert [a.is_contiguous(memory_format=torch.channels_last) for a in seen] == pattern
    cl, nchw = torch.channels_last, torch.contiguous_format
    assert copies == [cl, nchw, cl, nchw]  # at the switches only
    assert all(a is b for a, b in zip(params, model.parameters()))  # the optimizer's objects


def test_cudnn_benchmark_trial_works_where_torch_froze_the_global_flags():
    """torch's test utilities (imported by opcheck) freeze torch.backends' flags: assigning
    cudnn.benchmark then raises. The trial (and the demo's third run) set it through torch's own
    setter, and restore it, leaving the other cudnn flags as they were."""
    torch.backends.disable_global_flags()  # what torch.testing._internal.common_utils does
    with pytest.raises(RuntimeError, match="not allowed to set"):
        torch.backends.cudnn.benchmark = True
    before = (torch.backends.cudnn.benchmark, torch.backends.cudnn.enabled)
    with verify.cudnn_benchmark():
        assert torch.backends.cudnn.benchmark is True
        assert torch.backends.cudnn.enabled == before[1]
    assert (torch.backends.cudnn.benchmark, torch.backends.cudnn.enabled) == before


def test_cpu_threads_trial_sets_the_advised_threads_and_restores_them(monkeypatch):
    """The cpu_threads finding becomes a trial that runs the script with the advised torch
    threads (cores - loader workers), restored after."""
    from torchspeed.profile import rules
    from torchspeed.profile.summary import Finding, RunFacts

    monkeypatch.setattr(rules, "_load", lambda: (1.0, 3))
    loader = torch.utils.data.DataLoader(list(range(4)), num_workers=1)
    facts = RunFacts(loaders=[loader], torch_threads=3)
    found = [Finding("cpu_threads", "warning", "t", "f")]
    trials = [t for t in verify._fixes(found, facts) if t[1] == "cpu_threads"]
    assert [t[0] for t in trials] == ["2 torch threads"]
    before = torch.get_num_threads()
    with trials[0][2]():
        assert torch.get_num_threads() == 2
    assert torch.get_num_threads() == before
    # Checked against the step: preemption stalls land in every phase.
    assert verify.PHASES_OF["cpu_threads"] == ("step",)


def test_compute_fixes_are_tried_on_top_of_the_threads_fix(monkeypatch):
    """With cpu_threads found, it runs first and bf16 autocast / channels_last run under it,
    measured against the threads run, their estimates scaled to that run's forward+backward."""
    from test_advice import make_summary

    from torchspeed.profile import rules
    from torchspeed.profile.summary import Finding, RunFacts

    monkeypatch.setattr(rules, "_load", lambda: (1.0, 2))
    loader = torch.utils.data.DataLoader(list(range(4)), num_workers=2)
    facts = RunFacts(loaders=[loader], torch_threads=2, probes={"bf16": 0.5, "fp32_s": 0.02})
    base = make_summary(0.100, {"forward": 0.040, "backward": 0.040})  # fwd+bwd 80 ms
    threads_run = make_summary(0.050, {"forward": 0.020, "backward": 0.020})  # 40 ms
    both = make_summary(0.035, {"forward": 0.012, "backward": 0.013})  # 25 ms
    found = [
        Finding("amp", "warning", "t", "f", est_step_s=0.06, est_gain_s=0.04),
        Finding("cpu_threads", "warning", "t", "f", est_step_s=0.04, est_gain_s=0.06),
    ]
    seen = []

    def run_steps(ctx, advise):
        with ctx:
            seen.append(torch.get_num_threads())
            if advise:
                return base, [1.0], found, facts
            runs = {2: threads_run, 3: both}
            return runs.get(len(seen), base), [1.0], [], None

    before = torch.get_num_threads()
    rows = {r.fix: r for r in verify.verify(run_steps)}
    assert torch.get_num_threads() == before
    assert seen[1:3] == [1, 1]  # the threads trial, then bf16 under it
    t = rows["1 torch thread"]
    assert t.phases == ("step",) and t.phase_gain_s == pytest.approx(0.100 - 0.050)
    amp = rows["bf16 autocast + 1 torch thread"]
    assert amp.phase_gain_s == pytest.approx(0.040 - 0.025)  # against the threads run
    assert amp.measured_gain_s == pytest.approx(0.050 - 0.035)
    assert amp.estimated_gain_s == pytest.approx(0.04 * 0.040 / 0.080)  # scaled to 40 ms


def test_alternating_applies_the_fix_on_one_step_of_each_pair_drawn_at_random():
    """bf16 autocast on one step of every two, the step of each pair drawn (a strict odd/even
    order beats in step with two loader workers taking batches in turn); halves() splits the
    run's steps into those without the fix and those with it."""
    import io

    torch.manual_seed(0)
    model = nn.Linear(8, 8)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    dtypes = []
    fix = verify.Alternating(verify.autocast_bf16, seed=1)
    with fix, _doctor.doctor(out=None, progress=False, file=io.StringIO(), probe=False) as prof:
        for _ in range(16):
            out = model(torch.randn(4, 8))
            dtypes.append(out.dtype)
            out.float().square().mean().backward()
            opt.step()
            opt.zero_grad()
    on = [fix.applied_at(i) for i in range(16)]
    assert [d == torch.bfloat16 for d in dtypes] == on
    assert all(on[2 * k] != on[2 * k + 1] for k in range(8))
    assert on != [i % 2 == 1 for i in range(16)] and on != [i % 2 == 0 for i in range(16)]
    off_s, on_s = fix.halves()
    # Each half less its first step (warm-up): one step fewer than the run's summary has (it
    # leaves out the first step, and the step torch.profiler recorded, as the halves do).
    assert off_s.steps + on_s.steps == prof.summary(gather=False).steps - 1
    assert min(off_s.steps, on_s.steps) >= 5 and prof.steps == 16
    _assert_hooks_removed()
    assert not torch.is_autocast_enabled("cpu")


def test_a_paired_fix_is_measured_against_its_own_runs_other_steps(monkeypatch):
    """An Alternating fix's gains are its run's steps without it minus its steps, whatever the
    runs as the script is around it took (the machine's speed moved between runs); its estimate
    is scaled to those other steps' forward+backward."""
    from test_advice import make_summary

    from torchspeed.profile.summary import Finding, RunFacts

    base = make_summary(0.100, {"forward": 0.040, "backward": 0.040})  # fwd+bwd 80 ms
    slow = make_summary(0.300, {"forward": 0.120, "backward": 0.120})  # a disturbed run
    off = make_summary(0.120, {"forward": 0.050, "backward": 0.050})  # fwd+bwd 100 ms
    on = make_summary(0.090, {"forward": 0.035, "backward": 0.035})  # 70 ms
    found = [Finding("amp", "warning", "t", "f", est_step_s=0.07, est_gain_s=0.024)]
    monkeypatch.setattr(verify.Alternating, "halves", lambda self: (off, on))
    runs = iter([base, on, slow])

    def run_steps(ctx, advise):
        with ctx:
            s = next(runs)
        return (s, [1.0], found, RunFacts()) if advise else (s, [1.0], [], None)

    rows = {r.fix: r for r in verify.verify(run_steps)}
    amp = rows["bf16 autocast"]
    assert amp.paired
    assert amp.step_median_s == pytest.approx(0.090)
    assert amp.measured_gain_s == pytest.approx(0.030)  # 120 - 90 ms, not against 100 / 300
    assert amp.phase_gain_s == pytest.approx(0.030)  # 100 - 70 ms
    # The estimate (24 ms of the first run's 80 ms forward+backward: x0.7) applied to the other
    # steps' 100 ms.
    assert amp.estimated_gain_s == pytest.approx(0.024 * 0.100 / 0.080)
    assert "every two of its run" in verify.format_rows(list(rows.values()), 8)


def test_alternating_records_each_steps_cpu_time_on_one_torch_thread():
    """Steps whose work is known: the fix's steps spin 20 ms of CPU more in their forward. On one
    torch thread the halves' CPU medians show it (forward to the optimizer step: the 10 ms the
    data fetch spins before each forward does not count); on two, CPU time is no measure
    (spin-waits) and none is given."""
    import io

    def busy(when):
        def pre(module, args):
            if when():
                t0 = time.process_time()
                while time.process_time() - t0 < 0.02:
                    pass

        return verify._global_forward_hooks(pre, lambda *a: None)

    def run(threads, lbfgs=False):
        model = nn.Linear(8, 8)
        if lbfgs:  # the forward runs inside the optimizer step (its closure)
            opt = torch.optim.LBFGS(model.parameters(), lr=0.01, max_iter=1)
        else:
            opt = torch.optim.SGD(model.parameters(), lr=0.01)
        x = torch.randn(4, 8)

        def closure():
            opt.zero_grad()
            loss = model(x).sum()
            loss.backward()
            return loss

        fix = verify.Alternating(busy, seed=2)
        fix.also.append(lambda: verify.torch_threads(threads))
        with fix, _doctor.doctor(out=None, progress=False, file=io.StringIO(), probe=False):
            for _ in range(12):
                t0 = time.process_time()
                while time.process_time() - t0 < 0.01:  # the batch's fetch: not forward's
                    pass
                if lbfgs:
                    opt.step(closure)
                else:
                    closure()
                    opt.step()
        return fix.cpu_halves()

    for lbfgs in (False, True):
        off, on = run(1, lbfgs)
        assert on - off == pytest.approx(0.02, abs=0.005), (lbfgs, off, on)
        assert 0 < off < 0.005, (lbfgs, off)  # a tiny Linear's forward+backward, no fetch
    assert run(2) is None


def test_step_cpu_times_forward_to_the_optimizer_step_of_a_whole_run():
    """StepCpu around a run (a fix's trial): a forward that spins 10 ms of CPU after a fetch that
    spins 5 ms reads 10 ms a step on one torch thread; on two, no figure."""
    import io

    class Spin(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(4, 4)

        def forward(self, x):
            t0 = time.process_time()
            while time.process_time() - t0 < 0.01:
                pass
            return self.lin(x)

    def run(threads):
        model = Spin()
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        clock = verify.StepCpu()
        with verify.torch_threads(threads), clock:
            with _doctor.doctor(out=None, progress=False, file=io.StringIO(), probe=False):
                for _ in range(8):
                    t0 = time.process_time()
                    while time.process_time() - t0 < 0.005:
                        pass
                    model(torch.randn(2, 4)).sum().backward()
                    opt.step()
                    opt.zero_grad()
        return clock.median_s()

    assert run(1) == pytest.approx(0.010, abs=0.003)
    assert run(2) is None


def test_a_paired_fix_on_one_thread_is_checked_in_cpu_time(monkeypatch):
    """On one torch thread the bf16 row's phase gain is the drop of forward+backward's CPU time,
    and its estimate that CPU time in the run's steps without the fix x (1 - the probed ratio)."""
    from test_advice import make_summary

    from torchspeed.profile.summary import Finding, RunFacts

    s = make_summary(0.100, {"forward": 0.040, "backward": 0.040})
    found = [Finding("amp", "warning", "t", "f", est_step_s=0.08, est_gain_s=0.020)]  # x0.75
    facts = RunFacts(probes={"bf16": 0.75, "fp32_s": 0.048})
    monkeypatch.setattr(verify.Alternating, "halves", lambda self: (s, s))
    monkeypatch.setattr(verify.Alternating, "cpu_halves", lambda self: (0.055, 0.041))

    def run_steps(ctx, advise):
        with ctx:
            pass
        return (s, [1.0], found, facts) if advise else (s, [1.0], [], None)

    amp = {r.fix: r for r in verify.verify(run_steps)}["bf16 autocast"]
    assert amp.phases == (verify.CPU_TIME,) and amp.paired
    assert amp.phase_gain_s == pytest.approx(0.014)
    assert amp.estimated_gain_s == pytest.approx(0.055 * 0.25)
    text = verify.format_rows([amp], 8)
    assert "cpu time" in text and "drop of forward+backward's CPU time" in text


@pytest.mark.parametrize("ratio_probed", [True, False])
def test_a_ratio_estimate_applies_to_the_runs_the_fix_is_measured_against(ratio_probed):
    """The optimizer's estimate is the first run's optimizer phase x (1 - torchspeed's step / the
    script's own): the same ratio of the runs as the script is around the trial. The demo's
    optimizer step is bimodal (2 or 6 ms a step), and the first run's median landed on either
    mode. Without the script's own step probed, the estimate is no ratio and stays."""
    from test_advice import make_summary

    from torchspeed.profile.summary import Finding, RunFacts

    def summ(opt_s):
        return make_summary(0.100, {"forward": 0.040, "backward": 0.040, "optimizer": opt_s})

    probes = {"fused_optimizer_s": 0.001}
    if ratio_probed:
        probes["own_optimizer_s"] = 0.004
    facts = RunFacts(probes=probes)
    found = [Finding("optimizer", "warning", "t", "f", est_step_s=0.0985, est_gain_s=0.0015)]
    runs = iter([summ(0.002), summ(0.001), summ(0.006)])  # as is, the fix, as is again

    def run_steps(ctx, advise):
        with ctx:
            s = next(runs)
        return (s, [1.0], found, facts) if advise else (s, [1.0], [], None)

    row = next(r for r in verify.verify(run_steps) if r.rule == "optimizer")
    assert row.phase_gain_s == pytest.approx(0.004 - 0.001)  # the mean of 2 and 6 ms, less 1
    want = 0.0015 * 0.004 / 0.002 if ratio_probed else 0.0015
    assert row.estimated_gain_s == pytest.approx(want)


def test_a_fix_on_top_of_the_threads_fix_is_checked_in_cpu_time(monkeypatch):
    """torch.compile tried on top of one torch thread: both runs' forward+backward CPU time is
    recorded (StepCpu), and the row compares them; its estimate (the first run's 20 of 80 ms:
    a quarter saved) is a quarter of the threads run's CPU time."""
    from test_advice import make_summary

    from torchspeed.profile import rules
    from torchspeed.profile.summary import Finding, RunFacts

    monkeypatch.setattr(rules, "_load", lambda: (1.0, 2))
    loader = torch.utils.data.DataLoader(list(range(4)), num_workers=1)
    facts = RunFacts(loaders=[loader], torch_threads=2)
    s = make_summary(0.100, {"forward": 0.040, "backward": 0.040})
    found = [
        Finding("compile", "warning", "t", "f", est_step_s=0.08, est_gain_s=0.020),
        Finding("cpu_threads", "warning", "t", "f", est_step_s=0.08, est_gain_s=0.020),
    ]
    cpus = iter([0.050, 0.040])  # the threads run's, then compile's on top of it
    monkeypatch.setattr(
        verify.StepCpu,
        "median_s",
        lambda self, steps=None, system=False: None if system else next(cpus),
    )

    def run_steps(ctx, advise):
        with ctx:
            pass
        return (s, [1.0], found, facts) if advise else (s, [1.0], [], None)

    rows = {r.rule: r for r in verify.verify(run_steps)}
    cl = rows["compile"]
    assert cl.phases == (verify.CPU_TIME,) and not cl.paired
    assert cl.phase_gain_s == pytest.approx(0.010)
    assert cl.estimated_gain_s == pytest.approx(0.25 * 0.050)
    assert rows["cpu_threads"].phases == ("step",)  # the threads fix: against the step
    assert "CPU time against the run with 1 torch thread" in verify.format_rows(
        list(rows.values()), 8
    )


def test_rounds_take_the_median_gain_against_the_runs_around_each_round(monkeypatch):
    """--verify-rounds: every fix once per round, a run as the script is between the rounds; one
    disturbed round does not decide the row."""
    from test_advice import make_summary

    from torchspeed.profile.summary import Finding, RunFacts

    def summ(ms):
        return make_summary(ms / 1e3, {"forward": ms / 2e3, "backward": ms / 4e3})

    found = [Finding("amp", "warning", "t", "f", est_step_s=0.07, est_gain_s=0.03)]
    # base, amp (round 0), base, amp (round 1, disturbed), base, amp (round 2), base
    seq = iter([100, 60, 100, 200, 100, 64, 100])

    def run_steps(ctx, advise):
        with ctx:
            s = summ(next(seq))
        return (s, [1.0], found, RunFacts()) if advise else (s, [1.0], [], None)

    rows = {r.fix: r for r in verify.verify(run_steps, rounds=3)}
    amp = rows["bf16 autocast"]
    assert amp.step_median_s == pytest.approx(0.064)
    assert amp.measured_gain_s == pytest.approx(0.036)  # median of 40, -100, 36 ms
    assert amp.phase_gain_s == pytest.approx(0.036 * 0.75)
    assert rows["as the script is, again"].step_median_s == pytest.approx(0.1)
    with pytest.raises(StopIteration):
        next(seq)  # 1 + 3 rounds x 1 fix + 2 runs between/after = 7 runs
    text = verify.format_rows(list(rows.values()), 5, rounds=3)
    assert "3 rounds" in text


def test_no_more_workers_trial_for_a_loader_that_has_workers():
    """more_workers changes only num_workers=0 loaders: a data_wait finding on a loader with
    workers gets the headspace run, not a no-op trial named "N loader workers"."""
    from torchspeed.profile.summary import Finding, RunFacts

    found = [Finding("data_wait", "warning", "t", "f")]
    with_workers = RunFacts(loaders=[torch.utils.data.DataLoader([0, 1], num_workers=2)])
    names = [t[0] for t in verify._fixes(found, with_workers)]
    assert names == ["headspace (data in memory)"], names
    without = RunFacts(loaders=[torch.utils.data.DataLoader([0, 1])])
    names = [t[0] for t in verify._fixes(found, without)]
    assert any(n.endswith("loader workers") for n in names) and names[-1].startswith("headspace")


# ---- torch.compile ----------------------------------------------------------------------------
class _Chain(nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(16, 16)

    def forward(self, x):
        h = self.proj(x).repeat(1, 64)
        for _ in range(6):
            h = torch.tanh(h * 1.5 + 0.5)
        return h


def _compiled_losses(steps, trial):
    """Losses of `steps` steps of _Chain under the doctor, with `trial` (a CompiledModel or
    None) around it; the profiler and the model's own attributes seen inside."""
    import io

    torch.manual_seed(0)
    model = _Chain()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x = torch.randn(8, 16)
    losses, inside = [], {}
    ctx = trial if trial is not None else contextlib.nullcontext()
    with ctx:
        with _doctor.doctor(out=None, progress=False, file=io.StringIO(), probe=False) as prof:
            for _ in range(steps):
                loss = model(x).square().mean()
                loss.backward()
                opt.step()
                opt.zero_grad()
                losses.append(float(loss.detach()))
            inside["patched"] = "forward" in vars(model)
        inside["summary"] = prof.summary(gather=False)
        inside["excluded"] = list(prof.excluded_steps)
    inside["after"] = "forward" in vars(model)
    return losses, inside


def test_compile_trial_compiles_the_forward_leaves_the_compiling_steps_out_and_restores():
    torch._dynamo.reset()
    ref, _ = _compiled_losses(8, None)
    trial = verify.CompiledModel(backend="eager")
    losses, inside = _compiled_losses(8, trial)
    # "eager": dynamo's captured graph run by ATen, the same ops: the same losses.
    assert losses == ref
    assert inside["patched"] and not inside["after"]
    # The first forward runs eager (the hook compiles it for the next), the second compiles:
    # step 1 and the COMPILE_SETTLE_STEPS after it are left out, beside the warmup (step 0) and
    # the operator-sampled steps (4, 5).
    settle = verify.COMPILE_SETTLE_STEPS
    assert inside["excluded"] == list(range(1, 2 + settle))
    kept = [i for i in range(8) if i not in inside["excluded"] and i not in (4, 5)][1:]
    assert inside["summary"].steps == len(kept)
    assert verify.last_compile["steps"] == 1 + settle and verify.last_compile["compile_s"] >= 0
    torch._dynamo.reset()


def test_a_copy_or_pickle_of_the_model_during_the_compile_trial_is_the_plain_model():
    """A script that deep-copies (an EMA, a best-model copy) or pickles its model mid-run: the
    copy has no trial forward (it would run the original's weights) and pickles."""
    import copy
    import io
    import pickle

    torch._dynamo.reset()
    model = _Chain()
    with verify.CompiledModel(backend="eager"):
        with _doctor.doctor(out=None, progress=False, file=io.StringIO(), probe=False):
            for _ in range(3):
                model(torch.randn(8, 16)).sum().backward()
            assert "forward" in vars(model)
            twin = copy.deepcopy(model)
            thawed = pickle.loads(pickle.dumps(model))
    assert "forward" not in vars(twin) and "forward" not in vars(thawed)
    with torch.no_grad():
        twin.proj.weight.add_(1.0)
        x = torch.randn(8, 16)
        assert not torch.equal(twin(x), model(x))  # the copy runs its own weights
        torch.testing.assert_close(thawed(x), model(x), rtol=0, atol=0)
    torch._dynamo.reset()


def test_compile_trial_leaves_a_model_the_script_compiled_alone():
    import io

    torch._dynamo.reset()
    model = _Chain()
    compiled = torch.compile(model, backend="eager")
    with verify.CompiledModel(backend="eager") as trial:
        with _doctor.doctor(out=None, progress=False, file=io.StringIO(), probe=False):
            for _ in range(3):
                compiled(torch.randn(8, 16)).sum().backward()
        assert trial.patched == [] and "forward" not in vars(model)
    torch._dynamo.reset()


def test_compile_trial_that_fails_to_compile_runs_on_eagerly_and_says_why():
    def broken_backend(gm, example_inputs):
        raise RuntimeError("no kernels today")

    torch._dynamo.reset()
    ref, _ = _compiled_losses(6, None)
    trial = verify.CompiledModel(backend=broken_backend)
    losses, inside = _compiled_losses(6, trial)
    assert losses == ref and inside["excluded"] == []
    assert "BackendCompilerFailed" in trial.error and verify.last_compile["error"] == trial.error
    row = verify.VerifyRow("torch.compile(model)", "compile", 0.01, 0.1, 0.0, 0.0,
                           compile_s=0.0, compile_error=trial.error)  # fmt: skip
    assert "torch.compile failed (BackendCompilerFailed" in verify.format_rows([row], 6)
    torch._dynamo.reset()


_CHAIN_SCRIPT = """
import torch
from torch import nn
torch.manual_seed(0)
class Chain(nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(16, 16)
    def forward(self, x):
        h = self.proj(x).repeat(1, 256)
        for _ in range(6):
            h = torch.tanh(h * 1.5 + 0.5)
        return h
model = Chain()
opt = torch.optim.SGD(model.parameters(), lr=0.1)
x = torch.randn(32, 16)
for _ in range(10):
    model(x).square().mean().backward()
    opt.step(); opt.zero_grad()
"""


def test_verify_tries_torch_compile_where_pointwise_ops_dominate(tmp_path, monkeypatch):
    torch._dynamo.reset()
    monkeypatch.setattr(verify, "COMPILE_BACKEND", "eager")
    rows, by_fix = _rows(tmp_path, monkeypatch, _CHAIN_SCRIPT, 8)
    row = by_fix["torch.compile(model)"]
    assert row.rule == "compile" and row.advised and row.phases == ("forward", "backward")
    assert row.estimated_gain_s is not None and row.estimated_gain_s > 0
    assert row.compile_s is not None and row.compile_s >= 0
    assert row.loss_drift == 0.0  # the eager backend runs the same ops
    text = verify.format_rows(rows, 8)
    assert "torch.compile(model): the compiling steps took" in text
    torch._dynamo.reset()


def test_compile_trial_with_inductor_matches_eager_losses(monkeypatch):
    """The real backend, on a tiny model (a C++ build of its kernels: seconds to a minute on 2
    cores, cached by inductor after): the compiled steps' losses match eager's to float32
    rounding, and the compiling steps' time is reported."""
    from torchspeed.profile.facts import compile_unavailable

    if compile_unavailable("cpu"):
        pytest.skip(f"torch.compile unavailable: {compile_unavailable('cpu')}")
    torch._dynamo.reset()
    ref, _ = _compiled_losses(6, None)
    losses, inside = _compiled_losses(6, verify.CompiledModel(backend="inductor"))
    torch.testing.assert_close(losses, ref, rtol=1e-4, atol=1e-6)
    assert inside["patched"] and not inside["after"] and inside["excluded"]
    assert verify.last_compile["compile_s"] > 0
    torch._dynamo.reset()
