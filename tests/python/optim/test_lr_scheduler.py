"""torchspeed.optim.lr_scheduler: WarmupLR against torch's schedulers step for step (host lr and a
device lr tensor), after total_steps, its state_dict, and the linear-scaling rule; bad arguments
and state keys get errors naming them."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
from torch import nn
from torch.optim import lr_scheduler as L

import torchspeed
from torchspeed.optim.lr_scheduler import WarmupLR, scaled_lr

DOCS = Path(__file__).resolve().parents[3] / "docs"


def _opt(lr=0.1, opt_cls=torch.optim.SGD):
    return opt_cls([nn.Parameter(torch.zeros(3))], lr=lr)


def _lrs(opt, sched, steps):
    out = [float(opt.param_groups[0]["lr"])]
    for _ in range(steps):
        opt.step()
        sched.step()
        out.append(float(opt.param_groups[0]["lr"]))
    return out


# ---- schedules ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "warmup,total,start,eta_min",
    [(5, 20, 0.1, 1e-4), (0, 12, 1 / 3, 0.0), (3, 3, 0.5, 0.0), (10, 40, 1 / 3, 0.01)],
)
def test_linear_warmup_cosine_matches_torch_sequential_lr(warmup, total, start, eta_min):
    ref_opt, opt = _opt(), _opt()
    parts = [L.CosineAnnealingLR(ref_opt, T_max=max(total - warmup, 1), eta_min=eta_min)]
    if warmup:
        parts.insert(0, L.LinearLR(ref_opt, start_factor=start, total_iters=warmup))
    ref = L.SequentialLR(ref_opt, parts, milestones=[warmup]) if warmup else parts[0]
    ours = WarmupLR(
        opt, warmup_steps=warmup, total_steps=total, start_factor=start, eta_min=eta_min
    )
    n = total if total > warmup else warmup  # torch's cosine restarts after T_max; ours holds
    torch.testing.assert_close(_lrs(opt, ours, n), _lrs(ref_opt, ref, n), rtol=1e-9, atol=1e-12)


def test_linear_decay_and_constant_match_torch():
    for decay, make in [
        (
            "linear",
            lambda o: L.LinearLR(o, start_factor=1.0, end_factor=0.02 / 0.1, total_iters=15),
        ),
        ("constant", lambda o: L.ConstantLR(o, factor=1.0, total_iters=1)),
    ]:
        ref_opt, opt = _opt(), _opt()
        ref = L.SequentialLR(
            ref_opt,
            [L.LinearLR(ref_opt, start_factor=0.25, total_iters=5), make(ref_opt)],
            milestones=[5],
        )
        ours = WarmupLR(opt, 5, 20, decay=decay, start_factor=0.25, eta_min=0.02)
        torch.testing.assert_close(
            _lrs(opt, ours, 20), _lrs(ref_opt, ref, 20), rtol=1e-9, atol=1e-12, msg=decay
        )


def test_exponential_warmup_against_its_formula():
    opt = _opt(0.2)
    got = _lrs(opt, WarmupLR(opt, 8, 8, warmup="exponential", start_factor=0.01), 10)
    want = [0.2 * 0.01 ** (1 - min(t, 8) / 8) for t in range(11)]
    torch.testing.assert_close(got, want, rtol=1e-12, atol=0)


def test_a_tensor_lr_follows_the_schedule_on_the_device_with_torchspeed_adamw():
    lr = torch.tensor(0.1)
    p = nn.Parameter(torch.ones(4))
    opt = torchspeed.optim.AdamW([p], lr=lr)
    ref_opt = _opt(0.1)
    sched, ref = WarmupLR(opt, 4, 12), WarmupLR(ref_opt, 4, 12)
    for _ in range(14):
        assert torch.is_tensor(opt.param_groups[0]["lr"])
        torch.testing.assert_close(
            opt.param_groups[0]["lr"].item(),
            float(ref_opt.param_groups[0]["lr"]),
            rtol=1e-7,
            atol=0,
        )
        p.grad = torch.ones(4)
        opt.step()
        sched.step()
        ref.step()
    assert opt.param_groups[0]["lr"] is lr  # written in place, never replaced


def test_a_captured_cuda_graph_replay_follows_the_schedule():
    """GPU check script: opt.step() and sched.step() captured once in a CUDA graph; every replay
    advances the device step counter and writes the scheduled lr, with no host update."""
    if not torch.cuda.is_available() or not getattr(torchspeed._C, "with_cuda", False):
        pytest.skip("needs a CUDA device and torchspeed built with CUDA")
    lr = torch.tensor(0.1, device="cuda")
    p = nn.Parameter(torch.ones(1024, device="cuda"))
    p.grad = torch.full_like(p, 0.01)
    opt = torchspeed.optim.AdamW([p], lr=lr)
    sched = WarmupLR(opt, 5, 20)
    ref_opt = _opt(0.1)
    ref = WarmupLR(ref_opt, 5, 20)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):  # warm up outside the graph (state allocation)
        opt.step()
        sched.step()
        ref.step()
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        opt.step()
        sched.step()
    ref.step()  # the capture ran step() once
    for _ in range(12):
        graph.replay()
        ref.step()
        torch.cuda.synchronize()
        torch.testing.assert_close(
            lr.item(), float(ref_opt.param_groups[0]["lr"]), rtol=1e-6, atol=0
        )


def test_scheduler_state_dict_resumes_exactly():
    opt, opt2 = _opt(), _opt()
    a = WarmupLR(opt, 5, 30, eta_min=0.001)
    for _ in range(9):
        a.step()
    b = WarmupLR(opt2, 5, 30, eta_min=0.001)
    b.load_state_dict(a.state_dict())
    assert opt2.param_groups[0]["lr"] == opt.param_groups[0]["lr"]
    assert _lrs(opt, a, 10) == _lrs(opt2, b, 10)


def test_scheduler_and_scaling_rule_reject_bad_arguments():
    with pytest.raises(ValueError, match="total_steps must be >= warmup_steps"):
        WarmupLR(_opt(), 10, 5)
    with pytest.raises(ValueError, match="warmup must be 'linear' or 'exponential', got 'cos'"):
        WarmupLR(_opt(), 1, 5, warmup="cos")
    with pytest.raises(ValueError, match=r"start_factor must be in \(0, 1\]"):
        WarmupLR(_opt(), 1, 5, warmup="exponential", start_factor=0.0)
    with pytest.raises(TypeError, match="warmup_steps must be an int"):
        WarmupLR(_opt(), 1.5, 5)
    assert scaled_lr(0.1, 256, 1024) == pytest.approx(0.4)
    assert scaled_lr(0.1, 256, 1024, rule="sqrt") == pytest.approx(0.2)
    with pytest.raises(ValueError, match="rule must be 'linear' or 'sqrt'"):
        scaled_lr(0.1, 256, 1024, rule="cube")
    with pytest.raises(ValueError, match="batch sizes must be > 0"):
        scaled_lr(0.1, 0, 1024)


# ---- after total_steps (issue 23 item 8) --------------------------------------------------------


def test_after_total_steps_cosine_holds_eta_min_where_torch_rises_again():
    """Equal to SequentialLR(LinearLR, CosineAnnealingLR) up to total_steps (1e-9 relative); after
    it WarmupLR holds eta_min while torch's periodic cosine rises back towards the base lr: the
    documented difference (docs/TRAINING.md)."""
    warmup, total, eta_min = 4, 20, 1e-3
    ref_opt, opt = _opt(), _opt()
    ref = L.SequentialLR(
        ref_opt,
        [
            L.LinearLR(ref_opt, start_factor=0.25, total_iters=warmup),
            L.CosineAnnealingLR(ref_opt, T_max=total - warmup, eta_min=eta_min),
        ],
        milestones=[warmup],
    )
    ours = WarmupLR(opt, warmup, total, start_factor=0.25, eta_min=eta_min)
    n = 2 * total
    got, want = _lrs(opt, ours, n), _lrs(ref_opt, ref, n)
    torch.testing.assert_close(got[: total + 1], want[: total + 1], rtol=1e-9, atol=1e-12)
    assert got[total + 1 :] == [pytest.approx(eta_min, rel=1e-12, abs=0)] * (n - total)
    assert want[total + 8] > 0.5 * 0.1  # torch's has risen past half the base lr again


def test_after_total_steps_linear_and_constant_hold_as_torch_does():
    for decay, make in [
        ("linear", lambda o: L.LinearLR(o, start_factor=1.0, end_factor=0.2, total_iters=15)),
        ("constant", lambda o: L.ConstantLR(o, factor=1.0, total_iters=1)),
    ]:
        ref_opt, opt = _opt(), _opt()
        ref = L.SequentialLR(
            ref_opt,
            [L.LinearLR(ref_opt, start_factor=0.25, total_iters=5), make(ref_opt)],
            milestones=[5],
        )
        ours = WarmupLR(opt, 5, 20, decay=decay, start_factor=0.25, eta_min=0.02)
        torch.testing.assert_close(
            _lrs(opt, ours, 45), _lrs(ref_opt, ref, 45), rtol=1e-9, atol=1e-12, msg=decay
        )


def test_training_docs_state_the_difference_after_total_steps():
    """docs/TRAINING.md claimed step-for-step equality with no bound."""
    text = " ".join((DOCS / "TRAINING.md").read_text().split())
    assert "up to `total_steps`" in text
    assert "test_after_total_steps_cosine_holds_eta_min_where_torch_rises_again" in text


# ---- state and arguments (issue 23 item 19, and the adversarial pass) -----------------------------


@pytest.mark.parametrize(
    "bad,error,match",
    [
        ({"last_epoch": "x"}, TypeError, r"state_dict\['last_epoch'\] must be an int, got 'x'"),
        ({"last_epoch": 2.5}, TypeError, r"state_dict\['last_epoch'\] must be an int, got 2.5"),
        ({"last_epoch": -7}, ValueError, r"state_dict\['last_epoch'\] must be >= -1"),
        ({"last_epoch": 2**70}, ValueError, r"state_dict\['last_epoch'\] must be within"),
        ({"step": 3}, ValueError, r"unknown keys \['step'\]"),
        ({"base_lrs": [0.1, 0.2]}, ValueError, r"one lr per param group \(1\)"),
        ({"base_lrs": ["0.1"]}, TypeError, r"state_dict\['base_lrs'\]\[0\] must be a real number"),
        ({"_args": (1, 5, "cos", "cosine", 0.5, 0.0)}, ValueError, "warmup must be 'linear'"),
        ({"_args": (1, 5)}, TypeError, r"'_args'\] must be the 6 schedule settings"),
        ({"warmup_steps": 2}, ValueError, r"state_dict\['warmup_steps'\] = 2 disagrees"),
    ],
)
def test_load_state_dict_names_the_bad_key_and_changes_nothing(bad, error, match):
    opt = _opt()
    sched = WarmupLR(opt, 3, 12)
    for _ in range(4):
        sched.step()
    saved, lr = sched.state_dict(), opt.param_groups[0]["lr"]
    with pytest.raises(error, match=match):
        sched.load_state_dict({**saved, **bad})
    assert sched.state_dict() == saved and opt.param_groups[0]["lr"] == lr
    assert callable(sched.step)
    with pytest.raises(TypeError, match="state_dict must be a dict"):
        sched.load_state_dict(None)


@pytest.mark.parametrize(
    "kwargs,error,match",
    [
        (dict(start_factor="0.5"), TypeError, "start_factor must be a real number, got '0.5'"),
        (dict(eta_min=None), TypeError, "eta_min must be a real number"),
        (dict(eta_min=float("nan")), ValueError, "eta_min must be finite and >= 0"),
        (dict(start_factor=float("inf")), ValueError, r"start_factor must be in \[0, 1\]"),
        (dict(warmup=None), TypeError, "warmup must be a str"),
        (dict(decay=1), TypeError, "decay must be a str"),
        (dict(warmup_steps=-1), ValueError, "warmup_steps must be >= 0"),
        (dict(warmup_steps=True), TypeError, "warmup_steps must be an int, got True"),
        (dict(total_steps=2**80), ValueError, "total_steps must be within"),
        (dict(last_epoch="3"), TypeError, "last_epoch must be an int"),
    ],
)
def test_warmup_lr_rejects_bad_arguments(kwargs, error, match):
    args = {"warmup_steps": 2, "total_steps": 10, **kwargs}
    opt = _opt()
    with pytest.raises(error, match=match):
        WarmupLR(opt, **args)
    assert opt.param_groups[0]["lr"] == 0.1 and "initial_lr" not in opt.param_groups[0]


def test_scaled_lr_rejects_bad_arguments():
    with pytest.raises(TypeError, match="reference_batch_size must be an int, got 2.5"):
        scaled_lr(0.1, 2.5, 4)
    with pytest.raises(TypeError, match="reference_lr must be a real number, got '0.1'"):
        scaled_lr("0.1", 2, 4)
    with pytest.raises(ValueError, match="reference_lr must be finite and >= 0, got nan"):
        scaled_lr(float("nan"), 2, 4)
    with pytest.raises(ValueError, match="reference_lr must be finite and >= 0"):
        scaled_lr(-0.1, 2, 4)
    with pytest.raises(TypeError, match="rule must be a str"):
        scaled_lr(0.1, 2, 4, rule=None)


# ---- HuggingFace's schedules ----------------------------------------------------------------------
# transformers' get_linear_schedule_with_warmup / get_cosine_schedule_with_warmup (num_cycles=0.5)
# as the LambdaLR factors their documentation defines (transformers is not a test dependency).
def _hf_linear(warmup, total):
    def factor(step):
        if step < warmup:
            return step / max(1, warmup)
        return max(0.0, (total - step) / max(1, total - warmup))

    return factor


def _hf_cosine(warmup, total, num_cycles=0.5):
    def factor(step):
        if step < warmup:
            return step / max(1, warmup)
        progress = (step - warmup) / max(1, total - warmup)
        return max(0.0, 0.5 * (1.0 + math.cos(math.pi * num_cycles * 2.0 * progress)))

    return factor


@pytest.mark.parametrize("decay,hf", [("linear", _hf_linear), ("cosine", _hf_cosine)])
@pytest.mark.parametrize("warmup,total", [(5, 20), (0, 12), (10, 40)])
def test_warmup_lr_with_start_factor_0_matches_huggingface_schedules(decay, hf, warmup, total):
    # docs/TRAINING.md "HuggingFace's schedules": HF warms up from 0 (torch's LinearLR and
    # WarmupLR's default start at 1/3); with start_factor=0 the two agree up to total_steps.
    opt = _opt()
    ours = _lrs(opt, WarmupLR(opt, warmup, total, decay=decay, start_factor=0.0), total)
    ref_opt = _opt()
    theirs = _lrs(ref_opt, L.LambdaLR(ref_opt, hf(warmup, total)), total)
    torch.testing.assert_close(ours, theirs, rtol=1e-12, atol=1e-15)
    if warmup:  # the default start factor is not HF's
        opt = _opt()
        assert _lrs(opt, WarmupLR(opt, warmup, total, decay=decay), 0)[0] == pytest.approx(0.1 / 3)


def test_warmup_lr_constant_matches_huggingface_constant_schedule_with_warmup():
    warmup, total = 5, 20
    opt = _opt()
    ours = _lrs(opt, WarmupLR(opt, warmup, warmup, decay="constant", start_factor=0.0), total)
    ref_opt = _opt()
    hf = L.LambdaLR(ref_opt, lambda step: step / max(1, warmup) if step < warmup else 1.0)
    torch.testing.assert_close(ours, _lrs(ref_opt, hf, total), rtol=1e-12, atol=1e-15)
