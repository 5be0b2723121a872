"""torchspeed.prune's verbs (prune/api.py, prune/mask.py): exact sparsity, torch.nn.utils.prune's
structured choice, deepcopy and remove, and bad arguments (types, ranges, NaN, dims) refused before
any mask or weight changes."""

from __future__ import annotations

import copy

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


def test_l1_unstructured_exact_sparsity_and_buffer():
    model = _mlp()
    ref = copy.deepcopy(model)
    prune.l1_unstructured(model[0], "weight", amount=0.3)
    w = model[0].weight
    assert isinstance(w, nn.Parameter) and type(w) is nn.Parameter
    assert int((w == 0).sum()) == round(0.3 * w.numel())
    packed = model[0].weight_mask_packed
    assert packed.dtype == torch.uint8 and packed.numel() * 32 <= w.numel() * 4 + 32
    # Same choice as torch.nn.utils.prune (continuous values: no ties).
    torch.nn.utils.prune.l1_unstructured(ref[0], "weight", amount=0.3)
    assert torch.equal(prune.get_mask(model[0]), ref[0].weight_mask.bool())
    assert torch.equal(model[0].weight, ref[0].weight)
    # int amount = a count; a second call prunes to the new total and keeps earlier zeros.
    prune.l1_unstructured(model[0], "weight", amount=1000)
    assert int((model[0].weight == 0).sum()) == 1000
    assert prune.is_pruned(model) and prune.sparsity(model)["0.weight"] == 1000 / w.numel()


def test_global_unstructured_exact_total():
    model = _mlp(1)
    ref = copy.deepcopy(model)
    params = [(model[0], "weight"), (model[2], "weight"), (model[4], "weight")]
    prune.global_unstructured(params, amount=0.6)
    total = sum(m.weight.numel() for m, _ in params)
    zeros = sum(int((m.weight == 0).sum()) for m, _ in params)
    assert zeros == round(0.6 * total)
    torch.nn.utils.prune.global_unstructured(
        [(ref[0], "weight"), (ref[2], "weight"), (ref[4], "weight")],
        pruning_method=torch.nn.utils.prune.L1Unstructured,
        amount=0.6,
    )
    for (m, _), r in zip(params, (ref[0], ref[2], ref[4])):
        assert torch.equal(prune.get_mask(m), r.weight_mask.bool())


@pytest.mark.parametrize("n", [1, 2])
def test_ln_structured_matches_torch(n):
    model = _mlp(2)
    ref = copy.deepcopy(model)
    prune.ln_structured(model[0], "weight", amount=0.25, n=n, dim=0)
    torch.nn.utils.prune.ln_structured(ref[0], "weight", amount=0.25, n=n, dim=0)
    assert torch.equal(prune.get_mask(model[0]), ref[0].weight_mask.bool())
    rows_zero = (model[0].weight == 0).all(1)
    assert int(rows_zero.sum()) == 16
    norms = torch.linalg.vector_norm(ref[0].weight_orig, ord=n, dim=1)
    assert norms[rows_zero].max() <= norms[~rows_zero].min()


def test_nm_sparse_linear_and_conv():
    lin = nn.Linear(64, 8)
    prune.nm_sparse(lin, "weight", n=2, m=4)
    assert torch.all((lin.weight != 0).reshape(8, -1, 4).sum(-1) == 2)
    conv = nn.Conv2d(4, 8, 3)  # rows of 4 * 3 * 3 = 36 elements
    prune.nm_sparse(conv, "weight", n=1, m=4)
    assert torch.all((conv.weight != 0).reshape(8, -1, 4).sum(-1) == 1)
    with pytest.raises(RuntimeError, match="multiple of m = 8"):
        prune.nm_sparse(nn.Linear(12, 2), "weight", n=2, m=8)


