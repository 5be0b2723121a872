"""Low-bit state of the one-moment optimizers (optim/_lowbit.py's LowbitMoments under Lion and
SGD with momentum): the int8 and bf16 steps against a float64 reference of the same quantized
algorithm (dequantize -> update -> requantize with the kernels' stochastic rounding, rounded to
float32 where the kernel stores), codes bit-identical on every CPU ISA, the GradScaler skip,
state_dict interop, bad input, opcheck and a model that learns; on CUDA, the ops and the optimizers
against the CPU ones bit for bit, and graph capture."""

import pytest
import torch
from lowbit_cuda import (
    CUDA,
    assert_same_bits,
    bits,
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
LION = dict(lr=1e-2, betas=(0.9, 0.99), weight_decay=0.1)


def _params(seed=0, shapes=SHAPES):
    g = torch.Generator().manual_seed(seed)
    return [torch.nn.Parameter(torch.randn(s, generator=g)) for s in shapes]


def _grads(params, seed):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(p.shape, generator=g) * 0.1 for p in params]


def _run_lion(state_dtype, steps=3, seed=0, **kw):
    params = _params(seed)
    opt = torchspeed.optim.Lion(params, **{**LION, **kw}, state_dtype=state_dtype)
    for step in range(steps):
        for p, g in zip(params, _grads(params, 100 + step)):
            p.grad = g
        opt.step()
    return params, opt


def _f32(x: torch.Tensor) -> torch.Tensor:
    return x.to(torch.float32)


def _lerp_f32(m, g, weight):
    """float32 fma(weight, g - m, m), as the kernel: g - m rounded to float32, then the product
    and the sum in float64 (the product of two float32 is exact there) and one rounding."""
    d = _f32(g) - _f32(m)
    return _f32(torch.tensor(weight, dtype=torch.float32).double() * d.double() + m.double())


def _lion_reference(p, g, m, lr, betas, weight_decay):
    """One Lion step in float64 from the float32 moment m (already dequantized), rounded to
    float32 where the kernel rounds: (new param, new moment before quantization)."""
    decay = _f32(torch.tensor(1.0 - lr * weight_decay, dtype=torch.float64))
    p = _f32(p.double() * decay.double())
    direction = torch.sign(_lerp_f32(m, g, 1.0 - betas[0]))
    p = _f32(p.double() - direction.double() * torch.tensor(lr, dtype=torch.float32).double())
    return p, _lerp_f32(m, g, 1.0 - betas[1])


_U32 = 0xFFFFFFFF


def _mul_u32(h, c):
    """(h * c) mod 2^32 for uint32 values held in int64, without int64 overflow."""
    lo = (h * (c & 0xFFFF)) & _U32
    hi = ((h * (c >> 16)) & 0xFFFF) << 16
    return (lo + hi) & _U32


def _sr_noise(n, step, position):
    """The kernels' stochastic-rounding hash (kernels/cpu/lowbit_state.h sr_noise) of elements
    0..n-1 of the param at `position` in its op call, at step `step` (after the increment)."""
    salt = (step * 0x9E3779B9 + position * 0x7FEB352D) & _U32
    h = _mul_u32(torch.arange(n, dtype=torch.int64), 0x9E3779B1) ^ salt
    h = h ^ (h >> 16)
    h = _mul_u32(h, 0x85EBCA6B)
    h = h ^ (h >> 13)
    h = _mul_u32(h, 0xC2B2AE35)
    return h ^ (h >> 16)


def _quantize_stochastic(m, noise):
    """int8 codes and absmaxes of the float32 moment m (flat, memory order) as the one-moment
    kernels write them: the signed map's code of |m| / absmax's float32 bits plus the low 20
    bits of the hash, truncated (docs/OPTIM.md)."""
    blocks = torch.nn.functional.pad(m.abs(), (0, (-m.numel()) % BLOCK)).reshape(-1, BLOCK)
    absmax = blocks.amax(1)
    inv = torch.where(absmax > 0, torch.ones_like(absmax) / absmax, torch.zeros_like(absmax))
    unit = m.abs() * torch.repeat_interleave(inv, BLOCK)[: m.numel()]  # float32, as the kernel
    bits = unit.view(torch.int32).long()
    k = (((bits + (noise & 0xFFFFF)) >> 20) - (127 * 8 - 127)).clamp(0, 127)
    return (torch.where(m < 0, -k, k)).to(torch.int8), absmax


def _one_step_from_state(opt, params, seed=7):
    """Steps only params[0] with a fresh grad; returns (p before, grad, m before as float32)."""
    big = params[0]
    (m0,) = _lowbit.moments_fp32(opt.state[big], big, BLOCK, (("exp_avg", True),))
    p0 = big.detach().clone()
    g = torch.randn(big.shape, generator=torch.Generator().manual_seed(seed)) * 0.1
    big.grad = g
    for q in params[1:]:
        q.grad = None
    opt.step()
    return p0, g, m0


