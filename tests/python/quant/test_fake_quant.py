"""torchspeed.quant fake-quant and observers: the forward bit for bit against
torch.fake_quantize_per_{tensor,channel}_affine(_cachemask) on float32 (every CPU ISA, CUDA), the
same formula on x.float() for bf16/fp16, per group against a torch reference, the straight-through
gradient exactly grad * mask (and equal to torch's autograd), opcheck, torch.compile, bad input,
the observers against torch.ao's, and the FakeQuantize module in a small QAT loop (fp32 and bf16
autocast); adversarial input: NaN/inf batches (refused, module unchanged), module dtype casts,
torch.ao observers and bad constructor arguments (refused by name)."""

from __future__ import annotations

import warnings

import pytest
import torch

from torchspeed.quant import (
    FakeQuantize,
    MinMaxObserver,
    MovingAverageMinMaxObserver,
    PercentileObserver,
    choose_qparams,
    fake_quantize,
)

pytestmark = pytest.mark.skipif(
    not hasattr(torch.ops.torchspeed, "fake_quantize"), reason="built without the quant area"
)

DTYPES = [torch.float32, torch.bfloat16, torch.float16]


def reference(x, scale, zp, qmin, qmax):
    """The formula on x.float() with torch ops (scale / zp broadcast by the granularity rule),
    then cast to x's dtype; returns (y, mask)."""
    cols = x.shape[-1]
    rows = x.numel() // cols
    v = x.float().reshape(rows, cols)
    zp = torch.zeros_like(scale, dtype=torch.int32) if zp is None else zp
    if scale.numel() == 1:
        s, z = scale.reshape(1, 1), zp.reshape(1, 1)
    elif scale.dim() == 1:
        s, z = scale.reshape(rows, 1), zp.reshape(rows, 1)
    else:
        g = cols // scale.shape[1]
        s, z = scale.repeat_interleave(g, dim=1), zp.repeat_interleave(g, dim=1)
    q = torch.round(v * (1.0 / s)) + z.float()
    y = (q.clamp(qmin, qmax) - z.float()) * s
    mask = (q >= qmin) & (q <= qmax)
    return y.reshape(x.shape).to(x.dtype), mask.reshape(x.shape)


def same_bits(a, b):
    assert a.dtype == b.dtype and a.shape == b.shape
    torch.testing.assert_close(a, b, rtol=0, atol=0, equal_nan=True)


