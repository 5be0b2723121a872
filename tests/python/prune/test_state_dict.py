"""torchspeed.prune.load_state_dict (prune/state_dict.py): masks into a fresh model, and bad
mask entries, keys and shapes refused before anything changes."""

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

import torchspeed.prune as prune

pytestmark = pytest.mark.skipif(
    not hasattr(torch.ops.torchspeed, "nm_mask"), reason="built without the prune area"
)


@pytest.mark.parametrize("bad", ["short", "float"])
def test_load_state_dict_bad_mask_changes_nothing(bad):
    src = nn.Sequential(nn.Linear(32, 8))
    prune.l1_unstructured(src[0], "weight", 0.5)
    sd = src.state_dict()
    if bad == "short":
        sd["0.weight_mask_packed"] = torch.zeros(3, dtype=torch.uint8)
    else:
        sd["0.weight_mask_packed"] = sd["0.weight_mask_packed"].float()
    fresh = nn.Sequential(nn.Linear(32, 8))
    before = _state(fresh)
    with pytest.raises(ValueError, match="weight_mask_packed"):
        prune.load_state_dict(fresh, sd)
    _assert_unchanged(fresh, before)
    assert not prune.is_pruned(fresh)


def test_load_dense_state_dict_into_pruned_model_changes_nothing():
    torch.manual_seed(0)
    model = _mlp(3)
    prune.apply(model, "l1_unstructured", 0.5)
    dense = _mlp(4).state_dict()
    before = _state(model)
    with pytest.raises(
        RuntimeError, match=r"nothing was loaded\):\n\tMissing key\(s\).*weight_mask_packed"
    ):
        prune.load_state_dict(model, dense)
    _assert_unchanged(model, before)
    # a size mismatch is refused before anything is copied, strict or not
    bad = dict(dense)
    bad["2.weight"] = torch.zeros(5, 5)
    for strict in (True, False):
        with pytest.raises(RuntimeError, match=r"size mismatch for 2.weight"):
            prune.load_state_dict(model, bad, strict=strict)
        _assert_unchanged(model, before)
    with pytest.raises(RuntimeError, match="expected torch.Tensor"):
        prune.load_state_dict(model, {**dense, "0.bias": [0.0] * 64}, strict=False)
    _assert_unchanged(model, before)
    # strict=False: the weights load, the model keeps its masks (applied to them), as a missing
    # key leaves a module's own state in torch
    keep = prune.get_mask(model[0])
    prune.load_state_dict(model, dense, strict=False)
    assert torch.equal(model[0].weight, dense["0.weight"] * keep)
    assert torch.equal(model[0].bias, dense["0.bias"]) and torch.equal(
        prune.get_mask(model[0]), keep
    )
    with pytest.raises(TypeError, match="state_dict must be a mapping"):
        prune.load_state_dict(model, [("0.weight", dense["0.weight"])])
    with pytest.raises(TypeError, match="strict must be a bool"):
        prune.load_state_dict(model, dense, strict="yes")
