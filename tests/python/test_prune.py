"""torchspeed.prune: the packed-mask ops on every device (each CPU ISA, CUDA) against torch
references (numpy.packbits bit order, a stable-sort N:M reference, exact sparsity counts,
torch.nn.utils.prune's structured choice), opcheck, bad input raising before any write; the verbs
(state_dict into a fresh model, deepcopy, remove), the cubic schedule, the fused optimizers keeping
pruned weights at exactly zero over 100 steps while matching torch.optim elsewhere, and the 2:4
export (CUDA, skipped here with the reason)."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch
import torch.nn.utils.prune  # noqa: F401 (the reference: torch.nn.utils.prune)
from torch import nn
from torch.testing import assert_close

import torchspeed
import torchspeed.prune as prune
from torchspeed.prune import (
    apply_mask_,
    magnitude_mask,
    nm_mask,
    pack_mask,
    unpack_mask,
)

pytestmark = pytest.mark.skipif(
    not hasattr(torch.ops.torchspeed, "nm_mask"), reason="built without the prune area"
)

DTYPES = [torch.float32, torch.float64, torch.bfloat16, torch.float16]


def nm_reference(w: torch.Tensor, n: int, m: int) -> torch.Tensor:
    """Keep the n largest |w| of each group of m along the last dim; ties: lower index first
    (a stable descending sort keeps the original order among equals)."""
    g = w.detach().float().abs().reshape(-1, m)
    order = torch.sort(g, dim=1, descending=True, stable=True).indices
    keep = torch.zeros_like(g, dtype=torch.bool)
    keep.scatter_(1, order[:, :n], True)
    return keep.reshape(w.shape)


def magnitude_reference(w: torch.Tensor, amount: int) -> torch.Tensor:
    """Prune the `amount` smallest |w|; ties: the higher index first (stable ascending sort of
    (|w|, -index))."""
    flat = w.detach().double().abs().reshape(-1)
    idx = torch.arange(flat.numel(), dtype=torch.float64)
    # Sort by |w| ascending, then by index descending: lexsort via two stable sorts.
    order = torch.sort(-idx, stable=True).indices
    order = order[torch.sort(flat[order], stable=True).indices]
    keep = torch.ones(flat.numel(), dtype=torch.bool)
    keep[order[:amount]] = False
    return keep.reshape(w.shape)


# ---- the ops ------------------------------------------------------------------------------------
@pytest.mark.parametrize("numel", [0, 1, 7, 8, 9, 63, 64, 65, 1000, 70007])
def test_pack_unpack_round_trip_and_bit_order(device, numel):
    g = torch.Generator().manual_seed(numel)
    keep = (torch.rand(numel, generator=g) > 0.4).to(device)
    packed = pack_mask(keep)
    assert packed.dtype == torch.uint8 and packed.shape == ((numel + 7) // 8,)
    expected = np.packbits(keep.cpu().numpy(), bitorder="little")
    assert np.array_equal(packed.cpu().numpy(), expected)
    assert torch.equal(unpack_mask(packed, [numel]), keep)
    if numel == 70007:
        assert torch.equal(unpack_mask(packed, [7, 10001]), keep.reshape(7, 10001))


@pytest.mark.parametrize("dtype", DTYPES)
def test_apply_mask_is_bit_exact(device, dtype):
    g = torch.Generator().manual_seed(1)
    w = torch.randn(37, 129, generator=g).to(dtype)
    w[0, :5] = torch.tensor([float("nan"), float("inf"), -0.0, -float("inf"), 3.0]).to(dtype)
    w = w.to(device)
    keep = (torch.rand(37, 129, generator=g) > 0.5).to(device)
    keep[0, :5] = True
    expected = torch.where(keep, w, torch.zeros_like(w))
    out = apply_mask_(w, pack_mask(keep))
    assert out is w
    # Bit for bit: kept elements (NaN included) are untouched, pruned ones are +0.0.
    bits = {2: torch.int16, 4: torch.int32, 8: torch.int64}[w.element_size()]
    assert torch.equal(w.view(bits), expected.view(bits))


def test_apply_mask_channels_last_uses_memory_order(device):
    w = torch.randn(4, 3, 5, 5, device=device).to(memory_format=torch.channels_last)
    keep = torch.rand(4, 3, 5, 5, device=device) > 0.5
    keep_mem = torch.empty_like(w, dtype=torch.bool).copy_(keep)  # channels_last bool
    expected = torch.where(keep, w, torch.zeros_like(w))
    apply_mask_(w, pack_mask(keep_mem))
    assert torch.equal(w, expected)


@pytest.mark.parametrize("n,m", [(2, 4), (1, 4), (4, 8), (3, 7), (0, 4), (4, 4), (8, 32)])
def test_nm_mask_matches_reference(device, n, m):
    g = torch.Generator().manual_seed(n * 100 + m)
    w = torch.randn(19, 4 * m * 3, generator=g)
    w[::3, ::5] = 0.5  # ties
    w[1::3, ::5] = -0.5
    w = w.to(device)
    keep = unpack_mask(nm_mask(w, n, m), w.shape)
    ref = nm_reference(w.cpu(), n, m)
    assert torch.equal(keep.cpu(), ref)
    per_group = keep.reshape(-1, m).sum(1)
    assert torch.all(per_group == n)


@pytest.mark.parametrize("dtype", DTYPES)
def test_nm_mask_every_dtype_against_topk(device, dtype):
    w = torch.randn(64, 256, dtype=torch.float64).to(dtype)
    # Distinct magnitudes per group in this dtype are not guaranteed at 16 bits: compare to the
    # stable reference, and to topk where the group has no ties.
    keep = unpack_mask(nm_mask(w.to(device), 2, 4), w.shape).cpu()
    assert torch.equal(keep, nm_reference(w, 2, 4))
    a = w.float().abs().reshape(-1, 4)
    no_ties = torch.tensor([len(set(r.tolist())) == 4 for r in a])
    top = torch.zeros_like(a, dtype=torch.bool).scatter_(1, a.topk(2, 1).indices, True)
    assert torch.equal(keep.reshape(-1, 4)[no_ties], top[no_ties])


@pytest.mark.parametrize("amount", [0, 1, 500, 4999, 5000, 2 * 4096 + 3])
def test_magnitude_mask_exact_count_and_choice(device, amount):
    g = torch.Generator().manual_seed(2)
    w = torch.randn(97, 103, generator=g)
    if amount > w.numel():
        amount = w.numel()
    w[5, :50] = 0.25  # a block of ties around the threshold for some amounts
    w = w.to(device)
    keep = unpack_mask(magnitude_mask(w, amount), w.shape)
    assert int((~keep).sum()) == amount
    assert torch.equal(keep.cpu(), magnitude_reference(w.cpu(), amount))


def test_magnitude_mask_ties_across_chunks(device):
    # 3 chunks of 64K elements, all equal: the pruned ones are exactly the last `amount`.
    w = torch.full((3 * 65536 + 5,), 0.5, device=device)
    amount = 100_000
    keep = unpack_mask(magnitude_mask(w, amount), w.shape)
    assert int((~keep).sum()) == amount
    assert bool(keep[: w.numel() - amount].all()) and not bool(keep[w.numel() - amount :].any())


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float64])
def test_magnitude_mask_low_precision(device, dtype):
    w = torch.randn(50, 64).to(dtype)
    keep = unpack_mask(magnitude_mask(w.to(device), 1000), w.shape).cpu()
    assert int((~keep).sum()) == 1000
    assert torch.equal(keep, magnitude_reference(w, 1000))


def test_ops_opcheck():
    w = torch.randn(8, 16)
    keep = torch.rand(8, 16) > 0.5
    packed = pack_mask(keep)
    torch.library.opcheck(torch.ops.torchspeed.pack_mask.default, (keep,))
    torch.library.opcheck(torch.ops.torchspeed.unpack_mask.default, (packed, [8, 16]))
    torch.library.opcheck(torch.ops.torchspeed.apply_mask_.default, (w.clone(), packed))
    torch.library.opcheck(torch.ops.torchspeed.nm_mask.default, (w, 2, 4))
    torch.library.opcheck(torch.ops.torchspeed.magnitude_mask.default, (w, 40))


def test_bad_inputs_raise_before_any_write(device):
    w = torch.randn(4, 6, device=device)
    before = w.clone()
    with pytest.raises(RuntimeError, match="multiple of m = 4"):
        nm_mask(w, 2, 4)
    with pytest.raises(RuntimeError, match=r"n must be in \[0, m = 3\]"):
        nm_mask(w, 5, 3)
    with pytest.raises(RuntimeError, match=r"m must be in \[1, 256\]"):
        nm_mask(w, 0, 0)
    with pytest.raises(RuntimeError, match=r"amount must be in \[0, numel = 24\]"):
        magnitude_mask(w, 25)
    with pytest.raises(RuntimeError, match=r"amount must be in \[0, numel = 24\]"):
        magnitude_mask(w, -1)
    with pytest.raises(RuntimeError, match=r"packed must have ceil\(24 / 8\) = 3 bytes, got 2"):
        apply_mask_(w, torch.zeros(2, dtype=torch.uint8, device=device))
    with pytest.raises(RuntimeError, match="packed must be uint8"):
        apply_mask_(w, torch.zeros(3, device=device))
    with pytest.raises(RuntimeError, match="w must be float32, float64, bfloat16 or float16"):
        apply_mask_(
            torch.zeros(24, dtype=torch.int32, device=device),
            torch.zeros(3, dtype=torch.uint8, device=device),
        )
    with pytest.raises(RuntimeError, match="mask must be bool"):
        pack_mask(torch.ones(8, device=device))
    with pytest.raises(RuntimeError, match=r"ceil\(10 / 8\) = 2 bytes"):
        unpack_mask(torch.zeros(3, dtype=torch.uint8, device=device), [10])
    assert torch.equal(w, before)


# ---- the verbs ----------------------------------------------------------------------------------
def _mlp(seed=0):
    torch.manual_seed(seed)
    return nn.Sequential(
        nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 16), nn.ReLU(), nn.Linear(16, 4)
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


# ---- gradual pruning ----------------------------------------------------------------------------
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


# ---- the optimizer keeps pruned weights at zero, inside its update pass -------------------------
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


# ---- 2:4 export ---------------------------------------------------------------------------------
def test_to_semi_structured_reports_reason_on_cpu():
    lin = nn.Linear(64, 64)
    prune.nm_sparse(lin, "weight", n=2, m=4)
    report = prune.to_semi_structured(lin)
    assert "CUDA" in report["<root>"] and isinstance(lin.weight, nn.Parameter)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="semi-structured sparsity needs CUDA")
def test_to_semi_structured_matmul_cuda():
    if torch.cuda.get_device_capability()[0] < 8:
        pytest.skip("semi-structured sparsity needs sm80+")
    lin = nn.Linear(256, 128).half().cuda()
    prune.nm_sparse(lin, "weight", n=2, m=4)
    x = torch.randn(64, 256, dtype=torch.half, device="cuda")
    dense = lin(x)
    report = prune.to_semi_structured(lin)
    assert report["<root>"] == "converted", report
    assert_close(lin(x), dense, rtol=1e-2, atol=1e-2)


def test_optimizer_op_takes_packed_masks_only():
    # The fused ops' `masks` list holds packed uint8 masks (or empty tensors): a dense float mask
    # or a wrong byte count is rejected before anything is written.
    p, g = torch.randn(20), torch.randn(20)
    before = p.clone()
    for bad in (torch.ones(20), torch.full((2,), 255, dtype=torch.uint8)):
        with pytest.raises(RuntimeError, match=r"masks\[0\] must be a bit-packed mask"):
            torch.ops.torchspeed.sgd_step_(
                [p],
                [g],
                [],
                [],
                [bad],
                [],
                lr=0.1,
                momentum=0.0,
                dampening=0.0,
                weight_decay=0.0,
                nesterov=False,
                maximize=False,
                first_step=True,
            )
    assert torch.equal(p, before)
    keep = torch.arange(20) % 3 != 0
    torch.ops.torchspeed.sgd_step_(
        [p],
        [g],
        [],
        [],
        [pack_mask(keep)],
        [],
        lr=0.1,
        momentum=0.0,
        dampening=0.0,
        weight_decay=0.0,
        nesterov=False,
        maximize=False,
        first_step=True,
    )
    assert_close(p, torch.where(keep, before - 0.1 * g, torch.zeros_like(p)))


# ---- adversarial cases: NaN, atomicity, autograd, resume, GradualPruner nm, argument types -----
def _state(model: nn.Module):
    return {k: v.clone() for k, v in model.state_dict().items()}


def _assert_unchanged(model: nn.Module, before) -> None:
    after = model.state_dict()
    assert after.keys() == before.keys()
    for k, v in before.items():
        assert torch.equal(after[k], v), k


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


def test_apply_mask_respects_autograd():
    a = torch.randn(16, requires_grad=True)
    b = a * 1.0
    c = (b * b).sum()
    with pytest.raises(RuntimeError, match="requires grad"):
        apply_mask_(b, torch.zeros(2, dtype=torch.uint8))
    with pytest.raises(RuntimeError, match="leaf Variable"):
        apply_mask_(a, torch.zeros(2, dtype=torch.uint8))
    assert a._version == 0 and bool((a != 0).all())
    with torch.no_grad():  # outside grad mode: allowed, and the version counter moves
        apply_mask_(b, torch.zeros(2, dtype=torch.uint8))
    assert b._version == 1 and bool((b == 0).all())
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        c.backward()
    d = torch.randn(16)
    apply_mask_(d, torch.zeros(2, dtype=torch.uint8))
    assert d._version == 1


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


def test_set_mask_rejects_non_tensor_and_foreign_param():
    p = torch.randn(8)
    opt = torchspeed.optim.SGD([p], lr=0.1)
    with pytest.raises(TypeError, match="mask must be a torch.Tensor"):
        opt.set_mask(p, [1] * 8)
    with pytest.raises(ValueError, match="param must be one of"):
        opt.set_mask(torch.randn(8), torch.ones(8, dtype=torch.bool))
    assert not opt._masks
