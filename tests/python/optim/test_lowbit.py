"""Low-bit optimizer state (optim/_lowbit.py, the state_dtype of Adam/AdamW): the int8 step against
a float64 reference of the same quantized algorithm (dequantize -> update -> requantize), codes
bit-identical on every CPU ISA, the quantization error bound, bf16's stochastic rounding, the
GradScaler skip, state_dict interop in every direction, bad input, and a model that learns."""

import pytest
import torch
from lowbit_cuda import (
    CUDA,
    assert_same_bits,
    call_grads,
    needs_cuda,
    needs_real_cuda,
    to_device,
)
from torch.testing import assert_close

import torchspeed
from torchspeed.optim import _lowbit

BLOCK = 256
SHAPES = [(40, 130), (4096,), (300,), (77, 61)]  # 4096 elements and up get int8, others stay fp32


def _params(seed=0, shapes=SHAPES):
    g = torch.Generator().manual_seed(seed)
    return [torch.nn.Parameter(torch.randn(s, generator=g)) for s in shapes]


def _grads(params, seed):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(p.shape, generator=g) * 0.1 for p in params]


def _run(state_dtype, steps=3, seed=0, **kw):
    params = _params(seed)
    opt = torchspeed.optim.AdamW(params, lr=1e-2, state_dtype=state_dtype, **kw)
    for step in range(steps):
        for p, g in zip(params, _grads(params, 100 + step)):
            p.grad = g
        opt.step()
    return params, opt


def _reference_step(p, g, m, v, step, lr=1e-2, betas=(0.9, 0.999), eps=1e-8, wd=1e-2):
    """AdamW in float64 from float64 moments (already dequantized), as torch.optim does it."""
    p = p.double() * (1 - lr * wd)
    m = m + (1 - betas[0]) * (g.double() - m)
    v = v * betas[1] + (1 - betas[1]) * g.double() * g.double()
    bc1, bc2 = 1 - betas[0] ** step, 1 - betas[1] ** step
    p = p - lr / bc1 * m / (v.sqrt() / bc2**0.5 + eps)
    return p, m, v


