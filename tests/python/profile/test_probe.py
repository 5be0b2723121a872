"""The doctor's probes (torchspeed.profile.probe) and the rules that read them: bf16 autocast is
advised on a CPU only where the probe measured it faster (else the report says why not), a CPU
conv net gets channels_last where the probe measured it faster, and the optimizer estimate is the
phase minus torchspeed's measured step. Rule tests feed fixed probe values (decisions, not
timings); the probe tests check what it measures is consistent, not how fast this machine is."""

import math

import pytest
import torch
from test_advice import REL, _by_rule, make_summary
from torch import nn

from torchspeed.profile import probe, rules
from torchspeed.profile.advice import advise
from torchspeed.profile.summary import RunFacts


def _convnet():
    return nn.Sequential(
        nn.Conv2d(3, 8, 3, padding=1, bias=False),
        nn.BatchNorm2d(8),
        nn.ReLU(),
        nn.Conv2d(8, 8, 3, padding=1),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(8, 4),
    )


# ---- rules over fixed probe values ------------------------------------------------------------
_S = dict(step_s=0.100, phase_s={"forward": 0.030, "backward": 0.050, "optimizer": 0.010})


def test_bf16_slower_on_this_cpu_is_not_advised_and_says_why():
    s = make_summary(**_S)
    out = _by_rule(advise(s, RunFacts(models=[_convnet()], probes={"bf16": 4.0})))
    assert "amp" not in out
    f = out["amp_not_advised"]
    assert f.severity == "info" and f.est_gain_s == 0.0
    assert "4.00x as long" in f.detail and "keep float32" in f.fix
    # Native bf16 claimed by cpuinfo, but the measurement says slower: the measurement wins.
    out = _by_rule(
        advise(s, RunFacts(models=[_convnet()], bf16_capable_cpu=True, probes={"bf16": 1.2}))
    )
    assert "amp" not in out and "native bf16" in out["amp_not_advised"].detail


def test_bf16_measured_faster_is_advised_with_the_measured_ratio():
    s = make_summary(**_S)
    f = _by_rule(advise(s, RunFacts(models=[_convnet()], probes={"bf16": 0.6})))["amp"]
    assert f.est_gain_s == pytest.approx(0.080 * 0.4, rel=REL)
    assert "x0.60" in f.detail
    # Within the probe's spread of float32 (under 10 % faster): not advised.
    out = _by_rule(advise(s, RunFacts(models=[_convnet()], probes={"bf16": 0.95})))
    assert "amp" not in out and "amp_not_advised" in out


def test_bf16_unmeasured_falls_back_to_the_cpu_flags():
    s = make_summary(**_S)
    no_native = _by_rule(advise(s, RunFacts(models=[_convnet()])))
    assert "amp" not in no_native and "no native bf16" in no_native["amp_not_advised"].detail
    native = _by_rule(advise(s, RunFacts(models=[_convnet()], bf16_capable_cpu=True)))
    assert native["amp"].est_gain_s == pytest.approx(0.080 * (1 - rules.AMP_CPU_BF16), rel=REL)
    # No model seen: nothing to say about its precision.
    assert "amp_not_advised" not in _by_rule(advise(s, RunFacts()))


