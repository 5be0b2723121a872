"""Loading low-bit optimizer state (optim/_lowbit.py) as users do it: params in another memory
layout (channels_last), a state saved with another state_block, torch.save / torch.load with
weights_only=True, and corrupt entries that must be refused with nothing loaded."""

import copy
import io

import pytest
import torch

import torchspeed
from torchspeed.optim import _lowbit

OPTIMIZERS = {
    "AdamW": (lambda ps, **kw: torchspeed.optim.AdamW(ps, lr=1e-2, **kw), _lowbit.ADAM_MOMENTS),
    "Lion": (lambda ps, **kw: torchspeed.optim.Lion(ps, lr=1e-3, **kw), (("exp_avg", True),)),
    "SGD": (
        lambda ps, **kw: torchspeed.optim.SGD(ps, lr=1e-2, momentum=0.9, **kw),
        (("momentum_buffer", True),),
    ),
}
SHAPE = (4, 16, 8, 8)  # 4096 elements: 16 blocks of 256


def _param(channels_last, seed=0):
    g = torch.Generator().manual_seed(seed)
    p = torch.randn(SHAPE, generator=g)
    if channels_last:
        p = p.to(memory_format=torch.channels_last)
    return torch.nn.Parameter(p)


def _train(opt, params, first, last):
    for step in range(first, last):
        g = torch.Generator().manual_seed(100 + step)
        for p in params:
            p.grad = torch.randn(p.shape, generator=g)
        opt.step()


def _saved(sd):
    """sd through torch.save / torch.load(weights_only=True), as a checkpoint goes."""
    buf = io.BytesIO()
    torch.save(sd, buf)
    buf.seek(0)
    return torch.load(buf, weights_only=True)


def _moments(opt, p, moments):
    """p's moments as float32 tensors of p's shape (logical order), from any stored format."""
    state = opt.state[p]
    block = opt.param_groups[0]["state_block"]
    return [m.contiguous() for m in _lowbit.moments_fp32(state, p, block, moments)]


def _state_copy(opt, params):
    return [
        {k: v.clone() if torch.is_tensor(v) else v for k, v in opt.state[p].items()} for p in params
    ]


def _assert_state_equal(a, b):
    assert len(a) == len(b)
    for x, y in zip(a, b):
        assert x.keys() == y.keys()
        for k in x:
            if torch.is_tensor(x[k]):
                assert x[k].dtype == y[k].dtype and x[k].shape == y[k].shape, k
                assert x[k].stride() == y[k].stride(), k
                assert torch.equal(x[k], y[k]), k
            else:
                assert x[k] == y[k], k


@pytest.mark.parametrize("state_dtype", ["int8", "bf16"])
@pytest.mark.parametrize("name", list(OPTIMIZERS))
def test_channels_last_low_bit_state_resumes_bit_identically(name, state_dtype):
    # The codes are kept in the param's memory order (the int8 blocks run over it): a checkpoint
    # of a channels_last param must come back with the same bits, and training must continue
    # exactly as without the interruption (before the fix a load reordered them: garbage moments).
    make, _ = OPTIMIZERS[name]
    ref = _param(True)
    ref_opt = make([ref], state_dtype=state_dtype)
    _train(ref_opt, [ref], 0, 6)

    p = _param(True)
    opt = make([p], state_dtype=state_dtype)
    _train(opt, [p], 0, 3)
    ckpt = _saved({"param": p.detach().clone(), "opt": opt.state_dict()})
    q = torch.nn.Parameter(ckpt["param"])
    assert q.is_contiguous(memory_format=torch.channels_last)
    resumed = make([q], state_dtype=state_dtype)
    resumed.load_state_dict(ckpt["opt"])
    _assert_state_equal(_state_copy(resumed, [q]), _state_copy(opt, [p]))
    _train(resumed, [q], 3, 6)
    assert torch.equal(q, ref)
    _assert_state_equal(_state_copy(resumed, [q]), _state_copy(ref_opt, [ref]))


