"""The doctor's rules (torchspeed.profile.rules, .lints, .advice): each injected bottleneck is named first with the
promised arithmetic, each lint fires on a flawed object and not on a sound one, and random phase
splits (hypothesis) rank the dominant phase first and never raise."""

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

import torchspeed
from torchspeed.profile import rules
from torchspeed.profile.advice import advise
from torchspeed.profile.lints import lint
from torchspeed.profile.rules import breakdown_rules
from torchspeed.profile.summary import PHASES, PhaseStat, RunFacts, StepSummary

# Estimates are plain float arithmetic on the same numbers: 1e-9 relative is rounding only.
REL = 1e-9


def make_summary(step_s, phase_s, steps=10, **kw):
    """A StepSummary of identical steps of step_s seconds; phase_s gives some phases' seconds,
    "other" gets the remainder, and every share is the phase's seconds / step_s."""
    given_s = sum(phase_s.values())
    assert given_s <= step_s * (1 + 1e-12), "phases exceed the step"
    secs = {p: float(phase_s.get(p, 0.0)) for p in PHASES}
    secs["other"] += max(step_s - given_s, 0.0)
    phases = {
        p: PhaseStat(
            median_s=s,
            p90_s=s,
            mean_s=s,
            total_s=s * steps,
            share=s / step_s if step_s > 0 else 0.0,
        )
        for p, s in secs.items()
    }
    return StepSummary(
        steps=steps,
        step_median_s=step_s,
        step_p90_s=step_s,
        step_mean_s=step_s,
        total_s=step_s * steps,
        phases=phases,
        **kw,
    )


def _param():
    return [nn.Parameter(torch.zeros(4))]


def _by_rule(findings):
    return {f.rule: f for f in findings}


def test_summary_helper_shares_sum_to_one():
    s = make_summary(0.030, {"data_wait": 0.0123, "forward": 0.006})
    assert sum(s.phases[p].share for p in PHASES) == pytest.approx(1.0, rel=1e-12)
    assert s.phases["other"].median_s == pytest.approx(0.0117, rel=1e-12)


# ---- breakdown scenarios: the injected bottleneck comes first ----------------------------------
def test_data_bound_names_data_wait_first_with_workers_estimate():
    s = make_summary(0.030, {"data_wait": 0.0123, "forward": 0.006, "backward": 0.008})
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.zeros(8)))
    facts = RunFacts(loaders=[loader])
    out = advise(s, facts)
    f = out[0]
    assert f.rule == "data_wait" and f.severity == "critical" and f.kind == "breakdown"
    assert f.title == "data wait is 41% of the step (12.3 ms of 30.0 ms)"
    assert "num_workers=N" in f.fix and "torchspeed.data.DataLoader" in f.fix
    assert "num_workers=0" in f.detail and "torch.utils.data.DataLoader" in f.detail
    expected = 0.030 - 0.0123 * (1 - rules.DATA_WAIT_WITH_WORKERS)
    assert f.est_step_s == pytest.approx(expected, rel=REL)
    assert f.est_gain_s == pytest.approx(0.030 - expected, rel=REL)
    # The lint half names the same loader; it has no estimate, so it ranks after.
    assert [x.rule for x in out] == ["data_wait", "num_workers_zero"]


def test_data_wait_fix_follows_the_loader_facts():
    s = make_summary(0.050, {"data_wait": 0.020})
    ds = torch.utils.data.TensorDataset(torch.zeros(8))
    unpinned = torch.utils.data.DataLoader(ds, num_workers=2, pin_memory=False)
    f = advise(s, RunFacts(device_type="cuda", loaders=[unpinned], autocast_used=True))[0]
    assert f.rule == "data_wait" and "pin_memory=True" in f.fix and "num_workers=4" in f.fix
    assert "num_workers=2, pin_memory=False" in f.detail
    # On CPU pinning is irrelevant: more workers only.
    f = advise(s, RunFacts(loaders=[unpinned]))[0]
    assert "pin_memory" not in f.fix and "num_workers=4) (now 2)" in f.fix
    # torchspeed's loader delegating a torch Dataset reads torch's num_workers.
    ts = torchspeed.data.DataLoader(ds, num_workers=0)
    f = advise(s, RunFacts(loaders=[ts]))[0]
    assert "delegating" in f.detail and "num_workers=0" in f.detail and "num_workers=N" in f.fix
    # A native source: more C++ threads.
    native = torchspeed.data.DataLoader(torchspeed.data.TensorSource(torch.zeros(8, 3)), 2)
    f = advise(s, RunFacts(loaders=[native]))[0]
    assert "native source" in f.detail and "more C++ threads" in f.fix
    assert "num_workers=2) (now 0)" in f.fix
    # All estimates are the same promise: prefetching leaves 10 % of the wait.
    assert f.est_step_s == pytest.approx(0.050 - 0.020 * 0.9, rel=REL)