def test_cpu_threads_fires_when_threads_and_loader_workers_exceed_the_cores(monkeypatch):
    """torch threads + loader workers above the cores: advise the threads that leave each worker
    a core, estimated from the probe's one-thread forward+backward; quiet when they fit, when the
    probe says it would not pay, or without a probe."""
    monkeypatch.setattr(rules, "_load", lambda: (1.0, 2))
    s = make_summary(**_S)  # forward+backward 80 ms
    loader = torch.utils.data.DataLoader(list(range(8)), num_workers=2)

    def facts(**kw):
        base = dict(models=[_convnet()], loaders=[loader], torch_threads=2, probes={"fp32_s": 0.05})
        base.update(kw)
        return RunFacts(**base)

    f = _by_rule(advise(s, facts()))["cpu_threads"]
    assert f.est_gain_s == pytest.approx(0.080 - 0.050, rel=REL)
    assert "torch.set_num_threads(1)" in f.fix and "2 torch threads and 2 loader workers" in f.title
    assert rules.verify_estimates(s, facts())["cpu_threads"] == pytest.approx(0.030, rel=REL)
    # With autocast in the run, the one-thread time is the bf16 one.
    f = _by_rule(advise(s, facts(autocast_used=True, probes={"fp32_s": 0.05, "bf16": 0.5})))
    assert f["cpu_threads"].est_gain_s == pytest.approx(0.080 - 0.025, rel=REL)
    # 2 workers on 2 cores: 1 thread is the fewest, and the fix says so.
    assert "the workers alone fill the cores" in f["cpu_threads"].fix
    # A step of 4 micro-batches runs 4 forward+backward: one thread would not be faster.
    assert "cpu_threads" not in _by_rule(advise(s, facts(train_forwards_per_step=4.0)))
    # Two models (a GAN): the probe timed one of them, no estimate.
    assert "cpu_threads" not in _by_rule(advise(s, facts(models=[_convnet(), _convnet()])))
    # A torchspeed loader over torch's is seen twice (wrapper and inner): the largest, not the sum.
    two = [loader, torch.utils.data.DataLoader(list(range(8)), num_workers=2)]
    assert rules._loader_workers(facts(loaders=two)) == 2
    # The run's loaders are gone by the time the rules run: the most workers the run saw.
    assert "cpu_threads" in _by_rule(advise(s, facts(loaders=[], loader_workers=2)))
    for quiet in (
        facts(torch_threads=1, loaders=[torch.utils.data.DataLoader([0], num_workers=1)]),  # fits
        facts(loaders=[]),  # no loader workers
        facts(probes={"fp32_s": 0.075}),  # one thread would not be 10 % faster
        facts(probes={}),  # not measured
        facts(device_type="cuda"),
    ):
        assert "cpu_threads" not in _by_rule(advise(s, quiet))


def test_threads_estimate_leaves_torch_the_cores_the_loader_does_not_use():
    """est = one / min(threads, cores - loader / (step - fb + est)): the fixed point, against its
    closed form (a quadratic) where the loader takes more than the other cores."""
    # No loader CPU known, or a loader that leaves the other cores free: one-thread time / n.
    assert rules.threads_estimate(0.05, 1, 2, None, 0.1, 0.08) == (0.05, 2.0)
    assert rules.threads_estimate(0.06, 2, 4, 0.0, 0.1, 0.08)[0] == pytest.approx(0.03, rel=REL)
    assert rules.threads_estimate(0.05, 1, 2, 0.07, 0.1, 0.08)[0] == pytest.approx(0.05, rel=1e-9)
    # 90 ms of loader CPU per step, 20 ms of the step outside forward+backward, 2 cores, 1 thread:
    # est (2 - 0.09 / (0.02 + est)) = 0.05  <=>  2 est^2 - 0.10 est - 0.001 = 0.
    est, free = rules.threads_estimate(0.05, 1, 2, 0.09, 0.1, 0.08)
    want = (0.10 + math.sqrt(0.10**2 + 8 * 0.001)) / 4
    assert est == pytest.approx(want, rel=1e-9)
    assert free == pytest.approx(0.05 / want, rel=1e-9)
    # 2 threads on 4 cores, the loader needs 3 cores at the old step: fewer than 2 left for torch.
    est, free = rules.threads_estimate(0.06, 2, 4, 0.3, 0.1, 0.08)
    assert 0.03 < est and free < 2
    assert est == pytest.approx(0.06 / min(2, 4 - 0.3 / (0.02 + est)), rel=1e-9)
    # A loader that needs every core: nothing left for torch, an estimate far above the phase.
    assert rules.threads_estimate(0.05, 1, 2, 1.0, 0.1, 0.08)[0] > 0.5