def test_apply_remove_state_dict_deepcopy():
    model = _mlp(3)
    prune.apply(model, method="nm", n=2, m=4)
    assert prune.is_pruned(model)
    x = torch.randn(5, 32)
    y = model(x)
    # No hooks: forward is the plain module; deepcopy works (pytorch#37322).
    assert not model[0]._forward_pre_hooks
    clone = copy.deepcopy(model)
    assert torch.equal(clone(x), y) and prune.is_pruned(clone)
    # Fresh unpruned model: the masks come from the state_dict.
    fresh = _mlp(99)
    prune.load_state_dict(fresh, model.state_dict())
    assert torch.equal(fresh(x), y)
    assert torch.equal(prune.get_mask(fresh[2]), prune.get_mask(model[2]))
    mask_bytes = sum(b.numel() for n, b in model.named_buffers() if n.endswith("_mask_packed"))
    weight_bytes = sum(m.weight.numel() * 4 for m, _ in prune.prunable_parameters(model))
    assert mask_bytes * 32 <= weight_bytes + 32 * 3
    prune.remove(model)
    assert not prune.is_pruned(model) and torch.equal(model(x), y)
    with pytest.raises(ValueError, match="is not pruned"):
        prune.remove(model[0], "weight")


def test_amount_validation():
    lin = nn.Linear(8, 4)
    before = lin.weight.detach().clone()
    for bad, err in [
        (1.5, ValueError),
        (-0.1, ValueError),
        (-1, ValueError),
        (33, ValueError),
        ("half", TypeError),
    ]:
        with pytest.raises(err):
            prune.l1_unstructured(lin, "weight", amount=bad)
    with pytest.raises(ValueError, match="method must be one of"):
        prune.apply(lin, method="random")
    assert torch.equal(lin.weight, before) and not prune.is_pruned(lin)


def test_global_unstructured_counts_nan_as_largest():
    lin = nn.Linear(4, 2)
    with torch.no_grad():
        lin.weight[0, :2] = float("nan")
    prune.global_unstructured([(lin, "weight")], amount=7)
    assert int((lin.weight == 0).sum()) == 7  # as l1_unstructured: the 6 finite and one NaN
    ref = nn.Linear(4, 2)
    with torch.no_grad():
        ref.weight.copy_(torch.tensor([[float("nan"), float("nan"), 1.0, 2.0], [3, 4, 5, 6]]))
    prune.global_unstructured([(ref, "weight")], amount=5)
    keep = prune.get_mask(ref)
    assert keep[0, :2].all() and int((~keep).sum()) == 5 and bool(keep[1, 3])


def test_apply_nm_bad_layer_changes_nothing():
    model = nn.Sequential(nn.Linear(16, 4), nn.Linear(6, 3))
    before = _state(model)
    with pytest.raises(RuntimeError, match="multiple of m = 4"):
        prune.apply(model, "nm")
    _assert_unchanged(model, before)
    assert not prune.is_pruned(model)


@pytest.mark.filterwarnings("ignore:Initializing zero-element tensors")
def test_nm_sparse_argument_checks():
    empty = nn.Linear(8, 0)
    prune.nm_sparse(empty, "weight")  # nothing to prune: a 0-byte mask
    assert prune.get_mask(empty).shape == (0, 8)
    lin = nn.Linear(8, 4)
    before = _state(lin)
    for bad in (2.5, True):
        with pytest.raises(TypeError, match="n must be an int"):
            prune.nm_sparse(lin, "weight", n=bad)
    with pytest.raises(TypeError, match="m must be an int"):
        prune.nm_sparse(lin, "weight", m=4.0)
    _assert_unchanged(lin, before)


def test_ln_structured_dim_out_of_range_is_index_error_like_torch():
    for dim in (5, 2, -3):
        ref = nn.Linear(6, 4)
        with pytest.raises(IndexError):
            torch.nn.utils.prune.ln_structured(ref, "weight", amount=1, n=2, dim=dim)
        lin = nn.Linear(6, 4)
        before = _state(lin)
        with pytest.raises(IndexError, match=rf"dim out of range.*\[-2, 1\], but got {dim}"):
            prune.ln_structured(lin, "weight", amount=1, n=2, dim=dim)
        _assert_unchanged(lin, before)
        assert not prune.is_pruned(lin)
        with pytest.raises(IndexError, match="dim out of range"):
            prune.apply(nn.Sequential(lin), "ln_structured", amount=1, dim=dim)
    with pytest.raises(TypeError, match="dim must be an int"):
        prune.ln_structured(nn.Linear(6, 4), "weight", amount=1, dim=1.0)
    # in range, negative dims count from the end as torch's do
    lin, ref = nn.Linear(6, 4), nn.Linear(6, 4)
    with torch.no_grad():
        ref.weight.copy_(lin.weight)
    prune.ln_structured(lin, "weight", amount=2, n=1, dim=-1)
    torch.nn.utils.prune.ln_structured(ref, "weight", amount=2, n=1, dim=-1)
    assert torch.equal(prune.get_mask(lin), ref.weight_mask.bool())


