"""The shared machinery of torchspeed.optim (optim/_fused.py) under hostile input: duplicate
and aliased params, steps and loads that fail without changing anything, hyperparameter
validation shared with C++, Tensor betas, per-group clipping, old checkpoints, grad_stats([])
and torch.compile(opt.step)."""

import copy
import math
import warnings

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.testing import assert_close

import torchspeed
from torchspeed import _C

OPTIMIZERS = ["Adam", "AdamW", "SGD", "Lion", "LAMB"]
KW = {
    "Adam": dict(lr=1e-2, weight_decay=0.1),
    "AdamW": dict(lr=1e-2),
    "SGD": dict(lr=1e-2, momentum=0.9),
    "Lion": dict(lr=1e-3, weight_decay=0.1),
    "LAMB": dict(lr=1e-2, weight_decay=0.1),
}
# Big enough for several chunks (64Ki elements) run by several threads in one op call.
BIG = 200_000


def _make(cls_name, params, **kw):
    return getattr(torchspeed.optim, cls_name)(params, **{**KW[cls_name], **kw})


def _grads(shapes, seed):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(s, generator=g) for s in shapes]


# ---- duplicate and aliased params ---------------------------------------------------------------
def _run_duplicates(cls, p_init, steps=4):
    p = p_init.clone()
    q = torch.randn(7, generator=torch.Generator().manual_seed(5))
    with pytest.warns(UserWarning, match="duplicate parameters"):
        opt = cls([p, q, p])
    for step in range(steps):
        p.grad, q.grad = _grads([p.shape, q.shape], step)
        opt.step()
    return p, q, opt


@pytest.mark.parametrize("name", ["Adam", "AdamW", "SGD"])
def test_duplicate_params_update_twice_like_torch_and_deterministically(name):
    p0 = torch.randn(BIG, generator=torch.Generator().manual_seed(0))

    def ours(params):
        return _make(name, params)

    def ref(params):
        return getattr(torch.optim, name)(params, foreach=False, **KW[name])

    rp, rq, _ = _run_duplicates(ref, p0)
    p1, q1, opt = _run_duplicates(ours, p0)
    p2, q2, _ = _run_duplicates(ours, p0)
    assert torch.equal(p1, p2) and torch.equal(q1, q2)  # bitwise the same on every run
    assert_close(p1, rp, rtol=1e-6, atol=1e-6)
    assert_close(q1, rq, rtol=1e-6, atol=1e-6)
    if name != "SGD":
        assert opt.state[p1]["step"].item() == 8  # two updates per step, as in torch


@pytest.mark.parametrize("name", ["Lion", "LAMB"])
def test_duplicate_params_equal_two_sequential_updates(name):
    # torch has no Lion/LAMB: [p, p] must equal stepping [p] twice with the same grad.
    p0 = torch.randn(BIG, generator=torch.Generator().manual_seed(0))
    p1, q1, _ = _run_duplicates(lambda ps: _make(name, ps), p0)
    p = p0.clone()
    q = torch.randn(7, generator=torch.Generator().manual_seed(5))
    opt = _make(name, [p, q])
    for step in range(4):
        gp, gq = _grads([p.shape, q.shape], step)
        p.grad, q.grad = gp, gq
        opt.step()
        p.grad, q.grad = gp, None
        opt.step()
    assert torch.equal(p1, p)
    assert torch.equal(q1, q)


def test_duplicates_across_groups_raise_like_torch():
    p = torch.nn.Parameter(torch.randn(3))
    for cls in (torch.optim.AdamW, torchspeed.optim.AdamW):
        with pytest.raises(ValueError, match="some parameters appear in more than one"):
            cls([{"params": [p]}, {"params": [p]}])