@pytest.mark.parametrize(
    "make_opt, factor",
    [
        (lambda: torch.optim.AdamW(_param(), foreach=True), rules.OPT_LOOP_TO_FUSED),
        (lambda: torch.optim.AdamW(_param(), foreach=False), rules.OPT_LOOP_TO_FUSED),
        (lambda: torch.optim.SGD(_param(), lr=0.1), rules.OPT_LOOP_TO_FUSED),
        (lambda: torch.optim.AdamW(_param(), fused=True), rules.OPT_TORCH_FUSED_TO_TORCHSPEED),
    ],
    ids=["foreach", "for-loop", "default", "fused"],
)
def test_optimizer_bound_names_optimizer_first(make_opt, factor):
    s = make_summary(0.040, {"optimizer": 0.014, "forward": 0.008, "backward": 0.012})
    opt = make_opt()
    f = advise(s, RunFacts(optimizers=[opt]))[0]
    assert f.rule == "optimizer" and f.severity == "critical"
    assert f.title == "optimizer step is 35% of the step (14.0 ms of 40.0 ms)"
    assert f"torchspeed.optim.{type(opt).__name__}" in f.fix
    assert f.est_step_s == pytest.approx(0.040 - 0.014 * (1 - factor), rel=REL)
    assert f.est_gain_s == pytest.approx(0.014 * (1 - factor), rel=REL)


def test_optimizer_already_torchspeed_estimates_nothing():
    s = make_summary(0.040, {"optimizer": 0.014, "forward": 0.008, "backward": 0.012})
    opt = torchspeed.optim.AdamW(_param(), lr=1e-3)
    (f,) = breakdown_rules(s, RunFacts(optimizers=[opt]))
    assert f.rule == "optimizer" and f.severity == "info"
    assert f.est_step_s is None and f.est_gain_s == 0.0
    assert "already torchspeed" in f.fix and "torchspeed.optim.adam.AdamW" in f.detail


def test_copy_bound_names_h2d_first_on_cuda():
    # Real-looking CUDA facts: no autocast, so the AMP rule fires too, with a smaller gain.
    s = make_summary(0.025, {"h2d": 0.010, "forward": 0.004, "backward": 0.005})
    facts = RunFacts(
        device_type="cuda", counters={"h2d_pageable": 20, "h2d_blocking": 20}, steps=10
    )
    out = advise(s, facts)
    f = out[0]
    assert f.rule == "h2d" and f.severity == "critical"
    assert f.title == "host-to-device copy is 40% of the step (10.0 ms of 25.0 ms)"
    assert "pin_memory=True" in f.fix and "non_blocking=True" in f.fix
    assert "DevicePrefetcher" in f.fix and "20 over 10 steps (2.0 per step)" in f.detail
    assert f.est_step_s == pytest.approx(0.025 - 0.010 * (1 - rules.H2D_OVERLAPPED), rel=REL)
    amp = _by_rule(out)["amp"]
    assert amp.est_gain_s == pytest.approx(0.009 * (1 - rules.AMP_CUDA), rel=REL)
    assert [x.rule for x in out] == ["h2d", "amp", "h2d_pageable", "h2d_blocking"]


def test_comm_bound_names_comm_first_with_accumulation():
    s = make_summary(0.060, {"comm": 0.024, "forward": 0.010, "backward": 0.020}, world_size=8)
    f = advise(s, RunFacts(ddp=True))[0]
    assert f.rule == "comm" and f.severity == "critical"
    assert f.title == "communication is 40% of the step (24.0 ms of 60.0 ms)"
    assert f"AccumulatingDDP(model, accumulation_steps={rules.ACCUM_K})" in f.fix
    assert f.est_step_s == pytest.approx(0.060 - 0.024 * (1 - 1 / rules.ACCUM_K), rel=REL)


def test_comm_advice_reads_k_off_a_real_accumulating_ddp(tmp_path):
    """The rule reads accumulation_steps off torchspeed.dist.AccumulatingDDP itself."""
    import torch.distributed as dist

    from torchspeed.dist import AccumulatingDDP

    group = dist.ProcessGroupGloo(dist.FileStore(str(tmp_path / "store"), 1), 0, 1)
    model = AccumulatingDDP(torch.nn.Linear(4, 4), accumulation_steps=3, process_group=group)
    s = make_summary(0.060, {"comm": 0.024, "forward": 0.010, "backward": 0.020}, world_size=8)
    f = advise(s, RunFacts(ddp=True, models=[model]))[0]
    assert f.rule == "comm" and "accumulation_steps=6" in f.fix and "(now 3)" in f.fix