def test_cpu_threads_estimate_counts_the_loaders_measured_cpu(monkeypatch):
    monkeypatch.setattr(rules, "_load", lambda: (1.0, 2))
    s = make_summary(**_S)  # forward+backward 80 ms of a 100 ms step
    loader = torch.utils.data.DataLoader(list(range(8)), num_workers=2)
    base = dict(models=[_convnet()], loaders=[loader], torch_threads=2, probes={"fp32_s": 0.05})
    f = _by_rule(advise(s, RunFacts(loader_cpu_s=0.09, **base)))["cpu_threads"]
    want = (0.10 + math.sqrt(0.10**2 + 8 * 0.001)) / 4  # as in the test above
    assert f.est_gain_s == pytest.approx(0.080 - want, rel=1e-9)
    assert "the loader used 90.0 ms of CPU per step" in f.detail
    assert f"({want * 1e3:.1f} ms" not in f.detail and f"-> {want * 1e3:.1f} ms" in f.detail
    est = rules.verify_estimates(s, RunFacts(loader_cpu_s=0.09, **base))["cpu_threads"]
    assert est == pytest.approx(0.080 - want, rel=1e-9)
    # Unmeasured: the best case, said to be one.
    f = _by_rule(advise(s, RunFacts(**base)))["cpu_threads"]
    assert f.est_gain_s == pytest.approx(0.030, rel=REL) and "not measured" in f.detail
    # A loader that keeps both cores busy: one thread would not be faster, quiet.
    assert "cpu_threads" not in _by_rule(advise(s, RunFacts(loader_cpu_s=0.15, **base)))


def test_channels_last_on_cpu_fires_only_when_measured_faster_with_nchw_convs():
    s = make_summary(**_S)
    f = _by_rule(advise(s, RunFacts(models=[_convnet()], probes={"channels_last": 0.7})))
    cl = f["channels_last"]
    assert cl.kind == "breakdown" and cl.est_gain_s == pytest.approx(0.080 * 0.3, rel=REL)
    assert "2 Conv2d layers run in NCHW" in cl.title
    for facts in (
        RunFacts(models=[_convnet()], probes={"channels_last": 0.97}),  # not faster enough
        RunFacts(models=[_convnet()]),  # not measured
        RunFacts(models=[nn.Linear(4, 4)], probes={"channels_last": 0.7}),  # no conv
        RunFacts(
            models=[_convnet().to(memory_format=torch.channels_last)],
            probes={"channels_last": 0.7},
        ),  # already channels_last
    ):
        assert "channels_last" not in _by_rule(advise(s, facts)), facts
    # The model gone (the script returned): the probe's count of NCHW convs still speaks.
    gone = _by_rule(advise(s, RunFacts(probes={"channels_last": 0.7, "nchw_convs": 3.0})))
    assert gone["channels_last"].title.startswith("3 Conv2d layers run in NCHW")


def test_optimizer_estimate_is_the_phase_minus_the_measured_fused_step():
    model = _convnet()
    opt = torch.optim.AdamW(model.parameters(), foreach=False)
    s = make_summary(0.100, {"optimizer": 0.020, "forward": 0.030})
    f = _by_rule(advise(s, RunFacts(optimizers=[opt], probes={"fused_optimizer_s": 0.002})))
    assert f["optimizer"].est_gain_s == pytest.approx(0.018, rel=REL)
    assert "took 2.0 ms here" in f["optimizer"].detail
    # The optimizer objects gone (the script returned): the probe still speaks for them.
    f = _by_rule(advise(s, RunFacts(probes={"fused_optimizer_s": 0.002})))
    assert f["optimizer"].est_gain_s == pytest.approx(0.018, rel=REL)
    # Below the share threshold the rule is quiet; --verify still gets the estimate.
    small = make_summary(0.100, {"optimizer": 0.006, "forward": 0.030})
    facts = RunFacts(optimizers=[opt], probes={"fused_optimizer_s": 0.002})
    assert "optimizer" not in _by_rule(advise(small, facts))
    est = rules.verify_estimates(small, facts)
    assert est["optimizer"] == pytest.approx(0.004, rel=REL)
    assert est["amp"] is None and est["channels_last"] is None