def make_x(shape, dtype, device, seed=0, spread=4.0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(shape, generator=g) * spread
    # ties and out-of-range values in every tensor
    flat = x.view(-1)
    flat[: min(8, flat.numel())] = torch.tensor([0.5, 1.5, -2.5, 1e4, -1e4, 127.5, -0.0, 0.0])[
        : min(8, flat.numel())
    ]
    return x.to(dtype).to(device)


RANGES = [(-128, 127), (0, 255), (-8, 7)]


@pytest.mark.parametrize("qrange", RANGES, ids=lambda r: f"{r[0]}..{r[1]}")
@pytest.mark.parametrize("shape", [(1, 1), (7,), (3, 33), (64, 1000)], ids=str)
def test_per_tensor_equals_torch_bit_for_bit(device, shape, qrange):
    qmin, qmax = qrange
    x = make_x(shape, torch.float32, device, seed=sum(shape))
    scale = torch.tensor([0.0371], device=device)
    zp_val = (qmin + qmax + 1) // 2
    zp = torch.tensor([zp_val], dtype=torch.int32, device=device)
    y = fake_quantize(x, scale, zp, qmin, qmax)
    want = torch.fake_quantize_per_tensor_affine(x, scale.item(), zp_val, qmin, qmax)
    same_bits(y, want)
    y_op, mask = torch.ops.torchspeed.fake_quantize(x, scale, zp, qmin, qmax)
    want_y, want_mask = torch.ops.aten.fake_quantize_per_tensor_affine_cachemask(
        x, scale.item(), zp_val, qmin, qmax
    )
    same_bits(y_op, want_y)
    assert mask.dtype == torch.bool
    assert torch.equal(mask, want_mask)


@pytest.mark.parametrize("qrange", RANGES, ids=lambda r: f"{r[0]}..{r[1]}")
@pytest.mark.parametrize("shape", [(1, 5), (3, 33), (257, 130)], ids=str)
@pytest.mark.parametrize("symmetric", [True, False], ids=["sym", "zp"])
def test_per_channel_equals_torch_bit_for_bit(device, shape, qrange, symmetric):
    qmin, qmax = qrange
    x = make_x(shape, torch.float32, device, seed=shape[0])
    g = torch.Generator().manual_seed(3)
    scale = (torch.rand(shape[0], generator=g) * 0.1 + 1e-3).to(device)
    if symmetric:
        zp, torch_zp = None, torch.zeros(shape[0], dtype=torch.int32, device=device)
        if qmin > 0:
            pytest.skip("zero_point 0 lies outside [0, 255]")
    else:
        zp = torch.randint(qmin, qmax + 1, (shape[0],), generator=g, dtype=torch.int32).to(device)
        torch_zp = zp
    y, mask = torch.ops.torchspeed.fake_quantize(x, scale, zp, qmin, qmax)
    want = torch.fake_quantize_per_channel_affine(x, scale, torch_zp, 0, qmin, qmax)
    same_bits(y, want)
    _, want_mask = torch.ops.aten.fake_quantize_per_channel_affine_cachemask(
        x, scale, torch_zp, 0, qmin, qmax
    )
    assert torch.equal(mask, want_mask)


@pytest.mark.parametrize("dtype", DTYPES, ids=["fp32", "bf16", "fp16"])
@pytest.mark.parametrize(
    "shape,granularity,group",
    [
        ((2, 3, 64), "per_group", 16),
        ((5, 96), "per_group", 32),
        ((9, 40), "per_channel", 0),
        ((4099,), "per_tensor", 0),
    ],
    ids=str,
)
@pytest.mark.parametrize("symmetric", [True, False], ids=["sym", "zp"])
def test_every_dtype_and_granularity_equals_the_fp32_formula(
    device, dtype, shape, granularity, group, symmetric
):
    x = make_x(shape, dtype, device, seed=len(shape) + shape[-1])
    scale, zp = choose_qparams(x, granularity, group_size=group or 128, symmetric=symmetric)
    zp = None if symmetric else zp
    y, mask = torch.ops.torchspeed.fake_quantize(x, scale, zp, -128, 127)
    want_y, want_mask = reference(x, scale, zp, -128, 127)
    assert y.dtype == dtype and y.device == x.device
    same_bits(y, want_y)
    assert torch.equal(mask, want_mask)
    # Half a step at most from x, in range (plus the output dtype's rounding).
    step = scale.max().item()
    err = (y.float() - x.float()).abs()[mask]
    assert err.max().item() <= step / 2 * (1 + 1e-5) + x.float().abs().max().item() * (
        torch.finfo(dtype).eps
    )


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
def test_half_precision_equals_torch_where_torch_runs_it(device, dtype):
    x = make_x((40, 96), dtype, device, seed=12)
    scale = (torch.rand(40, generator=torch.Generator().manual_seed(2)) * 0.1 + 0.01).to(device)
    zp = torch.arange(-20, 20, dtype=torch.int32, device=device)
    try:
        want = torch.fake_quantize_per_channel_affine(x, scale, zp, 0, -128, 127)
    except RuntimeError as e:  # older torch builds lack half-precision fake-quant
        pytest.skip(f"torch has no {dtype} fake_quantize_per_channel_affine here: {e}")
    same_bits(fake_quantize(x, scale, zp), want)


def test_extremes_equal_torch(device):
    x = torch.tensor(
        [[1e30, -1e30, float("nan"), 3e38, -3e38, 126.5, 127.5, -128.5]], device=device
    )
    scale = torch.ones(1, device=device)
    y, mask = torch.ops.torchspeed.fake_quantize(x, scale, None, -128, 127)
    want_y, want_mask = torch.ops.aten.fake_quantize_per_tensor_affine_cachemask(
        x, 1.0, 0, -128, 127
    )
    same_bits(y, want_y)
    assert torch.equal(mask, want_mask)
    assert y.cpu().tolist()[0][:3] == [127.0, -128.0, -128.0]


def test_ste_gradient_is_exactly_grad_times_mask_and_equals_torch(device):
    x = make_x((33, 70), torch.float32, device, seed=5, spread=8.0).requires_grad_()
    scale = torch.full((33,), 0.05, device=device)
    zp = torch.arange(-16, 17, dtype=torch.int32, device=device)
    y = fake_quantize(x, scale, zp)
    g = torch.randn(y.shape, generator=torch.Generator().manual_seed(1)).to(device)
    (gx,) = torch.autograd.grad(y, x, g)
    _, mask = torch.ops.torchspeed.fake_quantize(x.detach(), scale, zp, -128, 127)
    assert 0 < mask.sum() < mask.numel()  # both branches exercised
    same_bits(gx, g * mask)
    x2 = x.detach().clone().requires_grad_()
    (gt,) = torch.autograd.grad(
        torch.fake_quantize_per_channel_affine(x2, scale, zp, 0, -128, 127), x2, g
    )
    same_bits(gx, gt)


@pytest.mark.parametrize("dtype", DTYPES, ids=["fp32", "bf16", "fp16"])
def test_backward_op_equals_grad_times_mask_including_inf_and_nan(device, dtype):
    gen = torch.Generator().manual_seed(8)
    grad = torch.randn(3, 1000, generator=gen)
    grad.view(-1)[:6] = torch.tensor([float("inf"), -float("inf"), float("nan"), -0.0, 0.0, 5.0])
    mask = torch.rand(3, 1000, generator=gen) > 0.3
    mask.view(-1)[:6] = torch.tensor([False, True, False, False, True, False])
    grad, mask = grad.to(dtype).to(device), mask.to(device)
    out = torch.ops.torchspeed.fake_quantize_backward(grad, mask)
    same_bits(out, grad * mask)  # torch's cachemask backward is `dY * mask`
    with pytest.raises(RuntimeError, match="mask must have grad's shape"):
        torch.ops.torchspeed.fake_quantize_backward(grad, mask[:2])
    with pytest.raises(RuntimeError, match="mask must be a contiguous bool tensor"):
        torch.ops.torchspeed.fake_quantize_backward(grad, mask.float())


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
def test_ste_gradient_in_half_precision(device, dtype):
    x = make_x((16, 48), dtype, device, seed=9, spread=10.0).requires_grad_()
    scale = torch.tensor([0.04], device=device)
    y = fake_quantize(x, scale)
    assert y.dtype == dtype
    g = torch.randn(y.shape).to(dtype).to(device)
    (gx,) = torch.autograd.grad(y, x, g)
    _, mask = reference(x.detach(), scale, None, -128, 127)
    assert gx.dtype == dtype
    same_bits(gx, g * mask)


def test_opcheck_including_autograd():
    x = make_x((6, 64), torch.float32, "cpu", seed=2).requires_grad_()
    scale, zp = choose_qparams(x, "per_group", group_size=16, symmetric=False)
    op = torch.ops.torchspeed.fake_quantize.default
    torch.library.opcheck(op, (x, scale, zp, -128, 127))
    torch.library.opcheck(op, (x.detach().bfloat16(), scale[:, 0].contiguous(), None, -8, 7))
    torch.library.opcheck(op, (x, torch.tensor([0.1]), None, -128, 127))
    torch.library.opcheck(
        torch.ops.torchspeed.fake_quantize_backward.default,
        (torch.randn(6, 64), torch.rand(6, 64) > 0.5),
    )


def test_torch_compile_matches_eager():
    def f(x, s):
        return (fake_quantize(x, s) * 2).sum()

    x = make_x((8, 32), torch.float32, "cpu", seed=4).requires_grad_()
    s = torch.full((8,), 0.03)
    compiled = torch.compile(f, backend="aot_eager", fullgraph=True)
    out = compiled(x, s)
    (g,) = torch.autograd.grad(out, x)
    x2 = x.detach().clone().requires_grad_()
    out2 = f(x2, s)
    (g2,) = torch.autograd.grad(out2, x2)
    same_bits(out.detach(), out2.detach())
    same_bits(g, g2)


@pytest.mark.parametrize(
    "args,match",
    [
        ((torch.ones(1), None, 5, 4), r"quant_min <= quant_max must hold"),
        ((torch.ones(1), None, -(2**23), 0), r"within \[-2\^22, 2\^22\]"),
        (
            (torch.ones(1), torch.full((1,), 300, dtype=torch.int32), -128, 127),
            r"zero_point\[0\] must be in \[quant_min, quant_max\] = \[-128, 127\], got 300",
        ),
        ((torch.zeros(1), None, -128, 127), r"scale\[0\] must be finite and > 0, got 0"),
        ((torch.ones(3), None, -128, 127), "a per-channel scale must have 4 elements"),
        ((torch.ones(1, dtype=torch.float64), None, -128, 127), "scale must be a dense float32"),
    ],
)
def test_bad_input_is_refused_with_the_argument_named(args, match):
    x = torch.randn(4, 64)
    with pytest.raises(RuntimeError, match=f"torchspeed.fake_quantize: .*{match}"):
        torch.ops.torchspeed.fake_quantize(x, *args)
    with pytest.raises(RuntimeError, match="x must be float32, bfloat16 or float16"):
        torch.ops.torchspeed.fake_quantize(x.double(), torch.ones(1), None, -128, 127)
    # Meta validates the same way, without data
    with pytest.raises(RuntimeError, match="quant_min <= quant_max"):
        torch.ops.torchspeed.fake_quantize(x.to("meta"), torch.ones(1, device="meta"), None, 1, 0)


# ---- observers ---------------------------------------------------------------------------------


def _torch_ao():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        import torch.ao.quantization.observer as ao
    return ao


def _batches(n=4, shape=(16, 48)):
    g = torch.Generator().manual_seed(0)
    return [torch.randn(shape, generator=g) * (1 + i) + 0.3 * i for i in range(n)]


@pytest.mark.parametrize("symmetric", [True, False], ids=["sym", "affine"])
@pytest.mark.parametrize("granularity", ["per_tensor", "per_channel"])
@pytest.mark.parametrize("kind", ["minmax", "moving_average"])
def test_observers_equal_torch_ao_exactly(kind, granularity, symmetric):
    ao = _torch_ao()
    qscheme = {
        ("per_tensor", True): torch.per_tensor_symmetric,
        ("per_tensor", False): torch.per_tensor_affine,
        ("per_channel", True): torch.per_channel_symmetric,
        ("per_channel", False): torch.per_channel_affine,
    }[(granularity, symmetric)]
    qmin = -127 if symmetric else -128
    kw = dict(dtype=torch.qint8, qscheme=qscheme, quant_min=qmin, quant_max=127, eps=1e-12)
    if kind == "minmax":
        cls = ao.MinMaxObserver if granularity == "per_tensor" else ao.PerChannelMinMaxObserver
        ours = MinMaxObserver(granularity=granularity, symmetric=symmetric)
    else:
        cls = (
            ao.MovingAverageMinMaxObserver
            if granularity == "per_tensor"
            else ao.MovingAveragePerChannelMinMaxObserver
        )
        kw["averaging_constant"] = 0.1
        ours = MovingAverageMinMaxObserver(
            averaging_constant=0.1, granularity=granularity, symmetric=symmetric
        )
    if granularity == "per_channel":
        kw["ch_axis"] = 0
    theirs = cls(**kw)
    for b in _batches():
        assert ours(b) is b
        theirs(b)
    torch.testing.assert_close(ours.min_val.reshape(-1), theirs.min_val.reshape(-1), rtol=0, atol=0)
    scale, zp = ours.calculate_qparams()
    t_scale, t_zp = theirs.calculate_qparams()
    # exact: the same fp32 operations in the same order
    torch.testing.assert_close(scale.reshape(-1), t_scale.reshape(-1), rtol=0, atol=0)
    assert torch.equal(zp.reshape(-1).long(), t_zp.reshape(-1).long())
    assert scale.dtype == torch.float32 and zp.dtype == torch.int32


def test_observers_per_group_state_dict_and_percentile():
    xs = _batches(3, (6, 64))
    obs = MinMaxObserver(granularity="per_group", group_size=16, symmetric=False)
    for b in xs:
        obs(b)
    # every batch's elements of group j of row r, side by side: one group of 48 per (r, j)
    grouped = torch.stack(xs).reshape(3, 6, 4, 16).permute(1, 2, 0, 3).reshape(6, 4 * 48)
    want = choose_qparams(grouped, "per_group", group_size=48, symmetric=False)
    scale, zp = obs.calculate_qparams()
    assert scale.shape == (6, 4)
    torch.testing.assert_close(scale, want[0], rtol=0, atol=0)
    assert torch.equal(zp, want[1])
    # state_dict round trip into a fresh observer
    fresh = MinMaxObserver(granularity="per_group", group_size=16, symmetric=False)
    fresh.load_state_dict(obs.state_dict())
    torch.testing.assert_close(fresh.calculate_qparams()[0], scale, rtol=0, atol=0)
    # percentile 100 is min-max on one batch; 90 clips both tails by order statistics
    p100 = PercentileObserver(percentile=100.0, granularity="per_channel")
    p100(xs[0])
    torch.testing.assert_close(p100.min_val, xs[0].amin(1), rtol=0, atol=0)
    p90 = PercentileObserver(percentile=90.0)
    x = torch.arange(1, 101, dtype=torch.float32)[torch.randperm(100)]
    p90(x)
    assert p90.max_val.item() == 90.0 and p90.min_val.item() == 11.0
    p90(x + 10)  # mean of the batches' percentiles
    assert p90.max_val.item() == 95.0 and p90.num_batches.item() == 2
    with pytest.raises(ValueError, match="percentile must be in"):
        PercentileObserver(percentile=20)
    with pytest.raises(RuntimeError, match="before any forward"):
        MinMaxObserver().calculate_qparams()


# ---- the FakeQuantize module ------------------------------------------------------------------


def test_fake_quantize_module_flags_and_state_dict():
    fq = FakeQuantize(MinMaxObserver, granularity="per_channel", symmetric=False)
    x = torch.randn(8, 32)
    y = fq(x)
    scale, zp = choose_qparams(x, "per_channel", symmetric=False)
    same_bits(fq.scale, scale)
    same_bits(y, fake_quantize(x, scale, zp))
    fq.disable_fake_quant()
    assert fq(x) is x
    fq.disable_observer().enable_fake_quant()
    fq(x * 100)  # the range stays the calibrated one
    same_bits(fq.scale, scale)
    other = FakeQuantize(MinMaxObserver, granularity="per_channel", symmetric=False)
    other.load_state_dict(fq.state_dict())
    same_bits(other.scale, scale)
    assert int(other.observer_enabled[0]) == 0


class _QATNet(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = torch.nn.Linear(16, 32)
        self.fc2 = torch.nn.Linear(32, 4)
        self.wq = FakeQuantize(MinMaxObserver, granularity="per_channel")
        self.aq = FakeQuantize(MovingAverageMinMaxObserver, symmetric=False)

    def forward(self, x):
        h = torch.relu(torch.nn.functional.linear(x, self.wq(self.fc1.weight), self.fc1.bias))
        return self.fc2(self.aq(h))


@pytest.mark.parametrize("autocast", [False, True], ids=["fp32", "bf16-autocast"])
def test_qat_loop_trains(autocast):
    torch.manual_seed(0)
    net = _QATNet()
    opt = torch.optim.Adam(net.parameters(), lr=1e-2)
    x = torch.randn(256, 16)
    target = (x[:, :4] * 2 - x[:, 4:8]).detach()
    losses = []
    for _ in range(60):
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            out = net(x)
            loss = torch.nn.functional.mse_loss(out.float(), target)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert all(torch.isfinite(torch.tensor(losses)))
    assert losses[-1] < 0.5 * losses[0], losses[::10]


# ---- adversarial input: non-finite batches, dtype casts, foreign observers, bad arguments ------


def _state(module):
    return {k: v.clone() for k, v in module.state_dict().items()}


def _same_state(module, state):
    now = module.state_dict()
    assert now.keys() == state.keys()
    for k, v in state.items():
        assert now[k].dtype == v.dtype, k
        same_bits(now[k], v)


OBSERVERS = [MinMaxObserver, MovingAverageMinMaxObserver, PercentileObserver]


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf")])
@pytest.mark.parametrize("granularity", ["per_tensor", "per_channel", "per_group"])
@pytest.mark.parametrize("cls", OBSERVERS, ids=lambda c: c.__name__)
def test_non_finite_batch_is_refused_and_recorded_nowhere(cls, granularity, bad):
    kw = dict(granularity=granularity, symmetric=False, group_size=16)
    x = torch.randn(8, 32)
    dirty = x.clone()
    dirty[3, 5] = bad
    # observers: refused before recording, on the first batch and later ones
    obs = cls(**kw)
    with pytest.raises(ValueError, match=f"{cls.__name__}: x must be finite"):
        obs(dirty)
    assert obs.min_val.numel() == 0
    obs(x)
    before = _state(obs)
    with pytest.raises(ValueError, match="x must be finite"):
        obs(dirty)
    _same_state(obs, before)
    # FakeQuantize: unchanged after the error, and the next clean batch gives the clean result
    fq = FakeQuantize(cls, **kw)
    clean = FakeQuantize(cls, **kw)
    same_bits(fq(x), clean(x))
    before = _state(fq)
    with pytest.raises(ValueError, match="x must be finite"):
        fq(dirty)
    _same_state(fq, before)
    x2 = torch.randn(8, 32) * 3
    same_bits(fq(x2), clean(x2))
    same_bits(fq.scale, clean.scale)
    # choose_qparams
    with pytest.raises(ValueError, match="choose_qparams: x must be finite"):
        choose_qparams(dirty, granularity, group_size=16)


def test_qparams_from_minmax_refuses_non_finite_and_survives_a_huge_range():
    from torchspeed.quant import qparams_from_minmax

    with pytest.raises(ValueError, match="min_val must be finite"):
        qparams_from_minmax(torch.tensor([float("nan")]), torch.tensor([1.0]))
    with pytest.raises(ValueError, match="max_val must be finite"):
        qparams_from_minmax(torch.tensor([-1.0]), torch.tensor([float("inf")]), False)
    with pytest.raises(ValueError, match="one shape"):
        qparams_from_minmax(torch.zeros(2), torch.zeros(3))
    # max - min overflows float32: the scale stays finite, the range still maps onto [-128, 127]
    big = 3.0e38
    x = torch.tensor([[-big, big]])
    for s_ in (True, False):
        scale, zp = choose_qparams(x, symmetric=s_)
        assert torch.isfinite(scale).all()
        want = torch.tensor([big / 127.0 if s_ else 2 * big / 255.0], dtype=torch.float64)
        torch.testing.assert_close(scale.double(), want, rtol=1e-6, atol=0)
    # an observer whose combined range overflows refuses the batch and keeps its record
    obs = MovingAverageMinMaxObserver(averaging_constant=1.0)
    obs(torch.tensor([big]))
    before = _state(obs)
    with pytest.raises(ValueError, match="overflows float32"):
        obs(torch.tensor([-big]))
    _same_state(obs, before)


@pytest.mark.parametrize("cast", ["half", "bfloat16", "double", "type"])
@pytest.mark.parametrize("cls", OBSERVERS, ids=lambda c: c.__name__)
def test_module_dtype_casts_keep_the_qparams_dtypes(cls, cast):
    x = torch.randn(8, 32) * 2
    ref = FakeQuantize(cls, granularity="per_channel", symmetric=False)
    fq = FakeQuantize(cls, granularity="per_channel", symmetric=False)
    ref(x), fq(x)  # a recorded range before the cast: it must survive bit for bit
    dtype = {
        "half": torch.float16,
        "bfloat16": torch.bfloat16,
        "double": torch.float64,
        "type": torch.float16,
    }[cast]
    if cast == "half":
        fq.half()
    elif cast == "type":
        fq.type(torch.float16)  # casts integer buffers too
    else:
        fq.to(dtype)
    assert fq.scale.dtype == torch.float32 and fq.zero_point.dtype == torch.int32
    assert fq.fake_quant_enabled.dtype == torch.uint8
    obs = fq.activation_post_process
    assert obs.min_val.dtype == torch.float32 and obs.max_val.dtype == torch.float32
    same_bits(fq.scale, ref.scale)
    same_bits(obs.min_val, ref.activation_post_process.min_val)
    xin = x.to(dtype) if dtype != torch.float64 else x
    x2 = (torch.randn(8, 32) * 3).to(xin.dtype)
    same_bits(fq(x2), ref(x2))  # fp32 qparams, the same result
    same_bits(fq.scale, ref.scale)
    obs.reset_min_max_vals()
    assert obs.min_val.dtype == torch.float32


def test_torch_ao_observers_and_bad_constructor_args_are_refused_by_name():
    ao = _torch_ao()
    with pytest.raises(TypeError, match="observer must be a torchspeed.quant observer.*MinMax"):
        FakeQuantize(ao.MinMaxObserver)
    with pytest.raises(TypeError, match="observer must be a torchspeed.quant observer"):
        FakeQuantize(ao.MinMaxObserver())
    with pytest.raises(TypeError, match="observer must be a torchspeed.quant observer"):
        FakeQuantize(ao.MinMaxObserver.with_args(dtype=torch.qint8))
    with pytest.raises(TypeError, match="observer must be"):
        FakeQuantize(torch.nn.Identity)
    with pytest.raises(ValueError, match="observer_kwargs apply to an observer class"):
        FakeQuantize(MinMaxObserver(), symmetric=False)
    bad = [
        (MinMaxObserver, dict(granularity="per_row"), "granularity must be one of"),
        (MinMaxObserver, dict(granularity=None), "granularity must be one of"),
        (MinMaxObserver, dict(group_size=0), "group_size must be a positive int"),
        (MinMaxObserver, dict(group_size=16.0), "group_size must be a positive int"),
        (MinMaxObserver, dict(group_size=True), "group_size must be a positive int"),
        (MinMaxObserver, dict(symmetric="no"), "symmetric must be a bool"),
        (MinMaxObserver, dict(eps=0.0), "eps must be finite and > 0"),
        (MinMaxObserver, dict(eps=True), "eps must be finite and > 0"),
        (MinMaxObserver, dict(qscheme=[1]), "qscheme must be one of"),
        (MinMaxObserver, dict(qscheme=torch.per_channel_affine_float_qparams), "qscheme must"),
        (MinMaxObserver, dict(dtype=torch.quint8), "dtype must be torch.qint8"),
        (MovingAverageMinMaxObserver, dict(averaging_constant=0), "averaging_constant must"),
        (MovingAverageMinMaxObserver, dict(averaging_constant=1.5), "averaging_constant must"),
        (MovingAverageMinMaxObserver, dict(averaging_constant=True), "averaging_constant must"),
        (MovingAverageMinMaxObserver, dict(averaging_constant=float("nan")), "averaging_const"),
        (PercentileObserver, dict(percentile=float("nan")), "percentile must be in"),
        (PercentileObserver, dict(percentile=100.5), "percentile must be in"),
        (PercentileObserver, dict(percentile="99"), "percentile must be in"),
    ]
    # a bad type is a TypeError, a bad value a ValueError (torch's convention; issue 23)
    typed = [
        dict(group_size=16.0),
        dict(group_size=True),
        dict(symmetric="no"),
        dict(eps=True),
        dict(averaging_constant=True),
        dict(percentile="99"),
    ]
    for cls, kw, match in bad:
        err = TypeError if kw in typed else ValueError
        with pytest.raises(err, match=f"{cls.__name__}: {match}"):
            cls(**kw)
        with pytest.raises(err, match=match):
            FakeQuantize(cls, **kw)


def test_fake_quantize_refuses_bad_x_before_observing():
    fq = FakeQuantize(MinMaxObserver, granularity="per_channel")
    fq(torch.randn(4, 16))
    before = _state(fq)
    with pytest.raises(ValueError, match="x must be float32, bfloat16 or float16"):
        fq(torch.randn(4, 16, dtype=torch.float64) * 100)
    with pytest.raises(ValueError, match="x gives ranges of shape"):
        fq(torch.randn(5, 16) * 100)
    with pytest.raises(TypeError, match="x must be a tensor"):
        fq([1.0, 2.0])
    with pytest.raises(ValueError, match="x must be a non-empty tensor"):
        fq(torch.randn(0, 16))
    _same_state(fq, before)


def test_fake_quantize_non_finite_and_half_on_every_device(device):
    """The NaN refusal (one host sync on CUDA) and the .half() cast on the device under test."""
    x = torch.randn(8, 64, device=device)
    fq = FakeQuantize(MovingAverageMinMaxObserver, granularity="per_group", group_size=16)
    fq = fq.to(device).half()
    ref = FakeQuantize(MovingAverageMinMaxObserver, granularity="per_group", group_size=16)
    ref = ref.to(device)
    same_bits(fq(x.half()), ref(x.half()))
    before = _state(fq)
    dirty = x.half()
    dirty[2, 7] = float("nan")
    with pytest.raises(ValueError, match="x must be finite"):
        fq(dirty)
    _same_state(fq, before)
    x2 = (x * 3).half()
    same_bits(fq(x2), ref(x2))
    assert fq.scale.dtype == torch.float32 and fq.scale.device.type == torch.device(device).type
    with pytest.raises(ValueError, match="x must be finite"):
        choose_qparams(dirty)


def test_fake_quantize_refuses_bad_python_types():
    """Adversarial pass (issue 23): a float quant_min went to the op (RuntimeError) and a list x
    raised AttributeError before."""
    x, s = torch.randn(4, 8), torch.ones(1)
    with pytest.raises(TypeError, match="fake_quantize: quant_min must be an int, got -8.0"):
        fake_quantize(x, s, None, -8.0, 7)
    with pytest.raises(TypeError, match="fake_quantize: x must be a tensor, got list"):
        fake_quantize([1.0], s)
    with pytest.raises(ValueError, match="quant_max must fit in int64"):
        fake_quantize(x, s, None, 0, 2**70)