def test_thresholds_warning_critical_and_the_2ms_floor():
    # 15 % of 30 ms = 4.5 ms: warning; 25 %: critical; 15 % of a 10 ms step = 1.5 ms: quiet.
    assert breakdown_rules(make_summary(0.030, {"comm": 0.0045}), RunFacts())[0].severity == (
        "warning"
    )
    assert breakdown_rules(make_summary(0.030, {"comm": 0.0075}), RunFacts())[0].severity == (
        "critical"
    )
    assert breakdown_rules(make_summary(0.010, {"comm": 0.0015}), RunFacts()) == []
    # 9 % is under the warning share whatever the step's length.
    assert breakdown_rules(make_summary(1.0, {"comm": 0.09}), RunFacts()) == []


def test_amp_rule_device_and_cpu_bf16():
    s = make_summary(0.100, {"forward": 0.030, "backward": 0.050})
    cpu_bf16 = _by_rule(advise(s, RunFacts(bf16_capable_cpu=True)))["amp"]
    assert cpu_bf16.est_step_s == pytest.approx(0.100 - 0.080 * (1 - rules.AMP_CPU_BF16), rel=REL)
    assert 'torch.autocast("cpu"' in cpu_bf16.fix
    assert advise(s, RunFacts()) == []  # a CPU without bf16 math: nothing to win
    assert advise(s, RunFacts(device_type="cuda", autocast_used=True)) == []
    # A model already in bf16 needs no autocast; the same model in fp32 does.
    model = nn.Linear(4, 4)
    assert [f.rule for f in advise(s, RunFacts(device_type="cuda", models=[model]))] == ["amp"]
    assert advise(s, RunFacts(device_type="cuda", models=[model.bfloat16()])) == []
    # forward+backward under 30 %: off.
    low = make_summary(0.100, {"forward": 0.010, "backward": 0.015, "data_wait": 0.004})
    assert "amp" not in _by_rule(advise(low, RunFacts(device_type="cuda")))


def _convnet(bias=True):
    return nn.Sequential(nn.Conv2d(3, 8, 3, bias=bias), nn.BatchNorm2d(8), nn.ReLU())


def test_cudnn_benchmark_needs_cuda_fixed_shapes_and_convs():
    s = make_summary(0.100, {"forward": 0.030, "backward": 0.050})
    base = dict(device_type="cuda", autocast_used=True, fixed_input_shapes=True)
    f = _by_rule(advise(s, RunFacts(models=[_convnet(False)], **base)))["cudnn_benchmark"]
    assert f.fix == "torch.backends.cudnn.benchmark = True before the first step"
    assert f.est_step_s == pytest.approx(0.100 - 0.080 * (1 - rules.CUDNN_BENCHMARK), rel=REL)
    mlp = nn.Sequential(nn.Linear(4, 4))
    assert "cudnn_benchmark" not in _by_rule(advise(s, RunFacts(models=[mlp], **base)))
    on = dict(base, cudnn_benchmark=True)
    assert "cudnn_benchmark" not in _by_rule(advise(s, RunFacts(models=[_convnet(False)], **on)))
    varying = dict(base, fixed_input_shapes=None)
    facts = RunFacts(models=[_convnet(False)], **varying)
    assert "cudnn_benchmark" not in _by_rule(advise(s, facts))


def test_launch_bound_and_gpu_idle():
    s = make_summary(0.020, {"forward": 0.006, "backward": 0.008})
    launch = RunFacts(
        device_type="cuda", autocast_used=True, gpu_idle_share=0.6, host_s_per_module_call=8e-6
    )
    out = advise(s, launch)
    assert [f.rule for f in out] == ["launch_bound"]  # the idle is explained: no gpu_idle
    assert out[0].severity == "critical" and "torch.compile" in out[0].fix
    assert out[0].est_step_s == pytest.approx(0.020 - 0.014 * 0.5, rel=REL)
    # Slow modules on the host: not launch-bound, the idle time is a host stall.
    stall = RunFacts(
        device_type="cuda", autocast_used=True, gpu_idle_share=0.4, host_s_per_module_call=3e-4
    )
    (f,) = advise(s, stall)
    assert f.rule == "gpu_idle" and f.severity == "warning" and "host stall" in f.fix
    assert f.title == "the GPU is idle 40% of the step (8.0 ms of 20.0 ms)"
    assert f.est_step_s == pytest.approx(0.020 - 0.4 * 0.020 * (1 - rules.GPU_IDLE_STALL), rel=REL)
    # Idle time that the data wait explains is not blamed on a stall.
    fed = make_summary(0.020, {"data_wait": 0.006, "forward": 0.006, "backward": 0.006})
    facts = RunFacts(device_type="cuda", autocast_used=True, gpu_idle_share=0.4)
    assert [f.rule for f in advise(fed, facts)] == ["data_wait"]


