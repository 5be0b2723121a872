"""torchspeed.prune's packed-mask ops (prune/_ops.py) on every device (each CPU ISA, CUDA)
against torch references (numpy.packbits bit order, a stable-sort N:M reference, exact sparsity
counts), opcheck, autograd, bad input raising before any write, and the fused optimizer ops taking
the same packed masks."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.utils.prune  # noqa: F401 (the reference: torch.nn.utils.prune)
from prune_helpers import (
    DTYPES,
    magnitude_reference,
    nm_reference,
)
from torch.testing import assert_close

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


def test_op_wrappers_refuse_bad_python_types_before_the_op():
    """Adversarial pass (issue 23): each raised RuntimeError from the dispatcher, or truncated a
    float silently, before."""
    w = torch.randn(4, 8)
    with pytest.raises(TypeError, match="pack_mask: mask must be a tensor, got list"):
        pack_mask([True] * 8)
    with pytest.raises(TypeError, match="nm_mask: w must be a tensor, got list"):
        nm_mask([1.0, 2.0, 3.0, 4.0])
    with pytest.raises(TypeError, match="nm_mask: n must be an int, got 2.5"):
        nm_mask(w, 2.5, 4)
    with pytest.raises(TypeError, match=r"unpack_mask: shape\[1\] must be an int, got 2.5"):
        unpack_mask(torch.zeros(1, dtype=torch.uint8), [1, 2.5])
    with pytest.raises(TypeError, match="unpack_mask: shape must be a sequence of ints"):
        unpack_mask(torch.zeros(1, dtype=torch.uint8), None)
    with pytest.raises(TypeError, match="magnitude_mask: amount must be an int, got 2.5"):
        magnitude_mask(w, 2.5)
    with pytest.raises(ValueError, match="magnitude_mask: amount must fit in int64"):
        magnitude_mask(w, 10**20)
    with pytest.raises(TypeError, match="apply_mask_: packed must be a tensor"):
        apply_mask_(w, [255, 255, 255, 255])
    assert torch.equal(unpack_mask(pack_mask(w > 0), torch.Size([4, 8])), w > 0)