@pytest.mark.parametrize("target_dtype", ["fp32", "bf16", "int8"])
@pytest.mark.parametrize("source_dtype", ["int8", "bf16"])
@pytest.mark.parametrize("name", list(OPTIMIZERS))
@pytest.mark.parametrize("target_channels_last", [False, True])
def test_low_bit_state_loads_into_a_param_of_another_layout(
    name, source_dtype, target_dtype, target_channels_last
):
    # A channels_last source, a target param of either layout: the loaded moments hold the same
    # values at the same logical positions (exactly, into fp32 and from bf16 into bf16; within
    # the int8 map's error, 1/16 of a value plus the bottom of the grid, when requantized in the
    # target's memory order).
    make, moments = OPTIMIZERS[name]
    p = _param(True)
    opt = make([p], state_dtype=source_dtype)
    _train(opt, [p], 0, 3)
    want = _moments(opt, p, moments)

    q = _param(target_channels_last)
    target = make([q], state_dtype=target_dtype)
    target.load_state_dict(_saved(opt.state_dict()))
    got = _moments(target, q, moments)
    # Exact into fp32, and into the same format where the codes can be copied: bf16 always (it
    # is per element), int8 into the same layout (its blocks run over the memory order).
    exact = target_dtype == "fp32" or (
        target_dtype == source_dtype and (source_dtype == "bf16" or target_channels_last)
    )
    for w, g in zip(want, got):
        if exact:
            assert torch.equal(g, w)
        elif target_dtype == "bf16":
            torch.testing.assert_close(g, w, rtol=2**-8, atol=0)
        else:
            tol = w.abs().amax() * 2**-14  # the bottom of the grid, relative to the absmax
            assert ((g - w).abs() <= w.abs() / 16 + tol).all()


def test_flat_int8_codes_of_a_contiguous_param_load_bit_for_bit():
    # Codes of another shape are taken in their memory order, as the step wrote them (a contiguous
    # flat tensor: its order is the contiguous param's); they are copied, not requantized.
    p = _param(False)
    opt = torchspeed.optim.AdamW([p], state_dtype="int8")
    _train(opt, [p], 0, 2)
    sd = copy.deepcopy(opt.state_dict())
    for key in ("exp_avg", "exp_avg_sq"):
        sd["state"][0][key] = sd["state"][0][key].reshape(-1)
    q = _param(False)
    target = torchspeed.optim.AdamW([q], state_dtype="int8")
    target.load_state_dict(sd)
    _assert_state_equal(_state_copy(target, [q]), _state_copy(opt, [p]))


@pytest.mark.parametrize("target_dtype", ["fp32", "int8"])
@pytest.mark.parametrize("name", list(OPTIMIZERS))
def test_int8_state_of_another_state_block_is_converted(name, target_dtype):
    # state_dict() records the state_block its codes were made with; a load decodes them with it
    # and converts them to the optimizer's own (before the fix: refused, "must be torch.float32
    # with 16 elements (state_block 256)", even into an fp32 optimizer).
    make, moments = OPTIMIZERS[name]
    p = _param(False)
    opt = make([p], state_dtype="int8", state_block=64)
    _train(opt, [p], 0, 3)
    want = _moments(opt, p, moments)

    q = _param(False)
    target = make([q], state_dtype=target_dtype)  # state_block 256
    target.load_state_dict(_saved(opt.state_dict()))
    state = target.state[q]
    for (key, signed), w in zip(moments, want):
        if target_dtype == "fp32":
            assert torch.equal(state[key], w)
            assert _lowbit.absmax_key(key) not in state
            continue
        codes, absmax = _lowbit.quantize(w.reshape(-1), signed, 256)
        assert torch.equal(state[key].reshape(-1), codes)
        assert torch.equal(state[_lowbit.absmax_key(key)], absmax)
    _train(target, [q], 3, 4)  # and it steps