@pytest.mark.parametrize("name", ["SGD", "AdamW"])
@pytest.mark.parametrize("grouped", [False, True])
def test_overlapping_views_update_like_torch(name, grouped):
    results = []
    for make in (
        lambda ps: getattr(torch.optim, name)(ps, foreach=False, **KW[name]),
        lambda ps: _make(name, ps),
        lambda ps: _make(name, ps),
    ):
        base = torch.randn(3 * BIG // 2, generator=torch.Generator().manual_seed(0))
        a, b = base[:BIG], base[BIG // 2 :]  # overlap by BIG // 2 elements
        opt = make([{"params": [a]}, {"params": [b]}] if grouped else [a, b])
        for step in range(3):
            a.grad, b.grad = _grads([a.shape, b.shape], step)
            opt.step()
        results.append(base)
    assert torch.equal(results[1], results[2])
    assert_close(results[1], results[0], rtol=1e-6, atol=1e-6)


# ---- a failing step or load changes nothing -----------------------------------------------------
def _snapshot(opt):
    params = [p.detach().clone() for g in opt.param_groups for p in g["params"]]
    state = {id(p): copy.deepcopy(dict(s)) for p, s in opt.state.items()}
    groups = [
        {k: copy.deepcopy(v) for k, v in g.items() if k != "params"} for g in opt.param_groups
    ]
    return params, state, groups, len(opt.state)


def _assert_same(before, after):
    for a, b in zip(before[0], after[0]):
        assert torch.equal(a, b)
    assert before[3] == after[3]
    assert before[1].keys() == after[1].keys()
    for key in before[1]:
        s0, s1 = before[1][key], after[1][key]
        assert s0.keys() == s1.keys()
        for k in s0:
            if torch.is_tensor(s0[k]):
                assert torch.equal(s0[k], s1[k]), k
            else:
                assert s0[k] == s1[k], k
    assert len(before[2]) == len(after[2])
    for g0, g1 in zip(before[2], after[2]):
        assert g0.keys() == g1.keys()
        for k in g0:
            if torch.is_tensor(g0[k]):
                assert torch.equal(g0[k], g1[k])
            else:
                assert g0[k] == g1[k] or (g0[k] != g0[k] and g1[k] != g1[k])


def _two_group_opt(name):
    a = torch.nn.Parameter(torch.randn(BIG))
    b = torch.nn.Parameter(torch.randn(10, dtype=torch.bfloat16))  # its own (master) bucket
    c = torch.nn.Parameter(torch.randn(10))
    opt = _make(name, [{"params": [a]}, {"params": [b, c]}])
    for p in (a, b, c):
        p.grad = torch.randn_like(p)
    opt.step()  # state exists
    for p in (a, b, c):
        p.grad = torch.randn_like(p)
    return opt, (a, b, c)


def _truncate_state(opt, params):
    key = "momentum_buffer" if type(opt).__name__ == "SGD" else "exp_avg"
    opt.state[params[2]][key] = torch.zeros(3)


FAILURES = {
    "lr_two_elements": (
        lambda opt, ps: opt.param_groups[1].__setitem__("lr", torch.tensor([0.1, 0.1])),
        r"param_groups\[1\]\.lr: Tensor lr must be 1-element",
    ),
    "lr_negative": (
        lambda opt, ps: opt.param_groups[1].__setitem__("lr", -0.1),
        r"param_groups\[1\]\.lr must be a finite number >= 0, got -0.1",
    ),
    "weight_decay_nan": (
        lambda opt, ps: opt.param_groups[1].__setitem__("weight_decay", float("nan")),
        r"param_groups\[1\]\.weight_decay must be a finite number >= 0, got nan",
    ),
    "truncated_state": (_truncate_state, r"must have 10 elements like params\[\d\], got 3"),
}


@pytest.mark.parametrize("name", OPTIMIZERS)
@pytest.mark.parametrize("failure", sorted(FAILURES))
def test_failed_step_in_a_later_group_changes_nothing(name, failure):
    opt, params = _two_group_opt(name)
    mutate, message = FAILURES[failure]
    mutate(opt, params)
    before = _snapshot(opt)
    with pytest.raises((ValueError, RuntimeError), match=message):
        opt.step()
    _assert_same(before, _snapshot(opt))


@pytest.mark.parametrize("name", ["Adam", "AdamW", "Lion", "LAMB"])
def test_one_element_betas_in_a_later_group_changes_nothing(name):
    opt, params = _two_group_opt(name)
    opt.param_groups[1]["betas"] = (0.9,)
    before = _snapshot(opt)
    with pytest.raises(ValueError, match=r"param_groups\[1\]\.betas must be a pair of floats"):
        opt.step()
    _assert_same(before, _snapshot(opt))


@pytest.mark.parametrize("name", OPTIMIZERS)
def test_failing_single_group_step_leaves_no_new_state(name):
    p = torch.nn.Parameter(torch.randn(10))
    q = torch.nn.Parameter(torch.randn(10))
    opt = _make(name, [p, q])
    p.grad = torch.randn(10)
    q.grad = torch.randn(10).to_sparse()  # the op rejects it, after the state was prepared
    with pytest.raises(RuntimeError, match=r"grads\[1\] must be dense"):
        opt.step()
    assert len(opt.state) == 0


@pytest.mark.parametrize("name", OPTIMIZERS)
def test_failing_load_state_dict_changes_nothing(name):
    opt, params = _two_group_opt(name)
    sd = opt.state_dict()
    key = "momentum_buffer" if name == "SGD" else "exp_avg"
    sd["state"][2][key] = torch.zeros(4)  # the last param: after the good ones
    sd["param_groups"][0]["lr"] = 0.5  # would be applied first by a naive load
    before = _snapshot(opt)
    with pytest.raises(ValueError, match=rf"state\[2\]\['{key}'\] must have 10 elements"):
        opt.load_state_dict(sd)
    _assert_same(before, _snapshot(opt))
    sd = opt.state_dict()
    sd["param_groups"][1]["lr"] = -1.0
    with pytest.raises(ValueError, match=r"param_groups\[1\]\.lr must be a finite number >= 0"):
        opt.load_state_dict(sd)
    _assert_same(before, _snapshot(opt))


# ---- hyperparameters --------------------------------------------------------------------------
@pytest.mark.parametrize(
    "name, kw, error, message",
    [
        ("AdamW", dict(max_grad_norm=-1.0), ValueError, "max_grad_norm must be >= 0"),
        ("SGD", dict(max_grad_norm=float("nan")), ValueError, "max_grad_norm must be >= 0"),
        ("LAMB", dict(eps=-1.0), ValueError, "eps must be a finite number >= 0, got -1"),
        ("Adam", dict(ema_decay=1.5), ValueError, r"ema_decay must be in \[0, 1\], got 1.5"),
        ("Lion", dict(ema_decay=-0.1), ValueError, r"ema_decay must be in \[0, 1\], got -0.1"),
        ("Adam", dict(lr="0.01"), TypeError, "lr must be a float, got str"),
        ("AdamW", dict(betas=(0.9,)), ValueError, "betas must be a pair of floats"),
        ("Adam", dict(lr=float("inf")), ValueError, "lr must be a finite number"),
        ("Adam", dict(lr=1e39), ValueError, "lr must be a finite number"),  # inf in float32
        ("SGD", dict(weight_decay=float("inf")), ValueError, "weight_decay must be a finite"),
        ("SGD", dict(momentum=-0.5), ValueError, "momentum must be a finite number >= 0"),
        ("Lion", dict(betas=(0.9, 1.0)), ValueError, r"betas\[1\] must be in \[0, 1\)"),
        ("Adam", dict(betas=torch.tensor([0.9, 0.99])), ValueError, "betas must be a pair"),
        ("Adam", dict(eps=torch.tensor(1e-8)), ValueError, "eps must be a float, got a Tensor"),
    ],
)
def test_bad_hyperparameters_rejected_at_construction(name, kw, error, message):
    with pytest.raises(error, match=message):
        getattr(torchspeed.optim, name)([torch.randn(3)], **kw)


@pytest.mark.parametrize("name", ["Adam", "AdamW", "Lion", "LAMB"])
def test_tensor_betas_step_like_float_betas_and_like_torch(name):
    # torch.optim accepts betas=(Tensor, Tensor) on the CPU; their value is read at each step.
    p0 = torch.randn(BIG, generator=torch.Generator().manual_seed(0))
    a, b = p0.clone(), p0.clone()
    betas = (torch.tensor(0.8), torch.tensor(0.95))
    # The same values as floats (a float32 Tensor holds 0.8 rounded to float32).
    opt_f = _make(name, [a], betas=tuple(float(x) for x in betas))
    opt_t = _make(name, [b], betas=betas)
    ref = None
    if hasattr(torch.optim, name):
        c = torch.nn.Parameter(p0.clone())
        ref = getattr(torch.optim, name)([c], foreach=False, betas=betas, **KW[name])
    for step in range(4):
        if step == 2:  # an in-place change takes effect at the next step, as in torch
            betas[0].fill_(0.7)
            opt_f.param_groups[0]["betas"] = tuple(float(x) for x in betas)
        (g,) = _grads([p0.shape], step)
        a.grad, b.grad = g.clone(), g.clone()
        opt_f.step()
        opt_t.step()
        if ref is not None:
            c.grad = g.clone()
            ref.step()
    assert_close(b, a, rtol=0, atol=0)  # bitwise: the same kernel with the same scalars
    if ref is not None:
        assert_close(b, c.detach(), rtol=1e-6, atol=1e-6)
    assert torch.is_tensor(opt_t.state_dict()["param_groups"][0]["betas"][0])


@pytest.mark.parametrize(
    "betas, kw, message",
    [
        ((torch.tensor(0.9), 0.99), {}, "betas must be either both floats or both Tensors"),
        ((torch.tensor([0.9, 0.8]), torch.tensor(0.99)), {}, r"betas\[0\] must be a one-element"),
        ((torch.tensor(1), torch.tensor(0.99)), {}, r"betas\[0\] must be a one-element float"),
        ((torch.tensor(0.9), torch.tensor(1.5)), {}, r"betas\[1\] must be in \[0, 1\)"),
        ((torch.tensor(0.9), torch.tensor(0.99)), dict(foreach=True), "capturable=False and"),
    ],
)
def test_bad_tensor_betas_rejected_like_torch(betas, kw, message):
    with pytest.raises(ValueError, match=message):
        torchspeed.optim.AdamW([torch.randn(3)], betas=betas, **kw)
    with pytest.raises((ValueError, RuntimeError)):  # torch: RuntimeError for a 2-element beta
        torch.optim.AdamW([torch.randn(3)], betas=betas, **kw)


def test_tensor_beta_changed_to_a_bad_value_is_caught_at_the_step():
    betas = (torch.tensor(0.9), torch.tensor(0.99))
    p = torch.nn.Parameter(torch.randn(8))
    opt = torchspeed.optim.AdamW([p], betas=betas)
    p.grad = torch.randn(8)
    betas[1].fill_(1.0)
    before = p.detach().clone()
    with pytest.raises(ValueError, match=r"betas\[1\] must be in \[0, 1\)"):
        opt.step()
    assert torch.equal(p.detach(), before) and not opt.state


def test_torch_default_adamw_on_the_cpu_is_the_for_loop_one():
    # docs/OPTIM.md and docs/DEMO.md compare against torch's default AdamW: on the CPU that is the
    # for-loop implementation (neither foreach nor fused), as torch's own chooser answers.
    from torch.optim.optimizer import _default_to_fused_or_foreach

    params = [torch.nn.Parameter(torch.randn(4))]
    assert _default_to_fused_or_foreach(params, differentiable=False, use_fused=False) == (
        False,
        False,
    )


def test_hyperparameters_checked_at_add_param_group():
    opt = torchspeed.optim.AdamW([torch.randn(3)])
    with pytest.raises(ValueError, match=r"param_groups\[1\]\.lr must be a finite number >= 0"):
        opt.add_param_group({"params": [torch.randn(3)], "lr": -1.0})
    assert len(opt.param_groups) == 1


@pytest.mark.parametrize("name", OPTIMIZERS)
def test_torch_error_inputs_raise_the_same_error_types(name):
    from torch.testing._internal import common_optimizers as co

    # torch has no Lion/LAMB: those get the error inputs torch runs against every optimizer.
    func = getattr(
        co, f"optim_error_inputs_func_{name.lower()}", co.get_error_inputs_for_all_optims
    )
    checked = 0
    for error_input in func("cpu", torch.float32):
        inp = error_input.optimizer_error_input
        params = inp.params if inp.params is not None else [torch.nn.Parameter(torch.randn(1))]
        kwargs = dict(inp.kwargs)
        if name == "SGD":
            kwargs.setdefault("lr", 1e-2)
        cls = getattr(torchspeed.optim, name)
        if issubclass(error_input.error_type, Warning):
            with pytest.warns(error_input.error_type):
                cls(params, **kwargs)
        else:
            with pytest.raises(error_input.error_type):
                cls(params, **kwargs)
        checked += 1
    assert checked >= 6


FLOATS = st.one_of(
    st.floats(min_value=-1e3, max_value=1e3),
    st.sampled_from([0.0, 1.0, -0.0, 1e-12, 0.999, float("nan"), float("inf"), float("-inf")]),
)
VALUES = st.one_of(FLOATS, st.sampled_from(["0.1", None, True, [0.1], torch.tensor(0.1)]))
HYPER = {
    "Adam": ["lr", "eps", "weight_decay", "betas[0]", "betas[1]", "max_grad_norm", "ema_decay"],
    "SGD": ["lr", "momentum", "dampening", "weight_decay", "max_grad_norm", "ema_decay"],
    "Lion": ["lr", "weight_decay", "betas[0]", "betas[1]", "max_grad_norm", "ema_decay"],
    "LAMB": ["lr", "eps", "weight_decay", "betas[0]", "betas[1]", "max_grad_norm", "ema_decay"],
}


def _cxx_accepts(name, key, value):
    if key == "lr" and torch.is_tensor(value):
        value = float(value)  # lr may be a one-element Tensor; its value is checked
    if not isinstance(value, float):
        return False  # the C++ options are doubles: a wrong type cannot be expressed there
    try:
        _C.optim.check_hyperparameter(name, key, value)
        return True
    except ValueError:
        return False


@settings(max_examples=300, deadline=None)
@given(
    name=st.sampled_from(sorted(HYPER)),
    data=st.data(),
)
def test_python_and_cxx_accept_the_same_hyperparameters(name, data):
    key = data.draw(st.sampled_from(HYPER[name]))
    value = data.draw(VALUES)
    kw = {"lr": 1e-2} if name == "SGD" else {}
    if key.startswith("betas["):
        betas = [0.9, 0.99]
        betas[int(key[6])] = value
        kw["betas"] = tuple(betas)
    else:
        kw[key] = value
    p = torch.nn.Parameter(torch.randn(16, generator=torch.Generator().manual_seed(0)))
    try:
        opt = getattr(torchspeed.optim, name)([p], **kw)
        accepted = True
    except (ValueError, TypeError):
        accepted = False
    assert accepted == (value is None and key in ("max_grad_norm", "ema_decay")) or (
        accepted == _cxx_accepts(name, key, value)
    ), (name, key, value)
    if accepted:
        for step in range(2):
            p.grad = torch.randn(16, generator=torch.Generator().manual_seed(step))
            opt.step()
        assert not torch.isnan(p).any(), (name, key, value)


@pytest.mark.parametrize("name", OPTIMIZERS)
def test_max_grad_norm_zero_zeroes_the_grads_like_torch(name):
    p0 = torch.randn(50)
    a = torch.nn.Parameter(p0.clone())
    b = torch.nn.Parameter(p0.clone())
    opt_a = _make(name, [a], max_grad_norm=0.0)
    opt_b = _make(name, [b])
    a.grad = torch.randn(50)
    b.grad = torch.zeros(50)  # what clip_grad_norm_(..., 0) leaves
    opt_a.step()
    opt_b.step()
    assert_close(a, b, rtol=0, atol=0)


@pytest.mark.parametrize("name", ["Adam", "AdamW", "SGD"])
def test_max_grad_norm_is_per_group_like_clip_grad_norm_per_group(name):
    norms = [0.5, None, 2.0]
    results = []
    for ours in (False, True):
        torch.manual_seed(0)
        params = [torch.nn.Parameter(torch.randn(s)) for s in ((300,), (40, 5), (77,))]
        if ours:
            groups = [{"params": [p], "max_grad_norm": n} for p, n in zip(params, norms)]
            opt = _make(name, groups)
        else:
            groups = [{"params": [p]} for p in params]
            opt = getattr(torch.optim, name)(groups, foreach=False, **KW[name])
        for step in range(5):
            for p, g in zip(params, _grads([p.shape for p in params], step)):
                p.grad = g * 3
            if not ours:
                for p, n in zip(params, norms):
                    if n is not None:
                        torch.nn.utils.clip_grad_norm_([p], n)
            opt.step()
        results.append(params)
    for a, b in zip(*results):
        assert_close(b, a, rtol=1e-6, atol=1e-6)


# ---- old checkpoints --------------------------------------------------------------------------
@pytest.mark.parametrize("step", [3, 3.0, "int64 tensor"])
def test_checkpoint_with_a_plain_or_integer_step_loads_and_steps_like_torch(step):
    results = []
    for cls in (torch.optim.Adam, torchspeed.optim.Adam):
        torch.manual_seed(0)
        p = torch.nn.Parameter(torch.randn(20))
        src = torch.optim.Adam([p], lr=0.1)
        p.grad = torch.randn(20)
        src.step()
        sd = src.state_dict()
        # A fresh tensor each time: torch keeps (and increments) the loaded one itself.
        sd["state"][0]["step"] = torch.tensor(3) if step == "int64 tensor" else step
        opt = cls([p], lr=0.1)
        opt.load_state_dict(sd)
        if cls is torchspeed.optim.Adam:
            assert opt.state[p]["step"].dtype == torch.float32
            assert opt.state[p]["step"].shape == ()
        p.grad = torch.randn(20)
        opt.step()
        results.append((p.detach().clone(), float(opt.state[p]["step"])))
    assert results[1][1] == results[0][1] == 4.0
    assert_close(results[1][0], results[0][0], rtol=1e-6, atol=1e-6)


# ---- grad_stats([]) and torch.compile ------------------------------------------------------------
def test_grad_stats_of_no_tensors_is_zero_like_clip_grad_norm():
    stats = torchspeed.ops.grad_stats([])
    assert_close(stats.total_norm, torch.nn.utils.clip_grad_norm_([], 1.0))
    assert stats.total_norm.item() == 0.0 and stats.found_inf.item() == 0.0
    assert stats.per_tensor_norms.shape == (0,)
    stats = torchspeed.ops.grad_stats([], inv_scale=torch.ones(1), per_tensor=True)
    assert stats.total_norm.item() == 0.0 and not math.isinf(stats.total_norm.item())


@pytest.mark.parametrize("name", OPTIMIZERS)
def test_compiled_step_fullgraph_matches_eager(name):
    results = []
    for compiled in (False, True):
        torch.manual_seed(0)
        params = [torch.nn.Parameter(torch.randn(s)) for s in ((33,), (4, 5))]
        opt = _make(name, params)
        step = opt.step
        if compiled:
            torch._dynamo.reset()
            step = torch.compile(opt.step, fullgraph=True, backend="eager")
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            for i in range(3):
                for p, g in zip(params, _grads([p.shape for p in params], i)):
                    p.grad = g
                step()
        results.append([p.detach().clone() for p in params])
    for a, b in zip(*results):
        if name == "LAMB":  # compiled, the float lr is a float32 tensor (issue 25 item 5)
            assert_close(a, b, rtol=1e-6, atol=1e-7)
        else:
            assert torch.equal(a, b)
