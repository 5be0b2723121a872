"""lamb_step_'s two phases (phase=1: steps, moments and each tensor's squared norms into `norms`;
phase=2: the update with the norms given), which ZeRO-1 uses to give a param cut into pieces the
trust ratio of the whole param: the pair equals the one-call step bit for bit, pieces whose norms
are summed equal the whole param's step, an inf/NaN skip leaves everything as it was, and bad
arguments are refused before anything is written."""

from __future__ import annotations

import pytest
import torch

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
HYPER = dict(lr=1e-2, beta1=0.9, beta2=0.999, eps=1e-6, weight_decay=0.1, maximize=False)


def _call(shapes, device, dtype=torch.float32, seed=0, masters=False):
    """Fresh lamb_step_ lists: params (bf16 with float32 masters when `masters`), grads, moments
    two steps in, step counts."""
    g = torch.Generator().manual_seed(seed)
    ps = [torch.randn(s, generator=g) for s in shapes]
    d = dict(
        params=[p.to(dtype) if masters else p.clone() for p in ps],
        grads=[torch.randn(s, generator=g).to(dtype if masters else torch.float32) for s in shapes],
        exp_avgs=[torch.randn(s, generator=g) * 0.1 for s in shapes],
        exp_avg_sqs=[torch.rand(s, generator=g) * 0.01 for s in shapes],
        masters=[p.clone() for p in ps] if masters else [],
        steps=[torch.tensor(2.0) for _ in shapes],
        masks=[],
        emas=[],
    )
    return {k: [t.to(device) for t in v] for k, v in d.items()}


def _run(d, phase=0, norms=None, **scalars):
    torch.ops.torchspeed.lamb_step_(
        *d.values(), **HYPER, **scalars, **({} if phase == 0 else dict(norms=norms, phase=phase))
    )


def _clone(d):
    return {k: [t.clone() for t in v] for k, v in d.items()}


def _assert_bits_equal(a, b):
    for k in a:
        for i, (x, y) in enumerate(zip(a[k], b[k])):
            assert torch.equal(x.cpu(), y.cpu()), f"{k}[{i}]"


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("masters", [False, True])
def test_phase_1_then_2_is_the_one_call_step_bitwise(device, masters):
    shapes = [(70_001,), (33, 7), (5,)]  # a multi-chunk tensor, a matrix, a tiny one
    whole = _call(shapes, device, torch.bfloat16, masters=masters)
    split = _clone(whole)
    _run(whole)
    norms = torch.full((3, 2), float("nan"), dtype=torch.float64, device=device)
    _run(split, 1, norms)
    assert torch.isfinite(norms).all() and (norms > 0).all()
    assert all(float(s) == 3.0 for s in split["steps"])  # phase 1 counts the step
    _run(split, 2, norms)
    assert all(float(s) == 3.0 for s in split["steps"])  # phase 2 does not count it again
    _assert_bits_equal(whole, split)


@pytest.mark.parametrize("device", DEVICES)
def test_pieces_with_summed_norms_step_as_the_whole_param(device):
    """A param cut in three pieces (as ZeRO-1 cuts it across ranks), each stepped in its own
    phase-1 call, the three rows summed (float64), then phase 2: the whole param's step, up to
    the order of the float64 sums (rtol 1e-6); the trust ratio of each piece alone is visibly
    different (which is what the sum fixes)."""
    whole = _call([(9_000,)], device)
    cuts = [(0, 1_000), (1_000, 5_000), (6_000, 3_000)]
    pieces = [
        {
            k: [v[0].clone() if k == "steps" else v[0].narrow(0, o, n).clone()] if v else []
            for k, v in whole.items()
        }
        for o, n in cuts
    ]
    alone = [_clone(p) for p in pieces]
    _run(whole)
    rows = [torch.zeros(1, 2, dtype=torch.float64, device=device) for _ in pieces]
    for piece, row in zip(pieces, rows):
        _run(piece, 1, row)
    total = sum(rows)
    for piece in pieces:
        _run(piece, 2, total.clone())
    got = torch.cat([p["params"][0] for p in pieces])
    torch.testing.assert_close(got, whole["params"][0], rtol=1e-6, atol=1e-7)
    for piece in alone:
        _run(piece)
    wrong = torch.cat([p["params"][0] for p in alone])
    assert (wrong - whole["params"][0]).abs().max() > 1e-4


@pytest.mark.parametrize("device", DEVICES)
def test_a_skipped_step_writes_zero_norms_and_changes_nothing(device):
    d = _call([(300,), (4,)], device)
    before = _clone(d)
    found = torch.ones(1, device=device)
    norms = torch.full((2, 2), 7.0, dtype=torch.float64, device=device)
    _run(d, 1, norms, found_inf=found)
    assert torch.equal(norms.cpu(), torch.zeros(2, 2, dtype=torch.float64))
    _run(d, 2, norms, found_inf=found)
    _assert_bits_equal(d, before)


def test_bad_phase_and_norms_are_refused_before_anything_is_written():
    d = _call([(300,), (4,)], "cpu")
    before = _clone(d)
    f64 = dict(dtype=torch.float64)
    bad = [
        (dict(phase=3, norms=torch.zeros(2, 2, **f64)), r"phase must be 0 \(the whole step\)"),
        (dict(phase=-1), "phase must be 0"),
        (dict(phase=1), r"norms must be a contiguous float64 \[2, 2\] tensor on cpu with phase 1"),
        (dict(phase=2, norms=torch.zeros(2, 2)), "got Float"),
        (dict(phase=1, norms=torch.zeros(3, 2, **f64)), r"got Double \[3, 2\]"),
        (dict(phase=2, norms=torch.zeros(2, 2, **f64).t()), r"\(not contiguous\)"),
        (dict(phase=0, norms=torch.zeros(2, 2, **f64)), "norms must be None with phase 0"),
    ]
    for kwargs, message in bad:
        with pytest.raises(RuntimeError, match=message):
            torch.ops.torchspeed.lamb_step_(*d.values(), **HYPER, **kwargs)
    shared = {k: v[:1] * 2 for k, v in d.items()}  # params[0] listed twice
    with pytest.raises(RuntimeError, match="must not share memory with phase 1"):
        torch.ops.torchspeed.lamb_step_(
            *shared.values(), **HYPER, norms=torch.zeros(2, 2, **f64), phase=1
        )
    _assert_bits_equal(d, before)


def test_opcheck_both_phases():
    from torch.library import opcheck

    for phase in (1, 2):
        d = _call([(300,), (4,)], "cpu")
        norms = torch.ones(2, 2, dtype=torch.float64)
        opcheck(
            torch.ops.torchspeed.lamb_step_.default,
            tuple(d.values()),
            dict(HYPER, norms=norms, phase=phase),
        )