def test_optimizer_estimate_scales_the_phase_by_the_probed_ratio():
    # With the script's own optimizer timed beside torchspeed's (one thread each), their ratio
    # scales the phase the run measured: 20 ms x (2 / 8) -> 5 ms, a 15 ms gain (the one-thread
    # seconds alone would say 18 ms, whatever the run's thread count).
    opt = torch.optim.AdamW(_convnet().parameters(), foreach=False)
    s = make_summary(0.100, {"optimizer": 0.020, "forward": 0.030})
    probes = {"fused_optimizer_s": 0.002, "own_optimizer_s": 0.008}
    for facts in (RunFacts(optimizers=[opt], probes=probes), RunFacts(probes=probes)):
        f = _by_rule(advise(s, facts))["optimizer"]
        assert f.est_gain_s == pytest.approx(0.015, rel=REL)
        assert "2.0 ms against 8.0 ms" in f.detail and "x0.25" in f.detail
    # torchspeed's step slower than the script's own on this CPU: no gain, never a loss.
    slower = {"fused_optimizer_s": 0.009, "own_optimizer_s": 0.008}
    f = _by_rule(advise(s, RunFacts(optimizers=[opt], probes=slower)))["optimizer"]
    assert f.est_gain_s == pytest.approx(0.0, abs=1e-12)


def test_verify_estimates_are_signed():
    s = make_summary(**_S)
    est = rules.verify_estimates(s, RunFacts(probes={"bf16": 3.0, "channels_last": 0.5}))
    assert est["amp"] == pytest.approx(0.080 * (1 - 3.0), rel=REL)  # a loss: negative
    assert est["amp_not_advised"] == est["amp"]
    assert est["channels_last"] == pytest.approx(0.040, rel=REL)


# ---- the probes themselves --------------------------------------------------------------------
def test_probe_measures_ratios_and_restores_rng_and_threads():
    torch.manual_seed(3)
    model = _convnet()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.01)
    threads = torch.get_num_threads()
    state = torch.get_rng_state()
    before = [p.detach().clone() for p in model.parameters()]
    out = probe.probe_run(model, [((4, 3, 16, 16), torch.float32)], [opt])
    assert torch.equal(torch.get_rng_state(), state)
    assert torch.get_num_threads() == threads
    # The user's model is untouched (the probe ran on copies) and keeps its layout.
    for a, b in zip(before, model.parameters()):
        assert torch.equal(a, b.detach()) and b.grad is None
    assert not model[0].weight.is_contiguous(memory_format=torch.channels_last)
    assert set(out) == {
        "bf16",
        "channels_last",
        "fused_optimizer_s",
        "own_optimizer_s",
        "nchw_convs",
        "fp32_s",
    }
    assert 0 < out["fp32_s"] < probe.PROBE_MAX_S
    assert out["nchw_convs"] == 2
    # Ratios of the same work in another form: finite and within a wide band on any CPU.
    for k in ("bf16", "channels_last"):
        assert 0.05 < out[k] < 100, out
    assert 0 < out["fused_optimizer_s"] < 1.0 and 0 < out["own_optimizer_s"] < 1.0