def test_state_block_changed_on_a_running_optimizer_through_save_and_load():
    # As docs/OPTIM.md says: take the state_dict, set the group's state_block, load it back.
    p = _param(False)
    opt = torchspeed.optim.AdamW([p], state_dtype="int8", state_block=64)
    _train(opt, [p], 0, 2)
    want = _moments(opt, p, _lowbit.ADAM_MOMENTS)
    sd = opt.state_dict()
    opt.param_groups[0]["state_block"] = 512
    opt.load_state_dict(sd)
    assert opt.state[p]["exp_avg_absmax"].shape == (8,)
    assert opt.param_groups[0]["state_block"] == 512
    got = _moments(opt, p, _lowbit.ADAM_MOMENTS)
    for w, g in zip(want, got):
        tol = w.abs().amax() * 2**-14
        assert ((g - w).abs() <= w.abs() / 16 + tol).all()
    _train(opt, [p], 2, 3)


@pytest.mark.parametrize("name", list(OPTIMIZERS))
def test_state_block_changed_under_a_stored_int8_state_is_refused_at_the_step(name):
    # Before: the op's "exp_avg_absmaxes[0] must be ... of ceil(4096 / 512) = 8 elements",
    # which names neither the option nor the way to change it.
    make, _ = OPTIMIZERS[name]
    params = [_param(False, 0), _param(False, 1)]
    opt = make(params, state_dtype="int8", state_block=64)
    _train(opt, params, 0, 2)
    before = _state_copy(opt, params)
    values = [p.detach().clone() for p in params]
    opt.param_groups[0]["state_block"] = 512
    with pytest.raises(ValueError, match=r"param_groups\[0\]\.state_block must be the block of"):
        _train(opt, params, 2, 3)
    _assert_state_equal(_state_copy(opt, params), before)
    assert all(torch.equal(p, v) for p, v in zip(params, values))
    # torch_state_dict() decodes with the group's block: the same message (it was lowbit_decode's
    # "absmax must be a contiguous float32 tensor of ceil(4096 / 512) = 8 elements").
    with pytest.raises(ValueError, match=r"param_groups\[0\]\.state_block must be the block of"):
        opt.torch_state_dict()


def _int8_opt(name="AdamW"):
    make, _ = OPTIMIZERS[name]
    params = [_param(False, seed) for seed in range(2)]
    opt = make(params, state_dtype="int8")
    _train(opt, params, 0, 2)
    return params, opt


def _refused(name, mutate, error, message):
    params, opt = _int8_opt(name)
    sd = copy.deepcopy(opt.state_dict())
    mutate(sd)
    make, _ = OPTIMIZERS[name]
    targets = [torch.nn.Parameter(p.detach().clone()) for p in params]
    target = make(targets, state_dtype="int8")
    _train(target, targets, 5, 6)
    before = _state_copy(target, targets)
    groups = copy.deepcopy(
        [{k: v for k, v in g.items() if k != "params"} for g in target.param_groups]
    )
    with pytest.raises(error, match=message):
        target.load_state_dict(sd)
    _assert_state_equal(_state_copy(target, targets), before)  # nothing half-loaded
    assert [{k: v for k, v in g.items() if k != "params"} for g in target.param_groups] == groups


def _set(index, key, make):
    def mutate(sd):
        sd["state"][index][key] = make(sd["state"][index].get(key))

    return mutate


@pytest.mark.parametrize(
    "dtype", [torch.float64, torch.bfloat16, torch.float16, torch.int32, torch.int64]
)
def test_absmax_of_another_dtype_is_refused(dtype):
    # Before the fix the absmax was cast to float32 first, so the dtype rule never fired.
    _refused(
        "AdamW",
        _set(1, "exp_avg_absmax", lambda t: t.to(dtype)),
        ValueError,
        r"state\[1\]\['exp_avg_absmax'\] of an int8 state must be torch.float32 with 16 elements",
    )