def _rank_summary(rank, step_s, phases):
    return make_summary(step_s, phases, rank=rank, world_size=4)


def test_straggler_names_the_slow_rank_and_its_phase():
    # Synchronous collectives: every rank's step is 40 ms; the fast ranks wait for rank 2 in comm.
    base = {"data_wait": 0.002, "forward": 0.010, "backward": 0.015, "comm": 0.013}
    ranks = [_rank_summary(r, 0.040, dict(base)) for r in range(4)]
    ranks[2] = _rank_summary(2, 0.040, dict(base, data_wait=0.014, comm=0.001))
    s = make_summary(0.040, base, world_size=4)
    s.ranks = ranks
    f = _by_rule(advise(s, RunFacts()))["straggler"]
    # Busy time (step - comm): 39 ms on rank 2 against 27 ms on the others.
    assert f.title.startswith("rank 2 is a straggler: it works 1.44x as long per step")
    assert "(39.0 ms vs 27.0 ms outside communication)" in f.title
    assert "most of it in data wait" in f.title and f.severity == "critical"
    assert "rank 2's input" in f.fix
    # Excess data wait 12 ms, at most the 12 ms gap to the typical rank.
    assert f.est_gain_s == pytest.approx(0.012, rel=REL)
    assert f.est_step_s == pytest.approx(0.028, rel=REL)
    # Within 10 % (29 ms vs 27 ms busy): quiet.
    ranks[2] = _rank_summary(2, 0.040, dict(base, data_wait=0.004, comm=0.011))
    assert "straggler" not in _by_rule(advise(s, RunFacts()))
    # Equal step times do not hide the straggler, and a rank that only waits is never named.
    ranks[2] = _rank_summary(2, 0.040, dict(base, backward=0.027, comm=0.001))
    f = _by_rule(advise(s, RunFacts()))["straggler"]
    assert f.title.startswith("rank 2 ") and "backward" in f.title


def test_ranking_gains_first_then_severity():
    s = make_summary(0.050, {"data_wait": 0.006, "comm": 0.015})
    facts = RunFacts(
        counters={"tensor_from_ndarray": 3, "eval_forward_with_grad": 2}, models=[_convnet()]
    )
    out = advise(s, facts)
    assert [f.rule for f in out] == [
        "comm",  # 15 ms x 0.75 = 11.25 ms
        "data_wait",  # 6 ms x 0.9 = 5.4 ms
        "eval_without_no_grad",  # warning
        "conv_bias_before_bn",  # info, in lint order
        "tensor_from_ndarray",
    ]
    gains = [f.est_gain_s for f in out]
    assert gains[0] == pytest.approx(0.01125, rel=REL) and gains[1] == pytest.approx(
        0.0054, rel=REL
    )
    assert gains[2:] == [0.0, 0.0, 0.0]


def test_equal_gains_rank_the_larger_phase_first():
    # optimizer 30 % x (1 - 0.4) = data wait 20 % x (1 - 0.9) = 0.18 s: the ratio 1.5 of the
    # property test's boundary. Same gain and severity: the phase with more time comes first.
    s = make_summary(1.0, {"data_wait": 0.2, "optimizer": 0.3})
    facts = RunFacts(optimizers=[torch.optim.SGD(_param(), lr=0.1, foreach=False)])
    out = advise(s, facts)
    assert [f.rule for f in out] == ["optimizer", "data_wait"]
    assert out[0].est_gain_s == pytest.approx(out[1].est_gain_s, rel=REL)
    assert out[0].severity == out[1].severity == "critical"