def test_int8_step_matches_float64_reference_of_the_quantized_algorithm(cpu_isa):
    params, opt = _run("int8", steps=3)
    big = params[0]  # 5200 elements: int8, 21 blocks with a short last one
    state = opt.state[big]
    assert state["exp_avg"].dtype == torch.int8 and state["exp_avg_sq"].dtype == torch.uint8
    assert state["exp_avg_absmax"].shape == (-(-big.numel() // BLOCK),)
    m0, v0 = _lowbit.moments_fp32(state, big, BLOCK)
    p0 = big.detach().clone()
    g = torch.randn(big.shape, generator=torch.Generator().manual_seed(7)) * 0.1
    big.grad = g
    for q in params[1:]:
        q.grad = None
    opt.step()
    p_ref, m_ref, v_ref = _reference_step(p0, g, m0.double(), v0.double(), step=4)
    # The param moves by the float64 update of the dequantized moments (fp32 rounding only).
    assert_close(big.detach().double(), p_ref, rtol=1e-5, atol=1e-7)
    # The stored codes are the quantization of the new moments: at most one code away from the
    # float64 reference's (the fp32 update may round across a code boundary), almost all equal.
    qm, am = _lowbit.quantize_m(m_ref.float().reshape(-1), BLOCK)
    qv, av = _lowbit.quantize_v(v_ref.float().reshape(-1), BLOCK)
    got_m = opt.state[big]["exp_avg"].reshape(-1).int()
    got_v = opt.state[big]["exp_avg_sq"].reshape(-1).int()
    assert (got_m - qm.int()).abs().max() <= 1 and (got_v - qv.int()).abs().max() <= 1
    assert (got_m != qm.int()).float().mean() < 0.01 and (got_v != qv.int()).float().mean() < 0.01
    assert_close(opt.state[big]["exp_avg_absmax"], am, rtol=1e-6, atol=0)
    assert_close(opt.state[big]["exp_avg_sq_absmax"], av, rtol=1e-6, atol=0)
    # Small tensors keep float32 moments (min_lowbit_numel=4096); the 4096-element one is int8.
    assert opt.state[params[2]]["exp_avg"].dtype == torch.float32
    assert opt.state[params[1]]["exp_avg"].dtype == torch.int8


@pytest.mark.parametrize("state_dtype", ["int8", "bf16"])
def test_low_bit_state_is_bit_identical_on_every_isa(cpu_isa, state_dtype, monkeypatch):
    ours, opt = _run(state_dtype, steps=3)
    monkeypatch.setenv("TORCHSPEED_CPU_ISA", "scalar")
    ref, ref_opt = _run(state_dtype, steps=3)
    for a, b in zip(ours, ref):
        assert torch.equal(a, b), cpu_isa
        for key, t in ref_opt.state[b].items():
            assert torch.equal(opt.state[a][key], t), (cpu_isa, key)


def _code_values(signed):
    """float64 value in [0, 1] of each code magnitude (docs/OPTIM.md): k = 0 is 0; else, with
    j = k + offset, (1 + (j % 8) / 8) * 2 ** (j // 8 - 127); the top code is 1.0."""
    top = 127 if signed else 255
    j = torch.arange(top + 1, dtype=torch.float64) + (127 * 8 - top)
    values = (1 + torch.remainder(j, 8) / 8) * torch.pow(
        2.0, torch.div(j, 8, rounding_mode="floor") - 127
    )
    values[0] = 0.0
    return values


def _nearest_codes(x, signed):
    """float64 reference quantizer: the nearest code value to x = |m| / absmax (or v / absmax)."""
    values = _code_values(signed)
    return (x.double().unsqueeze(-1) - values).abs().argmin(-1)


@pytest.mark.parametrize("signed", [True, False])
def test_int8_maps_against_a_float64_reference(cpu_isa, signed):
    g = torch.Generator().manual_seed(3)
    n = 10 * BLOCK + 17
    x = torch.randn(n, generator=g) * torch.logspace(-9 if signed else -18, 0, n)
    x = x if signed else x * x
    codes, absmax = (_lowbit.quantize_m if signed else _lowbit.quantize_v)(x, BLOCK)
    back = (_lowbit.dequantize_m if signed else _lowbit.dequantize_v)(codes, absmax, BLOCK)
    blocks = lambda t: torch.nn.functional.pad(t, (0, (-t.numel()) % BLOCK)).reshape(-1, BLOCK)  # noqa: E731
    ref_absmax = blocks(x.abs()).amax(1)
    assert torch.equal(absmax, ref_absmax)
    # Decode: exactly the reference value times absmax (one float32 rounding).
    values = _code_values(signed)
    k = codes.long().abs()
    ref_back = (values[k].reshape(-1) * torch.repeat_interleave(absmax.double(), BLOCK)[:n]).float()
    ref_back = ref_back * (torch.sign(codes.float()) if signed else 1.0)
    assert torch.equal(back, ref_back)
    # Encode: the nearest code of |x| / absmax (float64), but for rounding of x * (1 / absmax)
    # across a midpoint (within one code) and below the smallest code (0 or 1).
    unit = x.abs().double().reshape(-1) / torch.repeat_interleave(absmax.double(), BLOCK)[:n]
    ref = _nearest_codes(unit, signed)
    above = unit >= values[1]
    assert (k - ref).abs().max() <= 1
    assert (k[above] != ref[above]).float().mean() < 1e-3
    assert bool(((k[~above] == 0) | (k[~above] == 1)).all())
    if signed:
        assert torch.equal(torch.sign(codes.float()), torch.sign(x) * (codes != 0))
    # The round-trip error per element: half a step of 3 mantissa bits (1/16 relative) above the
    # smallest code, the smallest code's value below it.
    err = (back.double() - x.double()).abs() / torch.repeat_interleave(absmax.double(), BLOCK)[:n]
    bound = torch.where(above, unit / 16 * (1 + 1e-6), values[1])
    assert bool((err <= bound + 1e-12).all())
    # The absmax element itself round-trips exactly, block by block.
    assert torch.equal(blocks(back.abs()).amax(1), absmax)


def test_bf16_moments_round_stochastically_and_without_bias():
    # exp_avg = 0, one step with a constant grad: the new fp32 moment 0.1 * g lies strictly
    # between two bf16 values; round-to-nearest would always pick one, stochastic rounding picks
    # the upper one with probability (x - lo) / (hi - lo).
    n = 1 << 16
    p = torch.nn.Parameter(torch.zeros(n))
    opt = torchspeed.optim.Adam([p], lr=0.0, state_dtype="bf16")
    p.grad = torch.full((n,), 1.2345)
    opt.step()
    m = opt.state[p]["exp_avg"]
    assert m.dtype == torch.bfloat16
    # The kernel's fp32 moment: lerp(0, g, 1 - beta1) = float32(1 - 0.9) * g.
    x = torch.tensor(1 - 0.9, dtype=torch.float32) * torch.tensor(1.2345, dtype=torch.float32)
    values = m.float().unique()
    assert values.numel() == 2, values  # only the two neighbours of x
    lo_f, hi_f = values[0].item(), values[1].item()
    assert lo_f < x.item() < hi_f
    frac_up = (m.float() == hi_f).float().mean().item()
    expected = (x.item() - lo_f) / (hi_f - lo_f)
    assert abs(frac_up - expected) < 0.01, (frac_up, expected)
    # Small updates survive on average: the mean moment is the fp32 value, not a rounded one.
    assert abs(m.float().mean().item() - x.item()) < 1e-3 * x.item()


@pytest.mark.parametrize("state_dtype", ["int8", "bf16"])
def test_grad_scaler_inf_skip_leaves_low_bit_state_bitwise_untouched(state_dtype):
    params, opt = _run(state_dtype, steps=2)
    before = {id(p): {k: v.clone() for k, v in opt.state[p].items()} for p in params}
    p_before = [p.detach().clone() for p in params]
    for p, g in zip(params, _grads(params, 9)):
        p.grad = g
    opt.grad_scale = torch.tensor(1.0)
    opt.found_inf = torch.tensor(1.0)
    opt.step()
    for p, old in zip(params, p_before):
        assert torch.equal(p.detach(), old)
        for k, v in before[id(p)].items():
            assert torch.equal(opt.state[p][k], v), k


def test_clip_mask_and_master_weights_run_inside_the_int8_step():
    # The same step with int8 and fp32 state under clipping, a mask and bf16 params (masters):
    # masked elements stay exactly zero, and the result follows the fp32 one closely.
    results = {}
    for state_dtype in ("fp32", "int8"):
        g = torch.Generator().manual_seed(0)
        p = torch.nn.Parameter(torch.randn(8192, generator=g).to(torch.bfloat16))
        opt = torchspeed.optim.AdamW([p], lr=1e-3, max_grad_norm=0.5, state_dtype=state_dtype)
        keep = torch.rand(8192, generator=g) > 0.3
        opt.set_mask(p, keep)
        for _ in range(5):
            p.grad = torch.randn(8192, generator=g).to(torch.bfloat16)
            opt.step()
        assert torch.all(p.detach()[~keep] == 0)
        assert opt.state[p]["master"].dtype == torch.float32
        results[state_dtype] = opt.state[p]["master"].clone()
    assert_close(results["int8"], results["fp32"], rtol=0, atol=2e-3)


def test_state_dict_round_trips_in_all_three_directions():
    params, opt = _run("int8", steps=3)
    sd = opt.state_dict()
    assert sd["state"][0]["exp_avg"].dtype == torch.int8 and "exp_avg_absmax" in sd["state"][0]
    assert sd["param_groups"][0]["state_dtype"] == "int8"

    # (a) its own format: the same bits.
    same = torchspeed.optim.AdamW([p.detach().clone() for p in params], state_dtype="int8")
    same.load_state_dict(sd)
    for a, b in zip(params, same.param_groups[0]["params"]):
        for k, v in opt.state[a].items():
            assert torch.equal(same.state[b][k], v), k

    # The torch-compatible export: float32 moments, loadable by torch.optim.AdamW.
    tsd = opt.torch_state_dict()
    assert (
        "exp_avg_absmax" not in tsd["state"][0]
        and tsd["state"][0]["exp_avg"].dtype == torch.float32
    )
    assert opt.state[params[0]]["exp_avg"].dtype == torch.int8  # the optimizer is unchanged
    plain = [p.detach().clone().requires_grad_() for p in params]
    torch_opt = torch.optim.AdamW(plain, lr=1e-2)
    torch_opt.load_state_dict(tsd)
    m, v = _lowbit.moments_fp32(opt.state[params[0]], params[0], BLOCK)
    assert torch.equal(torch_opt.state[plain[0]]["exp_avg"], m)

    # (b) a plain torch.optim.AdamW state_dict: quantized to the optimizer's own state_dtype.
    requant = torchspeed.optim.AdamW([p.detach().clone() for p in params], state_dtype="int8")
    requant.load_state_dict(torch_opt.state_dict())
    q = requant.param_groups[0]["params"]
    assert requant.param_groups[0]["state_dtype"] == "int8"
    # Dequantize -> quantize is the identity on codes.
    for a, b in zip(params, q):
        for k, v in opt.state[a].items():
            assert torch.equal(requant.state[b][k], v), k

    # (c) an fp32 torchspeed state: quantized; and int8 -> fp32 (changing state_dtype through a
    # load is explicit: the optimizer's own state_dtype is kept).
    _, fp32_opt = _run("fp32", steps=3)
    into_int8 = torchspeed.optim.AdamW([p.detach().clone() for p in params], state_dtype="int8")
    into_int8.load_state_dict(fp32_opt.state_dict())
    p0 = into_int8.param_groups[0]["params"][0]
    assert into_int8.state[p0]["exp_avg"].dtype == torch.int8
    m, _ = _lowbit.moments_fp32(into_int8.state[p0], p0, BLOCK)
    ref = fp32_opt.state[fp32_opt.param_groups[0]["params"][0]]["exp_avg"]
    assert (m - ref).abs().max() <= ref.abs().max() / 32 + 1e-12  # half a step of the top binade
    into_fp32 = torchspeed.optim.AdamW([p.detach().clone() for p in params])
    into_fp32.load_state_dict(sd)
    q0 = into_fp32.param_groups[0]["params"][0]
    assert into_fp32.state[q0]["exp_avg"].dtype == torch.float32
    assert "exp_avg_absmax" not in into_fp32.state[q0]
    assert into_fp32.param_groups[0]["state_dtype"] == "fp32"


def test_state_bytes_per_param():
    big = [torch.nn.Parameter(torch.randn(1 << 16))]
    sizes = {}
    for state_dtype in ("fp32", "bf16", "int8"):
        params = [p.detach().clone().requires_grad_() for p in big]
        opt = torchspeed.optim.AdamW(params, state_dtype=state_dtype)
        params[0].grad = torch.randn(1 << 16)
        opt.step()
        sizes[state_dtype] = (opt.state_bytes() - 4) / params[0].numel()  # minus the step
    assert sizes == {"fp32": 8.0, "bf16": 4.0, "int8": 2 + 8 / BLOCK}


@pytest.mark.parametrize(
    "kw, error, message",
    [
        (dict(state_dtype="int4"), ValueError, "state_dtype must be one of .*, got 'int4'"),
        (dict(state_dtype=8), TypeError, "state_dtype must be a str, got int 8"),
        (dict(state_dtype="int8", amsgrad=True), ValueError, "amsgrad needs state_dtype='fp32'"),
        (dict(state_block=100), ValueError, "state_block must be a power of two .*, got 100"),
        (dict(state_block=8192), ValueError, "state_block must be a power of two .*, got 8192"),
        (dict(min_lowbit_numel=-1), ValueError, "min_lowbit_numel must be an int >= 0, got -1"),
        (dict(min_lowbit_numel=1.5), TypeError, "min_lowbit_numel must be an int"),
        # Past int64 the op's schema used to refuse it: "Expected a value of type 'int' ... found
        # type 'int'".
        (dict(min_lowbit_numel=2**70), ValueError, "min_lowbit_numel must fit in int64, got 1180"),
        (dict(state_block=-(2**64)), ValueError, "state_block must fit in int64, got -1844"),
    ],
)
def test_bad_low_bit_arguments(kw, error, message):
    with pytest.raises(error, match=message):
        torchspeed.optim.AdamW([torch.randn(3)], **kw)


def _corrupt(sd, key, value):
    sd = {"state": {k: dict(v) for k, v in sd["state"].items()}, "param_groups": sd["param_groups"]}
    sd["state"][0][key] = value
    return sd


@pytest.mark.parametrize(
    "key, make, message",
    [
        ("exp_avg_absmax", lambda t: t.clone().fill_(float("nan")), "must hold finite values"),
        ("exp_avg_sq_absmax", lambda t: -t, "must hold finite values >= 0"),
        ("exp_avg_absmax", lambda t: t[:-1].clone(), "must be torch.float32 with 21 elements"),
        ("exp_avg", lambda t: t.reshape(-1)[:-3].clone(), "must have 5200 elements"),
        ("exp_avg_sq", lambda t: t.to(torch.int8), "exp_avg_sq'\\] of an int8 state must be"),
    ],
)
def test_bad_quantized_state_is_refused_and_nothing_is_loaded(key, make, message):
    params, opt = _run("int8", steps=2)
    sd = opt.state_dict()
    bad = _corrupt(sd, key, make(sd["state"][0][key]))
    target = torchspeed.optim.AdamW([p.detach().clone() for p in params], state_dtype="int8")
    with pytest.raises(ValueError, match=message):
        target.load_state_dict(bad)
    assert not target.state  # nothing half-loaded


def test_opcheck_int8_and_bf16_calls():
    from torch.library import opcheck

    for dtype in ("int8", "bf16"):
        p = torch.randn(600)
        g = torch.randn(600)
        if dtype == "int8":
            m, v = torch.zeros(600, dtype=torch.int8), torch.zeros(600, dtype=torch.uint8)
            extra = dict(exp_avg_absmaxes=[torch.zeros(3)], exp_avg_sq_absmaxes=[torch.zeros(3)])
        else:
            m, v = torch.zeros(600, dtype=torch.bfloat16), torch.zeros(600, dtype=torch.bfloat16)
            extra = {}
        absmaxes = (extra["exp_avg_absmaxes"], extra["exp_avg_sq_absmaxes"]) if extra else ([], [])
        opcheck(
            torch.ops.torchspeed.adam_lowbit_step_.default,
            ([p], [g], [m], [v], *absmaxes, [], [torch.zeros(())], [], []),
            dict(
                state_block=256,
                lr=1e-3,
                beta1=0.9,
                beta2=0.999,
                eps=1e-8,
                weight_decay=0.0,
                maximize=False,
                decoupled_weight_decay=True,
            ),
            test_utils=("test_schema", "test_faketensor"),
        )


def test_op_refuses_a_wrong_absmax_size_before_writing():
    p, g = torch.randn(600), torch.randn(600)
    m, v = torch.zeros(600, dtype=torch.int8), torch.zeros(600, dtype=torch.uint8)
    before = p.clone()
    with pytest.raises(RuntimeError, match=r"exp_avg_absmaxes\[0\] must be a contiguous float32"):
        torch.ops.torchspeed.adam_lowbit_step_(
            [p],
            [g],
            [m],
            [v],
            [torch.zeros(2)],
            [torch.zeros(3)],
            [],
            [torch.zeros(())],
            [],
            [],
            state_block=256,
            lr=1e-3,
            beta1=0.9,
            beta2=0.999,
            eps=1e-8,
            weight_decay=0.0,
            maximize=False,
            decoupled_weight_decay=True,
        )
    assert torch.equal(p, before)


@pytest.mark.parametrize("state_dtype", ["int8", "bf16"])
def test_a_small_model_learns_as_well_as_with_fp32_state(state_dtype):
    # A 2-layer MLP regressing a fixed random teacher: 300 steps; the final loss with low-bit
    # state is within 3 % of fp32 AdamW's. Layers large enough to be int8 (>= 4096 elements).
    def train(sd):
        torch.manual_seed(0)
        model = torch.nn.Sequential(
            torch.nn.Linear(64, 128), torch.nn.GELU(), torch.nn.Linear(128, 32)
        )
        teacher = torch.nn.Sequential(torch.nn.Linear(64, 32))
        opt = torchspeed.optim.AdamW(model.parameters(), lr=3e-3, state_dtype=sd)
        g = torch.Generator().manual_seed(1)
        losses = []
        for _ in range(300):
            x = torch.randn(128, 64, generator=g)
            with torch.no_grad():
                y = torch.tanh(teacher(x))
            loss = torch.nn.functional.mse_loss(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses.append(loss.item())
        return sum(losses[-20:]) / 20, losses[0]

    ref, first = train("fp32")
    low, _ = train(state_dtype)
    assert ref < 0.2 * first  # it really learns
    assert abs(low - ref) <= 0.03 * ref, (state_dtype, low, ref)


@pytest.mark.parametrize(
    "call, error, message",
    [
        (
            lambda op: op.lowbit_encode(torch.randn(8, 8).t(), True, 256),
            RuntimeError,
            "values must be a contiguous float32 tensor",
        ),
        (
            lambda op: op.lowbit_encode(torch.randn(64).double(), True, 256),
            RuntimeError,
            "values must be a contiguous float32 tensor",
        ),
        (
            lambda op: op.lowbit_encode(torch.randn(64), True, 100),
            ValueError,
            "state_block must be a power of two in \\[8, 4096\\], got 100",
        ),
        (
            lambda op: op.lowbit_decode(torch.zeros(600, dtype=torch.int16), torch.zeros(3), 256),
            RuntimeError,
            "codes must be a contiguous int8 .* or uint8",
        ),
        (
            lambda op: op.lowbit_decode(torch.zeros(600, dtype=torch.int8), torch.zeros(2), 256),
            RuntimeError,
            r"absmax must be a contiguous float32 tensor of ceil\(600 / 256\) = 3",
        ),
        (
            lambda op: op.lowbit_state_format("int4", 10, 4096, 256),
            ValueError,
            "state_dtype must be one of 'fp32', 'bf16', 'int8', got 'int4'",
        ),
    ],
)
def test_encode_decode_refuse_bad_input(call, error, message):
    with pytest.raises(error, match=message):
        call(torch.ops.torchspeed)


def test_encode_decode_opcheck_and_state_format():
    from torch.library import opcheck

    x = torch.randn(600)
    opcheck(torch.ops.torchspeed.lowbit_encode.default, (x, True, 256))
    opcheck(torch.ops.torchspeed.lowbit_encode.default, (x * x, False, 256))
    codes, absmax = torch.ops.torchspeed.lowbit_encode(x, True, 256)
    opcheck(torch.ops.torchspeed.lowbit_decode.default, (codes, absmax, 256))
    fmt = torch.ops.torchspeed.lowbit_state_format
    assert fmt("int8", 4095, 4096, 256) == "fp32" and fmt("int8", 4096, 4096, 256) == "int8"
    assert fmt("bf16", 1, 4096, 256) == "bf16"


# ---- CUDA: the CPU op's bits -----------------------------------------------------------------------
# adam_lowbit_step_ on CUDA against the CPU op on identical inputs, bit for bit (params, masters,
# EMAs, bf16 moments / int8 codes and absmaxes), one call over several params (a multi-chunk one, a
# non-contiguous one, short last blocks), with device scalars; then graph capture and the sync-free
# check. Skipped without a GPU or a CUDA build; TORCHSPEED_CUDA_TESTS_ON_CPU=1 runs the "CUDA" side
# on the CPU (a dry run of this code, proving nothing about the kernels).


# name: (state_block, bf16 params with masters + mask + EMA, device scalars, op keywords)
CUDA_VARIANTS = {
    "adamw": (256, False, False, dict(weight_decay=1e-2, maximize=False, decoupled=True)),
    "adam_l2_maximize": (8, False, False, dict(weight_decay=0.1, maximize=True, decoupled=False)),
    "masters_mask_ema_scalars": (
        4096,
        True,
        True,
        dict(weight_decay=1e-2, maximize=False, decoupled=True),
    ),
}


def _lowbit_inputs(state_dtype, block, mixed, seed=0):
    """One adam_lowbit_step_ call's tensors on the CPU: params over two 64K chunks, a transposed
    (non-contiguous) one, tiny ones; an inf and a NaN grad in one tensor."""
    g = torch.Generator().manual_seed(seed)
    shapes = [(70001,), (7, 300), (13,), (4096,)]
    params = [torch.randn(s, generator=g) for s in shapes]
    params[1] = params[1].t()  # laid out column-major: state follows the param's layout
    d = dict(params=[], exp_avgs=[], exp_avg_sqs=[], exp_avg_absmaxes=[], exp_avg_sq_absmaxes=[])
    d.update(masters=[], steps=[], masks=[], emas=[])
    for p in params:
        m = torch.randn(p.shape, generator=g) * 1e-2
        v = m * m + torch.rand(p.shape, generator=g) * 1e-5
        if state_dtype == "bf16":
            d["exp_avgs"].append(torch.empty_like(p, dtype=torch.bfloat16).copy_(m))
            d["exp_avg_sqs"].append(torch.empty_like(p, dtype=torch.bfloat16).copy_(v))
        else:
            # Codes in the param's memory order: encode the values laid out as the param is.
            mem_m = m.t().contiguous() if p is params[1] else m.contiguous()
            mem_v = v.t().contiguous() if p is params[1] else v.contiguous()
            mc, ma = torch.ops.torchspeed.lowbit_encode(mem_m.reshape(-1), True, block)
            vc, va = torch.ops.torchspeed.lowbit_encode(mem_v.reshape(-1), False, block)
            mc, vc = mc.reshape(mem_m.shape), vc.reshape(mem_m.shape)
            d["exp_avgs"].append(mc.t() if p is params[1] else mc)
            d["exp_avg_sqs"].append(vc.t() if p is params[1] else vc)
            d["exp_avg_absmaxes"].append(ma)
            d["exp_avg_sq_absmaxes"].append(va)
        d["steps"].append(torch.tensor(2.0))
        if mixed:
            d["masters"].append(p.clone())
            d["params"].append(p.to(torch.bfloat16))
            d["masks"].append(torch.randint(0, 256, ((p.numel() + 7) // 8,), generator=g).byte())
            d["emas"].append(p.clone())
        else:
            d["params"].append(p)
    return d


def _lowbit_step(d, grads, block, kw, scalars=None):
    torch.ops.torchspeed.adam_lowbit_step_(
        d["params"],
        grads,
        d["exp_avgs"],
        d["exp_avg_sqs"],
        d["exp_avg_absmaxes"],
        d["exp_avg_sq_absmaxes"],
        d["masters"],
        d["steps"],
        d["masks"],
        d["emas"],
        state_block=block,
        lr=1e-2,
        beta1=0.9,
        beta2=0.999,
        eps=1e-8,
        weight_decay=kw["weight_decay"],
        maximize=kw["maximize"],
        decoupled_weight_decay=kw["decoupled"],
        ema_decay=0.99 if d["emas"] else 0.0,
        **(scalars or {}),
    )


def _device_scalars(device, step):
    """lr, AMP scale, clip coefficient and found_inf as device tensors; the third step is skipped."""
    return dict(
        lr_tensor=torch.tensor(3e-3 * (step + 1), device=device),
        grad_scale=torch.tensor(1024.0, device=device),
        clip_coef=torch.tensor(0.75, device=device),
        found_inf=torch.tensor(1.0 if step == 2 else 0.0, device=device),
    )


@needs_cuda
@pytest.mark.parametrize("variant", list(CUDA_VARIANTS))
@pytest.mark.parametrize("state_dtype", ["bf16", "int8"])
def test_cuda_low_bit_step_equals_the_cpu_step_bitwise(state_dtype, variant):
    block, mixed, with_scalars, kw = CUDA_VARIANTS[variant]
    cpu = _lowbit_inputs(state_dtype, block, mixed)
    dev = to_device(cpu, CUDA)
    for step in range(4):
        grads = call_grads(cpu, 100 + step)
        if with_scalars:
            grads = [(g.float() * 1024).to(g.dtype) for g in grads]
        _lowbit_step(cpu, grads, block, kw, _device_scalars("cpu", step) if with_scalars else None)
        _lowbit_step(
            dev,
            [g.to(CUDA) for g in grads],
            block,
            kw,
            _device_scalars(CUDA, step) if with_scalars else None,
        )
        assert_same_bits(cpu, dev, f"{state_dtype} {variant} step {step}")
    # The step counts moved on the device too (and the found_inf step left them).
    assert [s.item() for s in dev["steps"]] == [s.item() for s in cpu["steps"]]


@needs_cuda
@needs_real_cuda
@pytest.mark.parametrize("state_dtype", ["bf16", "int8"])
def test_cuda_low_bit_step_captures_in_a_graph_and_never_syncs(state_dtype):
    kw = CUDA_VARIANTS["masters_mask_ema_scalars"][3]
    base = _lowbit_inputs(state_dtype, 256, mixed=True)
    eager, graphed = to_device(base, "cuda"), to_device(base, "cuda")
    # Inputs made before the sync check: a host -> device copy synchronises.
    all_grads = [[g.cuda() for g in call_grads(base, 200 + s)] for s in range(3)]
    all_scalars = [_device_scalars("cuda", s) for s in range(3)]
    static_grads = [g.clone() for g in all_grads[0]]
    static_scalars = _device_scalars("cuda", 0)
    # Warm up on a side stream (as torch.cuda.graphs asks), on a throwaway copy of the state.
    warm = to_device(base, "cuda")
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        _lowbit_step(warm, static_grads, 256, kw, static_scalars)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        _lowbit_step(graphed, static_grads, 256, kw, static_scalars)
    # Capture ran nothing: the graphed state is still the initial one.
    assert_same_bits(to_device(base, "cuda"), graphed, "after capture")
    torch.cuda.set_sync_debug_mode("error")
    try:
        for s in range(3):
            for dst, src in zip(static_grads, all_grads[s]):
                dst.copy_(src)
            for k, t in all_scalars[s].items():
                static_scalars[k].copy_(t)
            graph.replay()
            _lowbit_step(eager, all_grads[s], 256, kw, all_scalars[s])
    finally:
        torch.cuda.set_sync_debug_mode(0)
    torch.cuda.synchronize()
    assert_same_bits(eager, graphed, f"{state_dtype} graph replay")