@pytest.mark.parametrize("name", ["AdamW", "Lion"])
def test_state_without_step_is_refused(name):
    # Before the fix it loaded, and the next step raised KeyError: 'step'.
    def drop(sd):
        del sd["state"][1]["step"]

    _refused(name, drop, ValueError, r"state\[1\]\['step'\] must be a number or a one-element")


@pytest.mark.parametrize("value", [float("nan"), float("inf"), -1.0])
def test_step_that_is_not_a_finite_count_is_refused(value):
    _refused(
        "AdamW",
        _set(1, "step", lambda t: torch.tensor(value)),
        ValueError,
        r"state\[1\]\['step'\] must be a finite number >= 0",
    )


@pytest.mark.parametrize("block", [7, 0, 8192, "256"])
def test_saved_state_block_that_is_not_a_block_size_is_refused(block):
    def mutate(sd):
        sd["param_groups"][0]["state_block"] = block

    error = TypeError if isinstance(block, str) else ValueError
    _refused("AdamW", mutate, error, r"state_dict param_groups\[0\]\.state_block must be")


@pytest.mark.parametrize("key", ["exp_avg", "exp_avg_sq"])
@pytest.mark.parametrize("value", [float("nan"), float("inf")])
def test_non_finite_float_moment_is_refused_when_quantized(key, value):
    # lowbit_encode maps NaN to the block's largest code: a NaN moment would come back finite.
    params = [_param(False, seed) for seed in range(2)]
    src = torch.optim.AdamW(params)
    _train(src, params, 0, 2)
    sd = copy.deepcopy(src.state_dict())
    sd["state"][1][key].view(-1)[5] = value
    targets = [torch.nn.Parameter(p.detach().clone()) for p in params]
    target = torchspeed.optim.AdamW(targets, state_dtype="int8")
    with pytest.raises(ValueError, match=rf"state\[1\]\['{key}'\] must be finite"):
        target.load_state_dict(sd)
    assert not target.state
    torchspeed.optim.AdamW(targets).load_state_dict(sd)  # fp32 keeps it, as torch.optim does


def test_negative_second_moment_is_refused_when_quantized():
    params = [_param(False)]
    src = torch.optim.AdamW(params)
    _train(src, params, 0, 2)
    sd = copy.deepcopy(src.state_dict())
    sd["state"][0]["exp_avg_sq"].view(-1)[3] = -1.0
    target = torchspeed.optim.AdamW(
        [torch.nn.Parameter(params[0].detach().clone())], state_dtype="int8"
    )
    with pytest.raises(ValueError, match=r"state\[0\]\['exp_avg_sq'\] must be finite and >= 0"):
        target.load_state_dict(sd)


@pytest.mark.parametrize(
    "name, state_dtype", [("AdamW", "int8"), ("Lion", "bf16"), ("SGD", "int8")]
)
def test_compiled_low_bit_step_matches_the_eager_step(name, state_dtype):
    # torch.compile(opt.step, fullgraph=True) traces the low-bit step, its state creation and the
    # stored-block check; with an lr exact in float32 (the traced lr is a float32 tensor) it
    # writes the eager step's bits.
    make, _ = OPTIMIZERS[name]
    torch._dynamo.reset()
    params = [_param(False, 0), torch.nn.Parameter(torch.randn(100))]  # int8 and fp32 moments
    eager_params = [torch.nn.Parameter(p.detach().clone()) for p in params]
    opt = make(params, state_dtype=state_dtype)
    eager = make(eager_params, state_dtype=state_dtype)
    for o in (opt, eager):
        o.param_groups[0]["lr"] = 2.0**-7
    step = torch.compile(opt.step, fullgraph=True)
    for k in range(3):
        g = torch.Generator().manual_seed(k)
        for p, q in zip(params, eager_params):
            p.grad = torch.randn(p.shape, generator=g)
            q.grad = p.grad.clone()
        step()
        eager.step()
    for p, q in zip(params, eager_params):
        assert torch.equal(p, q)
    _assert_state_equal(_state_copy(opt, params), _state_copy(eager, eager_params))