def test_empty_and_degenerate_inputs_do_not_raise():
    empty = StepSummary(0, 0.0, 0.0, 0.0, 0.0, {})
    assert advise(empty, RunFacts()) == []
    assert advise(None, None) == []
    assert lint(RunFacts()) == []
    zero = make_summary(0.0, {}, steps=0)
    assert advise(zero, RunFacts(device_type="cuda", gpu_idle_share=0.9)) == []
    odd = RunFacts(
        device_type="cuda",
        models=[None, 3, "model"],
        optimizers=[object()],
        loaders=[None, [1, 2]],
        counters={"h2d_pageable": None, "zero_grad_keep": "x"},
        gpu_idle_share=float("nan"),
        peak_memory_bytes=None,
        total_memory_bytes=0,
        host_s_per_module_call=None,
    )
    s = make_summary(0.1, {"optimizer": 0.05, "data_wait": 0.03})
    s.ranks = [None, s]
    out = advise(s, odd)
    # No optimizer was recognised: the optimizer finding has no estimate, so it ranks second.
    assert [f.rule for f in out] == ["data_wait", "optimizer"]
    assert out[1].est_step_s is None and out[1].severity == "critical"
    assert out[0].est_step_s == pytest.approx(0.1 - 0.03 * 0.9, rel=REL)


# ---- lints ---------------------------------------------------------------------------------
class _ConvBN(nn.Module):
    def __init__(self, bias):
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, bias=bias)
        self.bn = nn.BatchNorm2d(8)

    def forward(self, x):
        return torch.relu(self.bn(self.conv(x)))


