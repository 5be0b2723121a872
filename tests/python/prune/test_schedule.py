"""torchspeed.prune.GradualPruner (prune/schedule.py): the cubic schedule's values, pruning steps,
state_dict, N:M reached gradually, and every argument and target checked at construction."""

from __future__ import annotations

import pytest
import torch
import torch.nn.utils.prune  # noqa: F401 (the reference: torch.nn.utils.prune)
from prune_helpers import (
    _assert_unchanged,
    _mlp,
    _state,
)
from torch import nn

import torchspeed
import torchspeed.prune as prune

pytestmark = pytest.mark.skipif(
    not hasattr(torch.ops.torchspeed, "nm_mask"), reason="built without the prune area"
)


def test_cubic_schedule_values():
    si, sf, t0, t1 = 0.1, 0.9, 10, 110
    for t in range(0, 130, 7):
        got = prune.cubic_sparsity(t, si, sf, t0, t1)
        if t < t0:
            assert got is None
        else:
            tt = min(t, t1)
            assert got == pytest.approx(
                sf + (si - sf) * (1 - (tt - t0) / (t1 - t0)) ** 3, abs=1e-15
            )


def test_gradual_pruner_steps_and_state_dict():
    model = _mlp(4)
    opt = torchspeed.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    pruner = prune.GradualPruner(
        model, final_sparsity=0.8, start_step=2, end_step=12, frequency=5, optimizer=opt
    )
    applied = [pruner.step() for _ in range(15)]
    assert [i for i, s in enumerate(applied) if s is not None] == [2, 7, 12]
    assert applied[12] == pytest.approx(0.8)
    for m, _ in prune.prunable_parameters(model):
        assert int((m.weight == 0).sum()) == round(0.8 * m.weight.numel())
    state = pruner.state_dict()
    other = prune.GradualPruner(_mlp(5), final_sparsity=0.8, start_step=2, end_step=12, frequency=5)
    other.load_state_dict(state)
    assert other.step_count == 15
    with pytest.raises(ValueError, match="final_sparsity"):
        prune.GradualPruner(
            _mlp(5), final_sparsity=0.5, start_step=2, end_step=12, frequency=5
        ).load_state_dict(state)


def test_gradual_nm():
    model = _mlp(6)
    pruner = prune.GradualPruner(
        model, start_step=0, end_step=4, frequency=2, method="nm", n=2, m=4
    )
    for _ in range(5):
        pruner.step()
    assert torch.all((model[0].weight != 0).reshape(64, -1, 4).sum(-1) == 2)


def test_gradual_nm_final_sparsity_and_n_m():
    model = _mlp(6)
    with pytest.raises(ValueError, match="final_sparsity"):
        prune.GradualPruner(model, final_sparsity=0.0, method="nm")
    with pytest.raises(ValueError, match="final_sparsity"):
        prune.GradualPruner(model, final_sparsity=0.5, method="nm", n=1, m=8)
    with pytest.raises(ValueError, match="m must be"):
        prune.GradualPruner(model, method="nm", n=0, m=0)
    with pytest.raises(TypeError, match="n must be an int"):
        prune.GradualPruner(model, method="nm", n=2.5, m=4)
    p = prune.GradualPruner(model, final_sparsity=0.5, method="nm", n=2, m=4, end_step=0)
    assert p.step() == 0.5 and prune.sparsity(model)["total"] == 0.5


def test_gradual_load_state_dict_step_count():
    p = prune.GradualPruner(_mlp(6), final_sparsity=0.5)
    with pytest.raises(ValueError, match="step_count"):
        p.load_state_dict({"method": "unstructured"})
    with pytest.raises(ValueError, match="step_count"):
        p.load_state_dict({"step_count": -1})
    p.load_state_dict({"step_count": 5})
    assert p.step_count == 5