def test_probe_skips_what_it_cannot_measure():
    lin = nn.Linear(4, 4)
    # No conv: no channels_last ratio; integer inputs (token ids): no model probe at all.
    assert set(probe.probe_model(lin, [((2, 4), torch.float32)], ("bf16", "channels_last"))) == {
        "bf16",
        "fp32_s",
    }
    emb = nn.Embedding(10, 4)
    assert probe.probe_model(emb, [((2, 3), torch.int64)], ("bf16",)) == {}
    # A torchspeed optimizer has nothing to be replaced by; an unknown torch one neither.
    from torchspeed.optim import AdamW

    assert probe.probe_run(None, None, [AdamW(lin.parameters())]) == {}
    assert probe.probe_fused_optimizer(torch.optim.Adagrad(lin.parameters())) is None
    # A script optimizer that cannot be copied here (capturable=True needs CUDA): torchspeed's
    # step is still timed, the script's own is not.
    opt = torch.optim.AdamW(lin.parameters(), foreach=False)
    opt.param_groups[0]["capturable"] = True
    fused_s, own_s = probe.probe_fused_optimizer(opt)
    assert fused_s > 0 and own_s is None


_TO_THE_END = """
import torch
from torch import nn
torch.manual_seed(0)
def main():
    model = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1),
                          nn.Flatten(), nn.Linear(8, 4))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    x, y = torch.randn(4, 3, 16, 16), torch.arange(4)
    for _ in range(6):
        nn.functional.cross_entropy(model(x), y).backward()
        opt.step(); opt.zero_grad()
main()
"""


def test_a_script_that_runs_to_its_end_gets_measured_estimates(tmp_path, monkeypatch):
    """The model and optimizer are locals of the script's main(): gone when the script ends,
    before the report. The doctor keeps them (the first of each) until its probes ran, then lets
    them go: the report had fallen back to planning figures for every script run to its end."""
    import gc
    import io

    from torchspeed.profile import _doctor

    script = tmp_path / "train.py"
    script.write_text(_TO_THE_END)
    monkeypatch.chdir(tmp_path)
    argv = _doctor.check_command(["python", str(script)])
    with _doctor.doctor(out=None, progress=False, file=io.StringIO()) as prof:
        _doctor._execute(argv)
    probes = prof.facts().probes  # the report's: the doctor probed as it reported
    assert {"bf16", "channels_last", "fused_optimizer_s", "own_optimizer_s"} <= set(probes)
    # Released once probed: the model the doctor saw is gone.
    gc.collect()
    assert not prof._hooks._probe_subjects and not prof._hooks.models.items()
    assert prof._hooks.models.dead_keys() and prof._hooks.optimizers.dead_keys()
    # Without probes nothing is held: the model goes with the script, as without the doctor.
    with _doctor.doctor(out=None, progress=False, file=io.StringIO(), probe=False) as prof:
        _doctor._execute(argv)
    gc.collect()
    assert not prof._hooks._probe_subjects and not prof._hooks.models.items()


_STOPPED = """
import torch
from torch import nn
def main():
    model = nn.Linear(8, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    data = [(torch.randn(8), i % 2) for i in range(64)]
    loader = torch.utils.data.DataLoader(data, batch_size=4, num_workers=1, persistent_workers=True)
    for x, y in loader:
        nn.functional.cross_entropy(model(x), y).backward()
        opt.step(); opt.zero_grad()
main()
"""


def test_the_probes_of_a_script_stopped_at_its_step_limit_run_without_its_loader_workers(
    tmp_path, monkeypatch
):
    """--steps N stops the script mid-loop: its frames, the loader and its persistent worker
    processes with them, were kept by the traceback until after the report, and the workers,
    decoding the batches they prefetch, took the cores beside the probe (the demo's did). The
    loader's facts stay (the report still reads its num_workers)."""
    import io
    import multiprocessing

    from torchspeed.profile import _doctor

    script = tmp_path / "train.py"
    script.write_text(_STOPPED)
    monkeypatch.chdir(tmp_path)
    children = []
    real = probe.probe_run

    def spy(*args, **kwargs):
        children.append(len(multiprocessing.active_children()))
        return real(*args, **kwargs)

    monkeypatch.setattr(probe, "probe_run", spy)
    argv = _doctor.check_command(["python", str(script)])
    with _doctor.doctor(steps=3, out=None, progress=False, file=io.StringIO()) as prof:
        _doctor._execute(argv)
    assert children == [0]
    assert prof.facts().loaders and prof._hooks.loader_workers == 1