class _Residual(nn.Module):
    """conv's output feeds the BN and the residual add: its bias is not cancelled."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(8, 8, 3, padding=1)
        self.bn = nn.BatchNorm2d(8)

    def forward(self, x):
        y = self.conv(x)
        return self.bn(y) + y


class _Untraceable(nn.Module):
    """Data-dependent control flow: fx cannot trace it, so the Sequential order is read."""

    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(nn.Conv1d(3, 8, 3), nn.BatchNorm1d(8))

    def forward(self, x):
        return self.body(x) if x.sum() > 0 else x


def _conv_bias(model):
    return [f for f in lint(RunFacts(models=[model])) if f.rule == "conv_bias_before_bn"]


def test_conv_bias_before_bn_sequential_and_fx():
    (f,) = _conv_bias(_convnet(bias=True))
    assert f.kind == "lint" and f.est_gain_s == 0.0 and f.est_step_s is None
    assert f.detail == "Sequential: 0 -> 1 (traced with torch.fx)" and "bias=False" in f.fix
    (f,) = _conv_bias(_ConvBN(bias=True))
    assert f.detail == "_ConvBN: conv -> bn (traced with torch.fx)"
    (f,) = _conv_bias(_Untraceable())
    assert (
        f.detail
        == "_Untraceable: body.0 -> body.1 (from the nn.Sequential order: fx could not trace it)"
    )
    # Wrapped in a DataParallel: the inner module's paths.
    (f,) = _conv_bias(nn.DataParallel(_ConvBN(bias=True)))
    assert "conv -> bn" in f.detail


def test_conv_bias_before_bn_quiet_cases():
    assert _conv_bias(_convnet(bias=False)) == []
    assert _conv_bias(_ConvBN(bias=False)) == []
    conv_relu_bn = nn.Sequential(nn.Conv2d(3, 8, 3), nn.ReLU(), nn.BatchNorm2d(8))
    assert _conv_bias(conv_relu_bn) == []
    assert _conv_bias(_Residual()) == []


def test_num_workers_zero_lint():
    ds = torch.utils.data.TensorDataset(torch.zeros(8))
    zero = torch.utils.data.DataLoader(ds, num_workers=0)
    two = torch.utils.data.DataLoader(ds, num_workers=2)  # workers start on iteration only
    (f,) = lint(RunFacts(loaders=[zero, two]))
    assert f.rule == "num_workers_zero" and f.severity == "warning"
    assert f.title.startswith("1 DataLoader(s)") and "num_workers=0" in f.detail
    assert lint(RunFacts(loaders=[two])) == []
    (f,) = lint(RunFacts(loaders=[torchspeed.data.DataLoader(ds)]))
    assert "delegating" in f.detail


@pytest.mark.parametrize(
    "counter, rule, fix_word, cuda_only",
    [
        ("zero_grad_keep", "zero_grad_keep", "set_to_none=True", False),
        ("h2d_pageable", "h2d_pageable", "pin_memory=True", True),
        ("h2d_blocking", "h2d_blocking", "non_blocking=True", True),
        ("eval_forward_with_grad", "eval_without_no_grad", "torch.inference_mode()", False),
        ("tensor_from_ndarray", "tensor_from_ndarray", "torch.from_numpy", False),
    ],
)
def test_counter_lints(counter, rule, fix_word, cuda_only):
    (f,) = lint(RunFacts(device_type="cuda", counters={counter: 30}, steps=10))
    assert f.rule == rule and f.kind == "lint" and fix_word in f.fix
    assert "30 over 10 steps (3.0 per step)" in f.title
    assert lint(RunFacts(device_type="cuda", counters={counter: 0}, steps=10)) == []
    assert lint(RunFacts(device_type="cuda")) == []
    on_cpu = lint(RunFacts(counters={counter: 30}, steps=10))
    assert on_cpu == [] if cuda_only else [x.rule for x in on_cpu] == [rule]


def test_channels_last_lint():
    model = _convnet(bias=False)
    (f,) = lint(RunFacts(device_type="cuda", models=[model]))
    assert f.rule == "channels_last" and "torch.channels_last" in f.fix
    assert f.title == "1 of 1 Conv2d weights are NCHW, not channels_last"
    assert lint(RunFacts(models=[model])) == []  # CPU: quiet
    model = model.to(memory_format=torch.channels_last)
    assert lint(RunFacts(device_type="cuda", models=[model])) == []
    # Channels-last weights, but the inputs the hooks saw were NCHW.
    (f,) = lint(
        RunFacts(device_type="cuda", models=[model], counters={"conv_input_not_channels_last": 5})
    )
    assert (
        f.title == "Conv2d inputs not in channels_last: 5"
        and f.detail == "The weights are channels_last."
    )
    assert lint(RunFacts(device_type="cuda", models=[nn.Linear(3, 3)])) == []


def test_batch_too_small_lint():
    gib = 2**30
    (f,) = lint(
        RunFacts(device_type="cuda", peak_memory_bytes=10 * gib, total_memory_bytes=80 * gib)
    )
    assert f.rule == "batch_too_small"
    assert f.title == "peak memory is 12% of the GPU (10.0 of 80.0 GiB)"
    assert "up to ~6x" in f.fix
    assert (
        lint(RunFacts(device_type="cuda", peak_memory_bytes=40 * gib, total_memory_bytes=80 * gib))
        == []
    )
    assert lint(RunFacts(peak_memory_bytes=10 * gib, total_memory_bytes=80 * gib)) == []
    assert (
        lint(RunFacts(device_type="cuda", peak_memory_bytes=None, total_memory_bytes=80 * gib))
        == []
    )


# ---- properties ----------------------------------------------------------------------------
RULE_PHASES = ("data_wait", "optimizer", "h2d", "comm")
_OPT = torch.optim.SGD(_param(), lr=0.1, foreach=False)


@st.composite
def dominated_split(draw):
    """(target, step_s, phase seconds, facts): target's share >= 20 % and >= 1.5x every other
    rule phase; forward/backward/other take what is left."""
    target = draw(st.sampled_from(RULE_PHASES))
    x = draw(st.floats(0.20, 0.90))
    cap = x / 1.5
    shares = {target: x}
    left = 1.0 - x
    for p in RULE_PHASES:
        if p != target:
            shares[p] = draw(st.floats(0.0, min(cap, left)))
            left -= shares[p]
    fwd = draw(st.floats(0.0, 1.0)) * left
    bwd = draw(st.floats(0.0, 1.0)) * (left - fwd)
    shares["forward"], shares["backward"] = fwd, bwd
    step = draw(st.floats(0.011, 2.0))  # >= 2.2 ms of target: above the 2 ms floor
    cuda = draw(st.booleans())
    # CUDA with AMP already on and no idle measurement: only the four phase rules can fire.
    facts = RunFacts(
        device_type="cuda" if cuda else "cpu",
        autocast_used=cuda,
        optimizers=[_OPT],
        ddp=True,
    )
    return target, step, {p: s * step for p, s in shares.items()}, facts


@settings(max_examples=300, deadline=None)
@given(dominated_split())
def test_property_dominant_phase_is_named_first(case):
    target, step, secs, facts = case
    out = advise(make_summary(step, secs), facts)
    assert out and out[0].rule == target, (target, [(f.rule, f.est_gain_s) for f in out])
    assert out[0].est_gain_s > 0
    assert out[0].est_step_s + out[0].est_gain_s == pytest.approx(step, rel=REL)


_MODELS = [_convnet(), _ConvBN(True)]
_COUNTERS = [
    "h2d_pageable",
    "h2d_blocking",
    "tensor_from_ndarray",
    "zero_grad_keep",
    "eval_forward_with_grad",
    "conv_input_not_channels_last",
    "module_calls",
]


@st.composite
def any_split(draw):
    """Arbitrary splits and facts, including NaN/inf, zero-length steps and distributed ranks."""
    raw = {p: draw(st.floats(0.0, 1.0)) for p in PHASES}
    total = sum(raw.values()) or 1.0
    step = draw(st.one_of(st.just(0.0), st.floats(1e-6, 5.0)))
    secs = {p: v / total * step for p, v in raw.items() if p != "other"}
    s = make_summary(step, secs, steps=draw(st.integers(0, 5)))
    if draw(st.booleans()):
        n = draw(st.integers(0, 5))
        s.ranks = [
            draw(
                st.one_of(
                    st.none(),
                    st.just(s),
                    st.builds(lambda k: make_summary(k, {}), st.floats(0.0, 3.0)),
                )
            )
            for _ in range(n)
        ]
    maybe = st.one_of(st.none(), st.floats(allow_nan=True, allow_infinity=True))
    facts = RunFacts(
        device_type=draw(st.sampled_from(["cpu", "cuda", "mps", ""])),
        autocast_used=draw(st.booleans()),
        bf16_capable_cpu=draw(st.booleans()),
        cudnn_benchmark=draw(st.booleans()),
        fixed_input_shapes=draw(st.one_of(st.none(), st.booleans())),
        models=draw(st.lists(st.sampled_from([None, 1, _MODELS[0], _MODELS[1]]), max_size=2)),
        optimizers=draw(st.lists(st.sampled_from([None, _OPT, "adam"]), max_size=2)),
        ddp=draw(st.booleans()),
        counters=draw(st.dictionaries(st.sampled_from(_COUNTERS), st.integers(-5, 10**6))),
        steps=draw(st.integers(-1, 100)),
        gpu_idle_share=draw(maybe),
        peak_memory_bytes=draw(st.one_of(st.none(), st.integers(-1, 2**40))),
        total_memory_bytes=draw(st.one_of(st.none(), st.integers(-1, 2**40))),
        host_s_per_module_call=draw(maybe),
    )
    return s, facts


@settings(max_examples=300, deadline=None)
@given(any_split())
def test_property_never_raises_and_low_data_wait_is_quiet(case):
    s, facts = case
    out = advise(s, facts)
    sev = {"critical": 0, "warning": 1, "info": 2}
    for f in out:
        assert f.severity in sev and f.kind in ("breakdown", "lint") and f.title and f.fix
        assert f.est_gain_s >= 0 and math.isfinite(f.est_gain_s)
        if f.est_step_s is not None:
            assert f.est_step_s >= 0
            assert f.est_step_s + f.est_gain_s == pytest.approx(s.step_median_s, rel=REL)
    # Ranked: gains non-increasing, then severities non-decreasing among the rest.
    gains = [f.est_gain_s for f in out if f.est_gain_s > 0]
    assert gains == sorted(gains, reverse=True)
    rest = [sev[f.severity] for f in out if not f.est_gain_s > 0]
    assert rest == sorted(rest)
    assert [f for f in out if f.est_gain_s > 0] == out[: len(gains)]
    if s.phases["data_wait"].share < 0.05:
        assert "data_wait" not in {f.rule for f in out}


def test_estimates_quote_the_median_the_table_prints():
    # Issue 25: an estimate quoted share x step median (16.0 ms) where the table's phase median
    # was 12.9 ms. Uneven steps: the data wait's median is 12.9 ms, its share of all time 80 %.
    s = make_summary(0.020, {"data_wait": 0.0129, "forward": 0.002, "backward": 0.002})
    s.phases["data_wait"].share = 0.8
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.zeros(8)))
    f = _by_rule(advise(s, RunFacts(loaders=[loader])))["data_wait"]
    assert "(12.9 ms of 20.0 ms)" in f.title, f.title
    assert f.est_gain_s == pytest.approx(0.0129 * (1 - rules.DATA_WAIT_WITH_WORKERS), rel=REL)


@pytest.mark.parametrize("ratio, severity", [(1.5, None), (2.5, "warning"), (9.0, "critical")])
def test_uneven_steps_are_flagged_from_p90_over_the_median(ratio, severity):
    s = make_summary(0.020, {"forward": 0.008, "backward": 0.008})
    s.step_p90_s = 0.020 * ratio
    got = _by_rule(breakdown_rules(s, RunFacts())).get("contention")
    if severity is None:
        assert got is None
        return
    assert got.severity == severity and got.est_step_s is None
    assert f"the p90 step is {ratio:.1f}x the median" in got.title
    assert "load average" in got.detail


def test_clip_grad_norm_calls_suggest_the_optimizers_max_grad_norm():
    facts = RunFacts(counters={"clip_grad_norm": 6}, steps=3)
    f = _by_rule(lint(facts))["clip_into_optimizer"]
    assert f.kind == "lint" and "max_grad_norm=" in f.fix and "2.0 per step" in f.title
    with_ts = RunFacts(
        counters={"clip_grad_norm": 6}, steps=3, optimizers=[torchspeed.optim.AdamW(_param())]
    )
    assert "clip_into_optimizer" not in _by_rule(lint(with_ts))  # its max_grad_norm is there
    assert "clip_into_optimizer" not in _by_rule(lint(RunFacts(steps=3)))


# ---- torch.compile ----------------------------------------------------------------------------
def _att(model_op_s=0.050, fusable_s=0.020, compiled=False):
    from torchspeed.profile.attribution import Attribution

    top = [("aten::gelu", 0.012), ("aten::add_", 0.008)]
    return Attribution(0.1, [], [], 0.1, model_op_s, fusable_s, top, compiled)


def test_compile_fires_on_fusable_heavy_compute_with_the_stated_estimate():
    s = make_summary(step_s=0.100, phase_s={"forward": 0.030, "backward": 0.050})
    f = _by_rule(advise(s, RunFacts(attribution=_att(), compile_unavailable="")))["compile"]
    # forward+backward 80 ms; fusable ops 20 of 50 ms of op time (40 %); fusion leaves half.
    assert f.est_gain_s == pytest.approx(0.080 * 0.4 * (1 - rules.COMPILE_FUSED_LEFT), rel=REL)
    assert f.est_step_s == pytest.approx(0.100 - f.est_gain_s, rel=REL)
    assert "model = torch.compile(model)" in f.fix and "40%" in f.title
    assert "aten::gelu 12.0 ms" in f.detail and "planning figure" in f.detail
    assert "80.0 ms -> 64.0 ms" in f.detail


def test_compile_is_quiet_when_compiled_or_few_fusable_ops_or_little_compute():
    s = make_summary(step_s=0.100, phase_s={"forward": 0.030, "backward": 0.050})
    small = make_summary(step_s=0.100, phase_s={"forward": 0.010, "backward": 0.015})
    for summary, facts in (
        (s, RunFacts(attribution=_att(compiled=True), compile_unavailable="")),
        (s, RunFacts(attribution=_att(), model_compiled=True, compile_unavailable="")),
        (s, RunFacts(attribution=_att(fusable_s=0.007), compile_unavailable="")),  # 14 %
        (s, RunFacts(attribution=_att(model_op_s=None), compile_unavailable="")),  # not sampled
        (s, RunFacts(compile_unavailable="")),  # no attribution
        (small, RunFacts(attribution=_att(), compile_unavailable="")),  # compute 25 % of the step
    ):
        out = _by_rule(advise(summary, facts))
        assert "compile" not in out and "compile_unavailable" not in out
    # At the threshold it fires.
    facts = RunFacts(attribution=_att(fusable_s=0.0075), compile_unavailable="")
    assert "compile" in _by_rule(advise(s, facts))


def test_compile_unavailable_says_why_instead_of_advising(monkeypatch):
    s = make_summary(step_s=0.100, phase_s={"forward": 0.030, "backward": 0.050})
    why = "inductor found no C++ compiler for the CPU (RuntimeError: none)"
    out = _by_rule(advise(s, RunFacts(attribution=_att(), compile_unavailable=why)))
    assert "compile" not in out
    f = out["compile_unavailable"]
    assert f.severity == "info" and f.est_gain_s == 0.0 and why in f.fix
    # Not checked by the facts: the rule asks, only when it would advise (once per device).
    asked = []
    monkeypatch.setattr(rules, "compile_unavailable", lambda d: asked.append(d) or "no g++")
    out = _by_rule(advise(s, RunFacts(attribution=_att())))
    assert asked == ["cpu"] and "no g++" in out["compile_unavailable"].fix


def test_compile_unavailable_reads_the_cpu_compiler(monkeypatch):
    import torch._dynamo
    from torch._inductor import cpp_builder

    from torchspeed.profile import facts as facts_mod

    facts_mod.compile_unavailable.cache_clear()
    try:

        def missing():
            raise RuntimeError("no working C++ compiler found")

        monkeypatch.setattr(cpp_builder, "get_cpp_compiler", missing)
        assert "no working C++ compiler" in facts_mod.compile_unavailable("cpu")
        facts_mod.compile_unavailable.cache_clear()
        monkeypatch.setattr(cpp_builder, "get_cpp_compiler", lambda: "/nonexistent/g++")
        assert "not on PATH" in facts_mod.compile_unavailable("cpu")
        facts_mod.compile_unavailable.cache_clear()
        monkeypatch.setattr(torch._dynamo, "is_dynamo_supported", lambda: False)
        assert "does not support Python" in facts_mod.compile_unavailable("cuda")
    finally:
        facts_mod.compile_unavailable.cache_clear()