def test_gradual_nm_checks_every_target_at_construction():
    model = nn.Sequential(nn.Linear(16, 4), nn.Linear(6, 3))
    before = _state(model)
    with pytest.raises(
        ValueError, match=r"Linear.weight \(shape \[3, 6\]\) have 6 elements.*m = 4"
    ):
        prune.GradualPruner(model, method="nm", n=2, m=4, start_step=0, end_step=0)
    _assert_unchanged(model, before)
    assert not prune.is_pruned(model)


def test_gradual_step_that_fails_does_not_advance():
    model = nn.Sequential(nn.Linear(16, 4))
    pruner = prune.GradualPruner(model, 0.5, start_step=0, end_step=0)
    # a weight swapped for an integer one after construction: the due step raises
    model[0].weight = nn.Parameter(torch.zeros(4, 16, dtype=torch.int64), requires_grad=False)
    with pytest.raises(TypeError, match="floating"):
        pruner.step()
    assert pruner.step_count == 0


@pytest.mark.parametrize(
    "kwargs,err,match",
    [
        ({"final_sparsity": "0.5"}, TypeError, "final_sparsity must be a float"),
        ({"final_sparsity": True}, TypeError, "final_sparsity must be a float"),
        ({"final_sparsity": float("nan")}, ValueError, "final_sparsity must be in"),
        ({"final_sparsity": 0.5, "initial_sparsity": "0"}, TypeError, "initial_sparsity"),
        (
            {"final_sparsity": 0.5, "start_step": float("nan")},
            TypeError,
            "start_step must be an int",
        ),
        ({"final_sparsity": 0.5, "end_step": float("inf")}, TypeError, "end_step must be an int"),
        ({"final_sparsity": 0.5, "frequency": 1.5}, TypeError, "frequency must be an int"),
        ({"final_sparsity": 0.5, "frequency": 0}, ValueError, "frequency must be >= 1"),
        ({"final_sparsity": 0.5, "start_step": -1}, ValueError, "start_step must be >= 0"),
        ({"final_sparsity": 0.5, "start_step": 5, "end_step": 4}, ValueError, "end_step must be"),
        ({"final_sparsity": 0.5, "method": 3}, TypeError, "method must be a str"),
        ({"final_sparsity": 0.5, "optimizer": "adam"}, TypeError, "optimizer"),
        ({"final_sparsity": 0.2, "initial_sparsity": 0.3}, ValueError, "initial_sparsity"),
    ],
)
def test_gradual_pruner_argument_errors_name_the_argument(kwargs, err, match):
    with pytest.raises(err, match=match):
        prune.GradualPruner(_mlp(6), **kwargs)


def test_cubic_sparsity_and_load_state_dict_refuse_bad_values():
    """Adversarial pass (issue 23): NaN steps gave a NaN sparsity; a None state raised Python's
    own TypeError; any last_sparsity was taken."""
    with pytest.raises(TypeError, match="cubic_sparsity: step must be an int, got nan"):
        prune.cubic_sparsity(float("nan"), 0.0, 0.5, 0, 10)
    with pytest.raises(ValueError, match="cubic_sparsity: final must be in"):
        prune.cubic_sparsity(3, 0.0, 1.5, 0, 10)
    with pytest.raises(TypeError, match="cubic_sparsity: initial must be a float"):
        prune.cubic_sparsity(3, "0", 0.5, 0, 10)
    p = prune.GradualPruner(_mlp(6), final_sparsity=0.5)
    with pytest.raises(TypeError, match="state must be a dict, got <class 'NoneType'>"):
        p.load_state_dict(None)
    for bad in ("x", 1.5, True):
        with pytest.raises(ValueError, match="last_sparsity must be None or a float in"):
            p.load_state_dict({"step_count": 3, "last_sparsity": bad})
    assert p.step_count == 0 and p.last_sparsity is None
    p.load_state_dict({"step_count": 3, "last_sparsity": 0.25})
    assert p.step_count == 3 and p.last_sparsity == 0.25