def test_lion_int8_step_is_the_quantized_algorithm_exactly(cpu_isa):
    params, opt = _run_lion("int8", steps=3)
    big = params[0]  # 5200 elements: int8, 21 blocks with a short last one
    state = opt.state[big]
    assert state["exp_avg"].dtype == torch.int8 and "exp_avg_sq" not in state
    assert state["exp_avg_absmax"].shape == (-(-big.numel() // BLOCK),)
    p0, g, m0 = _one_step_from_state(opt, params)
    p_ref, m_ref = _lion_reference(p0, g, m0, LION["lr"], LION["betas"], LION["weight_decay"])
    assert torch.equal(big.detach(), p_ref)
    # The codes and absmaxes are exactly the stochastic quantization of the reference's new
    # moment with the kernels' hash; rounding to nearest differs (the check can fail).
    codes, absmax = _quantize_stochastic(m_ref.reshape(-1), _sr_noise(big.numel(), 4, 0))
    got = opt.state[big]["exp_avg"].reshape(-1)
    assert torch.equal(got, codes)
    assert torch.equal(opt.state[big]["exp_avg_absmax"], absmax)
    nearest, _ = _lowbit.quantize_m(m_ref.reshape(-1), BLOCK)
    assert 0.05 < (got != nearest).float().mean().item() < 0.6
    assert int((got.int() - nearest.int()).abs().max()) == 1
    assert float(opt.state[big]["step"]) == 4.0
    # Small tensors keep a float32 moment (min_lowbit_numel=4096); the 4096-element one is int8.
    assert opt.state[params[2]]["exp_avg"].dtype == torch.float32
    assert opt.state[params[1]]["exp_avg"].dtype == torch.int8


def test_lion_bf16_step_rounds_the_reference_moment_to_a_neighbour(cpu_isa):
    params, opt = _run_lion("bf16", steps=3)
    big = params[0]
    assert opt.state[big]["exp_avg"].dtype == torch.bfloat16
    assert opt.state[params[2]]["exp_avg"].dtype == torch.bfloat16  # bf16 for every size
    p0, g, m0 = _one_step_from_state(opt, params)
    p_ref, m_ref = _lion_reference(p0, g, m0, LION["lr"], LION["betas"], LION["weight_decay"])
    assert torch.equal(big.detach(), p_ref)
    # Stochastic rounding: the stored value is one of the two bf16 neighbours of the float32
    # moment (truncation, or truncation plus one ulp), and both occur.
    got = opt.state[big]["exp_avg"].view(torch.int16).int() & 0xFFFF
    down = (m_ref.view(torch.int32) >> 16) & 0xFFFF
    exact = (m_ref.view(torch.int32) & 0xFFFF) == 0
    assert bool(((got == down) | ((got == down + 1) & ~exact)).all())
    assert 0.2 < (got == down + 1).float().mean().item() < 0.8


@pytest.mark.parametrize("state_dtype", ["int8", "bf16"])
def test_lion_low_bit_state_is_bit_identical_on_every_isa(cpu_isa, state_dtype, monkeypatch):
    ours, opt = _run_lion(state_dtype, steps=3)
    monkeypatch.setenv("TORCHSPEED_CPU_ISA", "scalar")
    ref, ref_opt = _run_lion(state_dtype, steps=3)
    for a, b in zip(ours, ref):
        assert torch.equal(a, b), cpu_isa
        for key, t in ref_opt.state[b].items():
            assert torch.equal(opt.state[a][key], t), (cpu_isa, key)


@pytest.mark.parametrize("state_dtype", ["int8", "bf16"])
def test_lion_grad_scaler_skip_leaves_low_bit_state_bitwise_untouched(state_dtype):
    params, opt = _run_lion(state_dtype, steps=2)
    before = {id(p): {k: v.clone() for k, v in opt.state[p].items()} for p in params}
    p_before = [p.detach().clone() for p in params]
    for p, g in zip(params, _grads(params, 9)):
        p.grad = g
    params[0].grad[3, 5] = float("nan")
    opt.grad_scale = torch.tensor(1.0)
    opt.found_inf = torch.tensor(1.0)
    opt.step()
    for p, old in zip(params, p_before):
        assert torch.equal(p.detach(), old)
        for k, v in before[id(p)].items():
            assert torch.equal(opt.state[p][k], v), k
    # The same step with found_inf = 0 does change the state (the check above can fail).
    opt.found_inf = torch.tensor(0.0)
    params[0].grad[3, 5] = 0.0
    opt.step()
    assert not torch.equal(opt.state[params[0]]["exp_avg"], before[id(params[0])]["exp_avg"])


def test_lion_state_dict_round_trips():
    params, opt = _run_lion("int8", steps=3)
    sd = opt.state_dict()
    assert sd["state"][0]["exp_avg"].dtype == torch.int8 and "exp_avg_absmax" in sd["state"][0]
    assert sd["param_groups"][0]["state_dtype"] == "int8"

    # Its own format: the same bits.
    same = torchspeed.optim.Lion([p.detach().clone() for p in params], state_dtype="int8")
    same.load_state_dict(sd)
    for a, b in zip(params, same.param_groups[0]["params"]):
        for k, v in opt.state[a].items():
            assert torch.equal(same.state[b][k], v), k

    # The plain export: a float32 exp_avg (the dequantized codes), no low-bit keys; the
    # optimizer itself is unchanged.
    plain = opt.torch_state_dict()
    assert set(plain["state"][0]) == {"step", "exp_avg"}
    assert plain["state"][0]["exp_avg"].dtype == torch.float32
    assert "state_dtype" not in plain["param_groups"][0]
    assert opt.state[params[0]]["exp_avg"].dtype == torch.int8
    (m,) = _lowbit.moments_fp32(opt.state[params[0]], params[0], BLOCK, (("exp_avg", True),))
    assert torch.equal(plain["state"][0]["exp_avg"], m)

    # A plain fp32 state loads into an fp32 Lion as is, and into an int8 one requantized to the
    # same codes (dequantize -> quantize is the identity on codes).
    fp32 = torchspeed.optim.Lion([p.detach().clone() for p in params])
    fp32.load_state_dict(plain)
    q0 = fp32.param_groups[0]["params"][0]
    assert torch.equal(fp32.state[q0]["exp_avg"], m) and fp32.state[q0].keys() == {
        "step",
        "exp_avg",
    }
    requant = torchspeed.optim.Lion([p.detach().clone() for p in params], state_dtype="int8")
    requant.load_state_dict(fp32.state_dict())
    for a, b in zip(params, requant.param_groups[0]["params"]):
        for k, v in opt.state[a].items():
            assert torch.equal(requant.state[b][k], v), k

    # int8 into bf16: the dequantized moment rounded to nearest bf16.
    into_bf16 = torchspeed.optim.Lion([p.detach().clone() for p in params], state_dtype="bf16")
    into_bf16.load_state_dict(sd)
    b0 = into_bf16.param_groups[0]["params"][0]
    assert torch.equal(into_bf16.state[b0]["exp_avg"], m.to(torch.bfloat16))
    assert "exp_avg_absmax" not in into_bf16.state[b0]

    # And they keep stepping alike: the reloaded int8 optimizer continues bit for bit.
    for p, g in zip(params, _grads(params, 50)):
        p.grad = g
    for p, g in zip(same.param_groups[0]["params"], _grads(params, 50)):
        p.grad = g
    opt.step()
    same.step()
    assert torch.equal(same.param_groups[0]["params"][0], params[0])


def test_lion_state_bytes_per_param():
    sizes = {}
    for state_dtype in ("fp32", "bf16", "int8"):
        p = torch.nn.Parameter(torch.randn(1 << 16))
        opt = torchspeed.optim.Lion([p], state_dtype=state_dtype)
        p.grad = torch.randn(1 << 16)
        opt.step()
        sizes[state_dtype] = (opt.state_bytes() - 4) / p.numel()  # minus the step
    assert sizes == {"fp32": 4.0, "bf16": 2.0, "int8": 1 + 4 / BLOCK}


@pytest.mark.parametrize(
    "kw, error, message",
    [
        (dict(state_dtype="int4"), ValueError, "Lion: state_dtype must be one of .*, got 'int4'"),
        (dict(state_dtype=8), TypeError, "Lion: state_dtype must be a str, got int 8"),
        (dict(state_block=100), ValueError, "state_block must be a power of two .*, got 100"),
        (dict(min_lowbit_numel=-1), ValueError, "min_lowbit_numel must be an int >= 0, got -1"),
        (dict(min_lowbit_numel=1.5), TypeError, "min_lowbit_numel must be an int"),
    ],
)
def test_lion_bad_low_bit_arguments(kw, error, message):
    with pytest.raises(error, match=message):
        torchspeed.optim.Lion([torch.randn(3)], **kw)


def test_lion_bad_low_bit_group_is_refused_at_add_param_group():
    opt = torchspeed.optim.Lion([torch.nn.Parameter(torch.randn(3))], state_dtype="int8")
    with pytest.raises(ValueError, match=r"param_groups\[1\]\.state_dtype must be one of"):
        opt.add_param_group({"params": [torch.nn.Parameter(torch.randn(3))], "state_dtype": "x"})


@pytest.mark.parametrize(
    "key, make, message",
    [
        ("exp_avg_absmax", lambda t: t.clone().fill_(float("nan")), "must hold finite values"),
        ("exp_avg_absmax", lambda t: t[:-1].clone(), "must be torch.float32 with 21 elements"),
        ("exp_avg", lambda t: t.reshape(-1)[:-3].clone(), "must have 5200 elements"),
        ("exp_avg", lambda t: t.to(torch.uint8), "exp_avg'\\] of an int8 state must be"),
    ],
)
def test_lion_bad_quantized_state_is_refused_and_nothing_is_loaded(key, make, message):
    params, opt = _run_lion("int8", steps=2)
    sd = opt.state_dict()
    sd = {"state": {k: dict(v) for k, v in sd["state"].items()}, "param_groups": sd["param_groups"]}
    sd["state"][0][key] = make(sd["state"][0][key])
    target = torchspeed.optim.Lion([p.detach().clone() for p in params], state_dtype="int8")
    with pytest.raises(ValueError, match=message):
        target.load_state_dict(sd)
    assert not target.state  # nothing half-loaded


def _lion_op_args(dtype, n=600):
    p, g = torch.randn(n), torch.randn(n)
    blocks = -(-n // BLOCK)
    if dtype == "int8":
        m, absmaxes = torch.zeros(n, dtype=torch.int8), [torch.zeros(blocks)]
    else:
        m, absmaxes = torch.zeros(n, dtype=torch.bfloat16), []
    args = ([p], [g], [m], absmaxes, [], [torch.zeros(())], [], [])
    kwargs = dict(state_block=BLOCK, lr=1e-3, beta1=0.9, beta2=0.99, weight_decay=0.0)
    return args, dict(kwargs, maximize=False)


@pytest.mark.parametrize("dtype", ["int8", "bf16"])
def test_lion_lowbit_op_opcheck(dtype):
    from torch.library import opcheck

    args, kwargs = _lion_op_args(dtype)
    opcheck(
        torch.ops.torchspeed.lion_lowbit_step_.default,
        args,
        kwargs,
        test_utils=("test_schema", "test_faketensor"),
    )


@pytest.mark.parametrize(
    "change, message",
    [
        (
            lambda a: a[3].__setitem__(0, torch.zeros(2)),
            r"exp_avg_absmaxes\[0\] must be a contiguous float32 tensor of ceil\(600 / 256\) = 3",
        ),
        (
            lambda a: a[2].__setitem__(0, torch.zeros(600)),
            r"exp_avgs\[0\] must be bfloat16 or int8 \(float32 moments go to lion_step_\)",
        ),
        (
            lambda a: a[2].__setitem__(0, torch.zeros(599, dtype=torch.int8)),
            r"exp_avgs\[0\] must have the 600 elements",
        ),
        (lambda a: a[5].clear(), "steps must have one tensor per param"),
    ],
)
def test_lion_lowbit_op_refuses_bad_input_before_writing(change, message):
    args, kwargs = _lion_op_args("int8")
    change(args)
    before = args[0][0].clone()
    with pytest.raises(RuntimeError, match=message):
        torch.ops.torchspeed.lion_lowbit_step_(*args, **kwargs)
    assert torch.equal(args[0][0], before)


def test_lion_lowbit_op_refuses_absmaxes_with_bf16_moments():
    args, kwargs = _lion_op_args("bf16")
    args[3].append(torch.zeros(3))
    with pytest.raises(RuntimeError, match="exp_avg_absmaxes must be empty with bfloat16 moments"):
        torch.ops.torchspeed.lion_lowbit_step_(*args, **kwargs)


def _train(make_opt, steps=300):
    """A 2-layer MLP regressing a fixed random teacher (layers >= 4096 elements get int8):
    (mean of the last 20 losses, first loss)."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.GELU(), torch.nn.Linear(128, 32))
    teacher = torch.nn.Sequential(torch.nn.Linear(64, 32))
    opt = make_opt(model.parameters())
    g = torch.Generator().manual_seed(1)
    losses = []
    for _ in range(steps):
        x = torch.randn(128, 64, generator=g)
        with torch.no_grad():
            y = torch.tanh(teacher(x))
        loss = torch.nn.functional.mse_loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return sum(losses[-20:]) / 20, losses[0]


@pytest.mark.parametrize("state_dtype", ["int8", "bf16"])
def test_lion_small_model_learns_as_well_as_with_fp32_state(state_dtype):
    def make(sd):
        return lambda params: torchspeed.optim.Lion(params, lr=3e-4, state_dtype=sd)

    ref, first = _train(make("fp32"))
    low, _ = _train(make(state_dtype))
    assert ref < 0.2 * first  # it really learns
    assert abs(low - ref) <= 0.03 * ref, (state_dtype, low, ref)


# ---- SGD with a low-bit momentum buffer ------------------------------------------------------

SGD_KW = dict(lr=1e-2, momentum=0.9, dampening=0.1, weight_decay=0.01)
SGD_NESTEROV = dict(lr=1e-2, momentum=0.9, dampening=0.0, weight_decay=0.01, nesterov=True)
BUFFER = (("momentum_buffer", True),)


def _run_sgd(state_dtype, steps=3, seed=0, **kw):
    params = _params(seed)
    opt = torchspeed.optim.SGD(params, **{**SGD_KW, **kw}, state_dtype=state_dtype)
    for step in range(steps):
        for p, g in zip(params, _grads(params, 100 + step)):
            p.grad = g
        opt.step()
    return params, opt


def _fma_f32(a, b, c):
    """float32 fma(a, b, c) of float32 tensors (or a float32 scalar a): the exact product in
    float64, one rounding of the sum (as the kernel's fma, up to float64 double rounding)."""
    a = torch.as_tensor(a, dtype=torch.float32)
    return _f32(a.double() * b.double() + c.double())


def _sgd_reference(p, g, buf, lr, momentum, dampening, weight_decay, nesterov=False, first=False):
    """One SGD step from the float32 buffer (already dequantized), rounded to float32 where the
    kernel rounds: (new param, new buffer before quantization)."""
    f = lambda x: torch.tensor(x, dtype=torch.float64).float()  # noqa: E731  (float32 scalars)
    g = _fma_f32(p, f(weight_decay).expand_as(p), g)
    if first:
        buf = g
    else:
        buf = _fma_f32(g, f(1.0 - dampening).expand_as(g), _f32(buf * f(momentum)))
    step = _fma_f32(buf, f(momentum).expand_as(buf), g) if nesterov else buf
    return _fma_f32(step, f(-lr).expand_as(step), p), buf


@pytest.mark.parametrize("kw", [SGD_KW, SGD_NESTEROV], ids=["dampening", "nesterov"])
def test_sgd_int8_step_is_the_quantized_algorithm_exactly(cpu_isa, kw):
    params, opt = _run_sgd("int8", steps=3, **kw)
    big = params[0]
    state = opt.state[big]
    assert state["momentum_buffer"].dtype == torch.int8
    assert state["momentum_buffer_absmax"].shape == (-(-big.numel() // BLOCK),)
    (buf0,) = _lowbit.moments_fp32(state, big, BLOCK, BUFFER)
    p0 = big.detach().clone()
    g = torch.randn(big.shape, generator=torch.Generator().manual_seed(7)) * 0.1
    big.grad = g
    for q in params[1:]:
        q.grad = None
    opt.step()
    p_ref, buf_ref = _sgd_reference(p0, g, buf0, **kw)
    assert torch.equal(big.detach(), p_ref)
    codes, absmax = _quantize_stochastic(buf_ref.reshape(-1), _sr_noise(big.numel(), 4, 0))
    assert torch.equal(opt.state[big]["momentum_buffer"].reshape(-1), codes)
    assert torch.equal(opt.state[big]["momentum_buffer_absmax"], absmax)
    assert float(opt.state[big]["step"]) == 4.0
    assert opt.state[params[2]]["momentum_buffer"].dtype == torch.float32  # under 4096 elements
    assert "step" not in opt.state[params[2]]


def test_sgd_low_bit_first_step_starts_the_buffer_from_the_grad(cpu_isa):
    # torch.optim.SGD's first step: buffer = grad (no dampening), param -= lr * buffer.
    p = torch.nn.Parameter(torch.randn(8192))
    ref = p.detach().clone().requires_grad_()
    opt = torchspeed.optim.SGD([p], lr=0.1, momentum=0.9, dampening=0.5, state_dtype="int8")
    torch_opt = torch.optim.SGD([ref], lr=0.1, momentum=0.9, dampening=0.5)
    g = torch.randn(8192)
    p.grad, ref.grad = g.clone(), g.clone()
    opt.step()
    torch_opt.step()
    codes, absmax = _quantize_stochastic(g, _sr_noise(g.numel(), 1, 0))
    assert torch.equal(opt.state[p]["momentum_buffer"], codes)
    assert torch.equal(opt.state[p]["momentum_buffer_absmax"], absmax)
    assert_close(p.detach(), ref.detach(), rtol=1e-6, atol=0)


def test_sgd_bf16_step_rounds_the_reference_buffer_to_a_neighbour(cpu_isa):
    params, opt = _run_sgd("bf16", steps=3)
    big = params[0]
    (buf0,) = _lowbit.moments_fp32(opt.state[big], big, BLOCK, BUFFER)
    p0 = big.detach().clone()
    g = torch.randn(big.shape, generator=torch.Generator().manual_seed(7)) * 0.1
    big.grad = g
    for q in params[1:]:
        q.grad = None
    opt.step()
    p_ref, buf_ref = _sgd_reference(p0, g, buf0, **SGD_KW)
    assert torch.equal(big.detach(), p_ref)
    got = opt.state[big]["momentum_buffer"].view(torch.int16).int() & 0xFFFF
    down = (buf_ref.view(torch.int32) >> 16) & 0xFFFF
    exact = (buf_ref.view(torch.int32) & 0xFFFF) == 0
    assert bool(((got == down) | ((got == down + 1) & ~exact)).all())
    assert 0.2 < (got == down + 1).float().mean().item() < 0.8


@pytest.mark.parametrize("state_dtype", ["int8", "bf16"])
def test_sgd_low_bit_state_is_bit_identical_on_every_isa(cpu_isa, state_dtype, monkeypatch):
    ours, opt = _run_sgd(state_dtype, steps=3, **SGD_NESTEROV)
    monkeypatch.setenv("TORCHSPEED_CPU_ISA", "scalar")
    ref, ref_opt = _run_sgd(state_dtype, steps=3, **SGD_NESTEROV)
    for a, b in zip(ours, ref):
        assert torch.equal(a, b), cpu_isa
        for key, t in ref_opt.state[b].items():
            assert torch.equal(opt.state[a][key], t), (cpu_isa, key)


@pytest.mark.parametrize("state_dtype", ["int8", "bf16"])
def test_sgd_grad_scaler_skip_leaves_low_bit_state_bitwise_untouched(state_dtype):
    params, opt = _run_sgd(state_dtype, steps=2)
    before = {id(p): {k: v.clone() for k, v in opt.state[p].items()} for p in params}
    p_before = [p.detach().clone() for p in params]
    for p, g in zip(params, _grads(params, 9)):
        p.grad = g
    opt.grad_scale, opt.found_inf = torch.tensor(1.0), torch.tensor(1.0)
    opt.step()
    for p, old in zip(params, p_before):
        assert torch.equal(p.detach(), old)
        for k, v in before[id(p)].items():
            assert torch.equal(opt.state[p][k], v), k
    opt.found_inf = torch.tensor(0.0)
    opt.step()
    key = "momentum_buffer"
    assert not torch.equal(opt.state[params[0]][key], before[id(params[0])][key])


def test_sgd_skipped_first_low_bit_step_leaves_the_buffer_fresh():
    p = torch.nn.Parameter(torch.randn(8192))
    opt = torchspeed.optim.SGD([p], lr=0.1, momentum=0.9, state_dtype="int8")
    p.grad = torch.randn(8192)
    opt.grad_scale, opt.found_inf = torch.tensor(1.0), torch.tensor(1.0)
    opt.step()
    assert opt.state[p].get("momentum_buffer") is None
    g = torch.randn(8192)
    p.grad = g
    opt.found_inf = torch.tensor(0.0)
    opt.step()  # the first applied step starts the buffer from its grad
    codes, _ = _quantize_stochastic(g, _sr_noise(g.numel(), 1, 0))
    assert torch.equal(opt.state[p]["momentum_buffer"], codes)
    assert float(opt.state[p]["step"]) == 1.0


def test_sgd_state_dict_round_trips_and_torch_interop():
    params, opt = _run_sgd("int8", steps=3)
    sd = opt.state_dict()
    assert sd["state"][0]["momentum_buffer"].dtype == torch.int8
    same = torchspeed.optim.SGD([p.detach().clone() for p in params], **SGD_KW, state_dtype="int8")
    same.load_state_dict(sd)
    for a, b in zip(params, same.param_groups[0]["params"]):
        for k, v in opt.state[a].items():
            assert torch.equal(same.state[b][k], v), k
    # torch.optim.SGD's state: a float32 momentum_buffer only, loadable by torch.
    tsd = opt.torch_state_dict()
    assert set(tsd["state"][0]) == {"momentum_buffer"}
    (buf,) = _lowbit.moments_fp32(opt.state[params[0]], params[0], BLOCK, BUFFER)
    assert torch.equal(tsd["state"][0]["momentum_buffer"], buf)
    plain = [p.detach().clone().requires_grad_() for p in params]
    torch_opt = torch.optim.SGD(plain, **SGD_KW)
    torch_opt.load_state_dict(tsd)
    assert torch.equal(torch_opt.state[plain[0]]["momentum_buffer"], buf)
    # torch's state into int8 SGD: the same codes again, and a step count to continue from.
    back = torchspeed.optim.SGD([p.detach().clone() for p in params], **SGD_KW, state_dtype="int8")
    back.load_state_dict(torch_opt.state_dict())
    q0 = back.param_groups[0]["params"][0]
    assert torch.equal(back.state[q0]["momentum_buffer"], opt.state[params[0]]["momentum_buffer"])
    # int8 into fp32 SGD: a float32 buffer and no step (torch.optim.SGD's state).
    into_fp32 = torchspeed.optim.SGD([p.detach().clone() for p in params], **SGD_KW)
    into_fp32.load_state_dict(sd)
    f0 = into_fp32.param_groups[0]["params"][0]
    assert set(into_fp32.state[f0]) == {"momentum_buffer"}
    assert torch.equal(into_fp32.state[f0]["momentum_buffer"], buf)


def test_sgd_state_bytes_per_param_and_no_state_without_momentum():
    sizes = {}
    for state_dtype in ("fp32", "bf16", "int8"):
        p = torch.nn.Parameter(torch.randn(1 << 16))
        opt = torchspeed.optim.SGD([p], momentum=0.9, state_dtype=state_dtype)
        p.grad = torch.randn(1 << 16)
        opt.step()
        sizes[state_dtype] = opt.state_bytes() / p.numel()
    n = 1 << 16
    assert sizes == pytest.approx({"fp32": 4.0, "bf16": 2 + 4 / n, "int8": 1 + 4 / BLOCK + 4 / n})
    # Without momentum SGD keeps no state, whatever the state_dtype; the step is plain SGD.
    p = torch.nn.Parameter(torch.randn(8192))
    q = p.detach().clone().requires_grad_()
    opt = torchspeed.optim.SGD([p], lr=0.1, state_dtype="int8")
    ref = torchspeed.optim.SGD([q], lr=0.1)
    p.grad = q.grad = torch.randn(8192)
    opt.step()
    ref.step()
    assert opt.state_bytes() == 0 and torch.equal(p, q)


@pytest.mark.parametrize(
    "kw, error, message",
    [
        (dict(state_dtype="int4"), ValueError, "SGD: state_dtype must be one of .*, got 'int4'"),
        (dict(state_dtype=None), TypeError, "SGD: state_dtype must be a str, got NoneType"),
        (dict(state_block=4), ValueError, "state_block must be a power of two .*, got 4"),
    ],
)
def test_sgd_bad_low_bit_arguments(kw, error, message):
    with pytest.raises(error, match=message):
        torchspeed.optim.SGD([torch.randn(3)], momentum=0.9, **kw)


def _sgd_op_args(dtype, n=600, **kw):
    p, g = torch.randn(n), torch.randn(n)
    if dtype == "int8":
        buf, absmaxes = torch.zeros(n, dtype=torch.int8), [torch.zeros(-(-n // BLOCK))]
    else:
        buf, absmaxes = torch.zeros(n, dtype=torch.bfloat16), []
    args = ([p], [g], [buf], absmaxes, [], [torch.zeros(())], [], [])
    kwargs = dict(state_block=BLOCK, lr=1e-3, momentum=0.9, dampening=0.0, weight_decay=0.0)
    return args, dict(kwargs, nesterov=False, maximize=False, first_step=False, **kw)


@pytest.mark.parametrize("dtype", ["int8", "bf16"])
def test_sgd_lowbit_op_opcheck(dtype):
    from torch.library import opcheck

    args, kwargs = _sgd_op_args(dtype)
    opcheck(
        torch.ops.torchspeed.sgd_lowbit_step_.default,
        args,
        kwargs,
        test_utils=("test_schema", "test_faketensor"),
    )


@pytest.mark.parametrize(
    "kw, message",
    [
        (dict(momentum=0.0), "momentum must be nonzero .*use sgd_step_"),
        (dict(nesterov=True, dampening=0.5), "nesterov requires momentum > 0 and dampening == 0"),
    ],
)
def test_sgd_lowbit_op_refuses_bad_input_before_writing(kw, message):
    args, kwargs = _sgd_op_args("int8")
    kwargs.update(kw)
    before = args[0][0].clone()
    with pytest.raises(RuntimeError, match=message):
        torch.ops.torchspeed.sgd_lowbit_step_(*args, **kwargs)
    assert torch.equal(args[0][0], before)


def test_sgd_lowbit_op_refuses_float32_buffers():
    args, kwargs = _sgd_op_args("int8")
    args[2][0] = torch.zeros(600)
    with pytest.raises(RuntimeError, match=r"momentum_buffers\[0\] must be bfloat16 or int8"):
        torch.ops.torchspeed.sgd_lowbit_step_(*args, **kwargs)


@pytest.mark.parametrize("state_dtype", ["int8", "bf16"])
def test_sgd_small_model_learns_as_well_as_with_fp32_state(state_dtype):
    def make(sd):
        return lambda params: torchspeed.optim.SGD(
            params, lr=0.05, momentum=0.9, nesterov=True, state_dtype=sd
        )

    ref, first = _train(make("fp32"))
    low, _ = _train(make(state_dtype))
    assert ref < 0.2 * first  # it really learns
    assert abs(low - ref) <= 0.03 * ref, (state_dtype, low, ref)


# ---- CUDA: the CPU op's bits -----------------------------------------------------------------------
# lion_lowbit_step_ / sgd_lowbit_step_ on CUDA against the CPU op on identical inputs, bit for bit
# (params, masters, EMAs, bf16 moments / int8 codes, stochastic roundings included, and absmaxes),
# one call over several params (a multi-chunk one, a non-contiguous one, short last blocks), with
# device scalars and a found_inf-skipped step; the optimizers over several steps; graph capture
# and the sync-free check. Skipped without a GPU or a CUDA build; TORCHSPEED_CUDA_TESTS_ON_CPU=1
# runs the "CUDA" side on the CPU (a dry run of this code, proving nothing about the kernels).


# name: (state_block, bf16 params with masters + mask + EMA, device scalars, op keywords)
CUDA_VARIANTS = {
    "plain": (256, False, False, dict(weight_decay=1e-2, maximize=False, dampening=0.0)),
    "block8_maximize_dampening": (
        8,
        False,
        False,
        dict(weight_decay=0.1, maximize=True, dampening=0.1),
    ),
    "masters_mask_ema_scalars": (
        4096,
        True,
        True,
        dict(weight_decay=1e-2, maximize=False, dampening=0.0),
    ),
}


def _moment_inputs(state_dtype, block, mixed, seed=0):
    """One lion_lowbit_step_ / sgd_lowbit_step_ call's tensors on the CPU: params over two 64K
    chunks, a transposed (non-contiguous) one, tiny ones."""
    g = torch.Generator().manual_seed(seed)
    shapes = [(70001,), (7, 300), (13,), (4096,)]
    params = [torch.randn(s, generator=g) for s in shapes]
    params[1] = params[1].t()  # laid out column-major: state follows the param's layout
    d = dict(params=[], exp_avgs=[], exp_avg_absmaxes=[], masters=[], steps=[], masks=[], emas=[])
    for p in params:
        m = torch.randn(p.shape, generator=g) * 1e-2
        if state_dtype == "bf16":
            d["exp_avgs"].append(torch.empty_like(p, dtype=torch.bfloat16).copy_(m))
        else:
            # Codes in the param's memory order: encode the values laid out as the param is.
            mem = m.t().contiguous() if p is params[1] else m.contiguous()
            codes, absmax = torch.ops.torchspeed.lowbit_encode(mem.reshape(-1), True, block)
            codes = codes.reshape(mem.shape)
            d["exp_avgs"].append(codes.t() if p is params[1] else codes)
            d["exp_avg_absmaxes"].append(absmax)
        d["steps"].append(torch.tensor(2.0))
        if mixed:
            d["masters"].append(p.clone())
            d["params"].append(p.to(torch.bfloat16))
            d["masks"].append(torch.randint(0, 256, ((p.numel() + 7) // 8,), generator=g).byte())
            d["emas"].append(p.clone())
        else:
            d["params"].append(p)
    return d


def _moment_step(algo, d, grads, block, kw, scalars=None, first_step=False):
    common = dict(
        state_block=block,
        lr=1e-2,
        weight_decay=kw["weight_decay"],
        maximize=kw["maximize"],
        ema_decay=0.99 if d["emas"] else 0.0,
        **(scalars or {}),
    )
    lists = (d["masters"], d["steps"], d["masks"], d["emas"])
    if algo == "lion":
        torch.ops.torchspeed.lion_lowbit_step_(
            d["params"], grads, d["exp_avgs"], d["exp_avg_absmaxes"], *lists,
            beta1=0.9, beta2=0.99, **common,
        )  # fmt: skip
    else:
        torch.ops.torchspeed.sgd_lowbit_step_(
            d["params"], grads, d["exp_avgs"], d["exp_avg_absmaxes"], *lists,
            momentum=0.9, dampening=kw["dampening"], nesterov=kw["dampening"] == 0.0,
            first_step=first_step, **common,
        )  # fmt: skip


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
@pytest.mark.parametrize("algo", ["lion", "sgd"])
def test_cuda_one_moment_low_bit_step_equals_the_cpu_step_bitwise(algo, state_dtype, variant):
    block, mixed, with_scalars, kw = CUDA_VARIANTS[variant]
    cpu = _moment_inputs(state_dtype, block, mixed)
    dev = to_device(cpu, CUDA)
    for step in range(4):
        grads = call_grads(cpu, 100 + step)
        if with_scalars:
            grads = [(g.float() * 1024).to(g.dtype) for g in grads]
        before = to_device(dev, CUDA)
        first = step == 0  # SGD: the buffer starts as the grad
        scalars = _device_scalars("cpu", step) if with_scalars else None
        _moment_step(algo, cpu, grads, block, kw, scalars, first)
        scalars = _device_scalars(CUDA, step) if with_scalars else None
        _moment_step(algo, dev, [g.to(CUDA) for g in grads], block, kw, scalars, first)
        assert_same_bits(cpu, dev, f"{algo} {state_dtype} {variant} step {step}")
        if with_scalars and step == 2:  # found_inf: nothing written, not even the steps
            assert_same_bits(before, dev, f"{algo} {state_dtype} {variant} skipped step")
        elif step == 1:  # (the check above can fail: a step does write)
            assert not torch.equal(bits(before["exp_avgs"][0]), bits(dev["exp_avgs"][0]))
    assert [s.item() for s in dev["steps"]] == [s.item() for s in cpu["steps"]]
    assert [s.item() for s in dev["steps"]] == [5.0 if with_scalars else 6.0] * 4


def _optimizer(algo, params, state_dtype):
    if algo == "lion":
        return torchspeed.optim.Lion(params, **LION, state_dtype=state_dtype, state_block=BLOCK)
    return torchspeed.optim.SGD(params, **SGD_KW, state_dtype=state_dtype, state_block=BLOCK)


@needs_cuda
@pytest.mark.parametrize("state_dtype", ["bf16", "int8"])
@pytest.mark.parametrize("algo", ["lion", "sgd"])
def test_cuda_one_moment_optimizer_equals_the_cpu_one_bitwise(algo, state_dtype):
    cpu_params = _params(3, shapes=[(70, 150), (5000,), (300,), (64, 65)])
    dev_params = [torch.nn.Parameter(p.detach().to(CUDA, copy=True)) for p in cpu_params]
    cpu_opt, dev_opt = (
        _optimizer(algo, cpu_params, state_dtype),
        _optimizer(algo, dev_params, state_dtype),
    )
    for step in range(3):
        for p, q, g in zip(cpu_params, dev_params, _grads(cpu_params, 300 + step)):
            p.grad, q.grad = g, g.to(CUDA, copy=True)
        cpu_opt.step()
        dev_opt.step()
        for i, (p, q) in enumerate(zip(cpu_params, dev_params)):
            assert torch.equal(bits(p), bits(q)), (algo, state_dtype, step, i)
            assert set(cpu_opt.state[p]) == set(dev_opt.state[q])
            for key, t in cpu_opt.state[p].items():
                assert torch.equal(bits(t), bits(dev_opt.state[q][key])), (step, i, key)
    key = "exp_avg" if algo == "lion" else "momentum_buffer"
    want = torch.bfloat16 if state_dtype == "bf16" else torch.int8
    assert dev_opt.state[dev_params[0]][key].dtype == want


@needs_cuda
@needs_real_cuda
@pytest.mark.parametrize("state_dtype", ["bf16", "int8"])
@pytest.mark.parametrize("algo", ["lion", "sgd"])
def test_cuda_one_moment_low_bit_step_captures_in_a_graph_and_never_syncs(algo, state_dtype):
    kw = CUDA_VARIANTS["masters_mask_ema_scalars"][3]
    base = _moment_inputs(state_dtype, 256, mixed=True)
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
        _moment_step(algo, warm, static_grads, 256, kw, static_scalars)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        _moment_step(algo, graphed, static_grads, 256, kw, static_scalars)
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
            _moment_step(algo, eager, all_grads[s], 256, kw, all_scalars[s])
    finally:
        torch.cuda.set_sync_debug_mode(0)
    torch.cuda.synchronize()
    assert_same_bits(eager, graphed, f"{algo} {state_dtype} graph replay")
