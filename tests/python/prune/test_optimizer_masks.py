"""Masks registered with optimizers (prune/optimizer_masks.py): the fused optimizers keep pruned
weights at exactly zero over 100 steps while matching torch.optim elsewhere, torch.optim gets a
post-hook, resume, tied weights, and remove() with or without optimizer=."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.utils.prune  # noqa: F401 (the reference: torch.nn.utils.prune)
from prune_helpers import (
    _assert_unchanged,
    _make_opt,
    _mlp,
    _state,
    _tied,
    _train_step,
)
from torch import nn
from torch.testing import assert_close

import torchspeed
import torchspeed.prune as prune
from torchspeed.prune import (
    pack_mask,
)

pytestmark = pytest.mark.skipif(
    not hasattr(torch.ops.torchspeed, "nm_mask"), reason="built without the prune area"
)


@pytest.mark.parametrize("make", ["adamw", "sgd", "lion"])
def test_fused_optimizer_keeps_pruned_weights_zero(make, cpu_isa):
    torch.manual_seed(7)
    model = _mlp(7)
    ref = copy.deepcopy(model)
    if make == "adamw":
        opt = torchspeed.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.1)
        ref_opt = torch.optim.AdamW(ref.parameters(), lr=1e-2, weight_decay=0.1, foreach=False)
    elif make == "sgd":
        opt = torchspeed.optim.SGD(model.parameters(), lr=1e-2, momentum=0.9, weight_decay=0.1)
        ref_opt = torch.optim.SGD(
            ref.parameters(), lr=1e-2, momentum=0.9, weight_decay=0.1, foreach=False
        )
    else:
        opt = torchspeed.optim.Lion(model.parameters(), lr=1e-3, weight_decay=0.1)
        ref_opt = None
    prune.apply(model, method="l1_unstructured", amount=0.5, optimizer=opt)
    masks = {id(m.weight): prune.get_mask(m) for m, _ in prune.prunable_parameters(model)}
    with torch.no_grad():  # the reference starts from the same pruned weights
        for p, q in zip(model.parameters(), ref.parameters()):
            q.copy_(p)
    x, y = torch.randn(64, 32), torch.randn(64, 4)
    for _ in range(100):
        for mod, o in ((model, opt), (ref, ref_opt)):
            if o is None:
                continue
            o.zero_grad()
            nn.functional.mse_loss(mod(x), y).backward()
            o.step()
        for m, _ in prune.prunable_parameters(model):
            assert bool((m.weight[~masks[id(m.weight)]] == 0).all())
        if ref_opt is not None:
            with torch.no_grad():  # torch.optim with the mask applied after its step
                for (m, _), (r, _) in zip(
                    prune.prunable_parameters(model), prune.prunable_parameters(ref)
                ):
                    r.weight.mul_(masks[id(m.weight)])
    if ref_opt is not None:
        for p, q in zip(model.parameters(), ref.parameters()):
            assert_close(p, q, rtol=1e-6, atol=1e-6)  # optim/test_optimizers.py's FP32 tolerance


def test_set_mask_formats_and_errors():
    p = torch.randn(4, 5)
    keep = torch.rand(4, 5) > 0.5
    opt = torchspeed.optim.SGD([p], lr=0.1)
    for mask in (keep, keep.float(), pack_mask(keep)):
        opt.set_mask(p, mask)
        assert torch.equal(opt._masks[p], pack_mask(keep))
    with pytest.raises(ValueError, match="packed uint8 mask of ceil"):
        opt.set_mask(p, torch.ones(7))
    # channels_last param: the stored mask is in memory order, applied to the right elements.
    w = torch.randn(2, 3, 4, 4).to(memory_format=torch.channels_last)
    keep4 = torch.rand(2, 3, 4, 4) > 0.5
    opt2 = torchspeed.optim.SGD([w], lr=0.1)
    opt2.set_mask(w, keep4)
    w.grad = torch.randn_like(w)
    opt2.step()
    assert bool((w[~keep4] == 0).all()) and bool((w[keep4] != 0).all())


def test_torch_optimizer_gets_a_post_hook():
    model = _mlp(8)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    prune.l1_unstructured(model[0], "weight", 0.5, optimizer=opt)
    keep = prune.get_mask(model[0])
    model(torch.randn(3, 32)).sum().backward()
    opt.step()
    assert bool((model[0].weight[~keep] == 0).all())


def test_bad_optimizer_changes_nothing():
    lin = nn.Linear(8, 4)
    before = _state(lin)
    with pytest.raises(TypeError, match="optimizer"):
        prune.l1_unstructured(lin, "weight", amount=0.5, optimizer="adam")
    _assert_unchanged(lin, before)
    other = torchspeed.optim.AdamW(nn.Linear(8, 4).parameters())
    with pytest.raises(ValueError, match="optimizer does not hold"):
        prune.nm_sparse(lin, "weight", optimizer=other)
    _assert_unchanged(lin, before)
    assert not prune.is_pruned(lin)


@pytest.mark.parametrize("kind", ["fused", "torch"])
def test_resume_keeps_masks_registered(kind):
    def net():
        torch.manual_seed(3)
        return _mlp(3)

    def make_opt(model):
        if kind == "fused":
            return torchspeed.optim.AdamW(model.parameters(), lr=1e-2)
        return torch.optim.AdamW(model.parameters(), lr=1e-2)

    x, y = torch.randn(16, 32), torch.randn(16, 4)

    def train(model, opt, steps):
        for _ in range(steps):
            opt.zero_grad()
            nn.functional.mse_loss(model(x), y).backward()
            opt.step()

    model = net()
    opt = make_opt(model)
    prune.apply(model, "l1_unstructured", 0.5, optimizer=opt)
    train(model, opt, 2)
    sd, osd = model.state_dict(), opt.state_dict()
    expected = prune.sparsity(model)
    fresh = net()
    fopt = make_opt(fresh)
    prune.load_state_dict(fresh, sd, optimizer=fopt)
    fopt.load_state_dict(osd)
    train(fresh, fopt, 3)
    assert prune.sparsity(fresh) == expected
    with pytest.raises(TypeError, match="optimizer"):
        prune.load_state_dict(net(), sd, optimizer="adam")


def test_set_mask_rejects_non_tensor_and_foreign_param():
    p = torch.randn(8)
    opt = torchspeed.optim.SGD([p], lr=0.1)
    with pytest.raises(TypeError, match="mask must be a torch.Tensor"):
        opt.set_mask(p, [1] * 8)
    with pytest.raises(ValueError, match="param must be one of"):
        opt.set_mask(torch.randn(8), torch.ones(8, dtype=torch.bool))
    assert not opt._masks


@pytest.mark.parametrize("kind", ["fused", "torch"])
def test_tied_weights_remove_keeps_the_other_modules_mask(kind):
    model, a, b = _tied()
    opt = _make_opt(kind, model.parameters())
    prune.apply(model, "l1_unstructured", 0.5, optimizer=opt)
    keep = prune.get_mask(b)
    prune.remove(a, "weight", optimizer=opt)
    assert not prune.is_pruned(a) and prune.is_pruned(b)
    for _ in range(3):
        _train_step(model, opt)
    # b still prunes the shared weight: the optimizer keeps it at zero there
    assert bool((b.weight[~keep] == 0).all()) and bool((b.weight[keep] != 0).all())
    prune.remove(b, "weight")  # the last holder: the weight trains densely again
    _train_step(model, opt)
    assert bool((b.weight[~keep] != 0).all())


def test_tied_weights_with_different_masks_apply_both():
    model, a, b = _tied(1)
    opt = _make_opt("fused", model.parameters())
    prune.l1_unstructured(a, "weight", 0.25, optimizer=opt)
    keep_a = prune.get_mask(a)
    with torch.no_grad():  # b's own choice differs from a's
        a.weight.copy_(torch.randn(8, 8) * keep_a)
    prune.ln_structured(b, "weight", 2, optimizer=opt)
    both = keep_a & prune.get_mask(b)
    for _ in range(2):
        _train_step(model, opt)
    assert bool((a.weight[~both] == 0).all())
    prune.remove(b, "weight", optimizer=opt)
    _train_step(model, opt)
    assert bool((a.weight[~keep_a] == 0).all()) and bool((a.weight[keep_a] != 0).all())


@pytest.mark.parametrize("kind", ["fused", "torch"])
def test_remove_without_optimizer_unregisters_the_mask(kind):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 8), nn.Tanh(), nn.Linear(8, 3))
    opt = _make_opt(kind, model.parameters())
    prune.apply(model, "l1_unstructured", 0.5, optimizer=opt)
    keep = prune.get_mask(model[0])
    prune.remove(model)  # no optimizer=: every optimizer it was registered with forgets it
    # the next step is a dense step, equal to torch.optim.SGD's on a copy
    ref = copy.deepcopy(model)
    ref_opt = torch.optim.SGD(ref.parameters(), lr=0.1)
    x = torch.randn(4, 8)
    for m, o in ((model, opt), (ref, ref_opt)):
        o.zero_grad()
        m(x).square().sum().backward()
        o.step()
    assert_close(model[0].weight, ref[0].weight, rtol=1e-6, atol=1e-7)
    assert bool((model[0].weight[~keep] != 0).all())


def test_remove_with_a_torch_optimizer():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 8), nn.Tanh(), nn.Linear(8, 3))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    prune.apply(model, "l1_unstructured", 0.5, optimizer=opt)
    keep = prune.get_mask(model[0])
    # a bad optimizer= is refused before any mask is dropped
    with pytest.raises(TypeError, match="optimizer"):
        prune.remove(model, optimizer="sgd")
    assert prune.is_pruned(model[0]) and prune.is_pruned(model[2])
    prune.remove(model[0], "weight", optimizer=opt)  # raised "Boolean value of Tensor" before
    assert not prune.is_pruned(model[0]) and prune.is_pruned(model[2])
    keep2 = prune.get_mask(model[2])
    _train_step(model, opt)
    assert bool((model[0].weight[~keep] != 0).all())  # unregistered: trains densely
    assert bool((model[2].weight[~keep2] == 0).all())  # still registered


@pytest.mark.parametrize("kind", ["fused", "torch"])
def test_pruning_further_without_optimizer_updates_its_registered_mask(kind):
    """Adversarial pass (issue 23): a second prune without optimizer= left the fused optimizer
    with the first, denser mask, so the newly pruned weights regrew at the next step."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 8), nn.Tanh(), nn.Linear(8, 3))
    opt = _make_opt(kind, model.parameters())
    prune.l1_unstructured(model[0], "weight", 0.25, optimizer=opt)
    prune.l1_unstructured(model[0], "weight", 0.75)  # no optimizer=: the registered one follows
    keep = prune.get_mask(model[0])
    assert int((~keep).sum()) == 48
    for _ in range(2):
        _train_step(model, opt)
    assert bool((model[0].weight[~keep] == 0).all()) and bool((model[0].weight[keep] != 0).all())
    # a state_dict loaded without optimizer= reaches the registered optimizer too
    fresh = copy.deepcopy(model)
    prune.l1_unstructured(fresh[0], "weight", 0.9)
    prune.load_state_dict(model, fresh.state_dict())
    keep = prune.get_mask(model[0])
    _train_step(model, opt)
    assert int((~keep).sum()) == round(0.9 * 64) and bool((model[0].weight[~keep] == 0).all())