@pytest.mark.parametrize(
    "n,err,match",
    [
        ("nuc", ValueError, "n must be a number"),
        ("2", ValueError, "n must be a number"),
        (float("nan"), ValueError, "n must not be NaN"),
        (True, TypeError, "n must be a number"),
        (None, TypeError, "n must be a number"),
    ],
)
def test_ln_structured_bad_norm_order(n, err, match):
    lin = nn.Linear(6, 4)
    before = _state(lin)
    with pytest.raises(err, match=match):
        prune.ln_structured(lin, "weight", amount=1, n=n)
    with pytest.raises(err, match=match.replace("n must", "norm must")):
        prune.apply(nn.Sequential(lin), "ln_structured", amount=1, norm=n)
    _assert_unchanged(lin, before)
    assert not prune.is_pruned(lin)


@pytest.mark.parametrize("n", [1, 2, float("inf"), -float("inf"), "fro", 3.5])
def test_ln_structured_norm_orders_match_torch(n):
    lin, ref = nn.Linear(7, 9), nn.Linear(7, 9)
    with torch.no_grad():
        ref.weight.copy_(lin.weight)
    prune.ln_structured(lin, "weight", amount=4, n=n, dim=0)
    torch.nn.utils.prune.ln_structured(ref, "weight", amount=4, n=2 if n == "fro" else n, dim=0)
    assert torch.equal(prune.get_mask(lin), ref.weight_mask.bool())


def test_bad_module_name_and_parameters_are_type_errors():
    with pytest.raises(TypeError, match="module must be an nn.Module"):
        prune.l1_unstructured("model", "weight", 0.5)
    with pytest.raises(TypeError, match="name must be a str"):
        prune.l1_unstructured(nn.Linear(4, 4), 0, 0.5)
    with pytest.raises(TypeError, match=r"parameters\[0\] must be a \(module, name\) pair"):
        prune.global_unstructured([nn.Linear(4, 4)], 0.5)
    with pytest.raises(TypeError, match="parameters must be an iterable"):
        prune.global_unstructured("weight", 0.5)
    with pytest.raises(TypeError, match=r"parameters\[0\] must be a \(module, name\) pair"):
        prune.GradualPruner([("weight", nn.Linear(4, 4))], 0.5)
    with pytest.raises(TypeError, match="module must be an nn.Module"):
        prune.remove("model")
    with pytest.raises(TypeError, match="name must be a str or None"):
        prune.remove(nn.Linear(4, 4), 1)


def test_bad_types_argument_and_queries_on_non_modules():
    """Adversarial pass (issue 23): isinstance's own TypeError or an AttributeError before."""
    model = nn.Sequential(nn.Linear(8, 4))
    for bad in (5, (nn.Linear, "Conv"), ()):
        with pytest.raises(TypeError, match="types must be a module class or a tuple of them"):
            prune.apply(model, types=bad)
        with pytest.raises(TypeError, match="types must be a module class"):
            prune.sparsity(model, types=bad)
    assert not prune.is_pruned(model)
    for fn in (prune.is_pruned, prune.sparsity, prune.prunable_parameters, prune.get_mask):
        with pytest.raises(TypeError, match="must be an nn.Module, got str"):
            fn("model")
    with pytest.raises(TypeError, match="get_mask: name must be a str"):
        prune.get_mask(model[0], 3)
    with pytest.raises(TypeError, match="apply: method must be a str"):
        prune.apply(model, method=["nm"])
