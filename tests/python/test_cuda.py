"""What only the CUDA ops have: their kernels registered, multi-block and chunk-boundary cases,
int64 indexing, CUDA against the CPU op where no torch reference exists (mixed dtypes, masters,
masks/EMA/clip), a full AMP step under torch.cuda.set_sync_debug_mode("error"), graph capture,
scalars read on the device, and opcheck with device scalar tensors. The comparisons that hold on
any device (against torch.optim, float64 references, GradScaler, opcheck) run on CUDA through the
`device` fixture of optim/test_optimizers.py and test_ops.py.

Every test is skipped with its reason without a CUDA device or without a CUDA build.
TORCHSPEED_CUDA_TESTS_ON_CPU=1 runs the same comparisons with the "CUDA" side on the CPU, which
checks this file itself on a machine without a GPU (it proves nothing about the CUDA kernels).
"""

import os

import pytest
import torch
from torch.testing import assert_close

import torchspeed

_ON_CPU = os.environ.get("TORCHSPEED_CUDA_TESTS_ON_CPU") == "1"
DEV = "cpu" if _ON_CPU else "cuda"

if not _ON_CPU:
    pytestmark = [
        pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
        pytest.mark.skipif(
            not getattr(torchspeed._C, "with_cuda", False), reason="torchspeed built without CUDA"
        ),
    ]

needs_real_cuda = pytest.mark.skipif(_ON_CPU, reason="needs a CUDA device (CPU dry run)")

OPS = ["grad_stats", "grad_stats_unscale_", "adam_step_", "sgd_step_", "lion_step_", "lamb_step_"]
FP32 = dict(rtol=1e-5, atol=1e-6)
DTYPES = [torch.float32, torch.float64, torch.bfloat16, torch.float16]


def _gen(seed):
    return torch.Generator().manual_seed(seed)


def _randn(shape, dtype, seed, scale=1.0):
    """Deterministic values made on the CPU, so the CPU and device inputs are identical."""
    return (torch.randn(shape, generator=_gen(seed), dtype=torch.float64) * scale).to(dtype)


# ---- registration ----------------------------------------------------------------------------------


@needs_real_cuda
@pytest.mark.parametrize("op", OPS)
def test_cuda_kernel_registered(op):
    assert torch._C._dispatch_has_kernel_for_dispatch_key(f"torchspeed::{op}", "CUDA"), (
        f"torchspeed._C.with_cuda is True but torchspeed::{op} has no CUDA kernel"
    )


# ---- grad_stats ------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("bad", [float("inf"), float("-inf"), float("nan")])
@pytest.mark.parametrize("where", ["big_last", "big_first", "tiny", "unaligned"])
def test_grad_stats_flags_non_finite(dtype, bad, where):
    ts = [_randn((n,), dtype, seed=n) for n in (3_000_000, 5, 70_001)]
    if where == "big_last":
        ts[0][-1] = bad
    elif where == "big_first":
        ts[0][0] = bad
    elif where == "tiny":
        ts[1][2] = bad
    else:
        ts[2][65_537] = bad
    dev = [t.to(DEV) for t in ts]
    if where == "unaligned":
        dev[2] = dev[2][1:]  # storage offset 1: the guarded element-wise path
    out = torchspeed.ops.grad_stats(dev)
    assert out.found_inf.item() == 1.0
    assert not torch.isfinite(out.total_norm).item()
    # unscale: flagged as well, and the check looks at the values before the multiply
    out = torchspeed.ops.grad_stats(dev, inv_scale=torch.full((1,), 0.5, device=DEV))
    assert out.found_inf.item() == 1.0


def test_grad_stats_non_finite_checked_before_unscale():
    t = torch.tensor([3e38, 1.0], device=DEV)
    out = torchspeed.ops.grad_stats([t], inv_scale=torch.full((1,), 10.0, device=DEV))
    assert out.found_inf.item() == 0.0  # finite before unscaling, like torch's AMP unscale
    assert torch.isinf(t[0]).item()


def test_grad_stats_unaligned_and_non_contiguous():
    base = _randn((70_003,), torch.float32, seed=5)
    mat = _randn((300, 301), torch.bfloat16, seed=6)
    cpu = [base[1:], base[3:65_540], mat.t(), mat[:, ::2]]
    dev_base, dev_mat = base.to(DEV, copy=True), mat.to(DEV, copy=True)
    dev = [dev_base[1:], dev_base[3:65_540], dev_mat.t(), dev_mat[:, ::2]]
    ref = torchspeed.ops.grad_stats(cpu, per_tensor=True)
    out = torchspeed.ops.grad_stats(dev, per_tensor=True)
    assert_close(out.per_tensor_norms.cpu(), ref.per_tensor_norms, **FP32)
    inv = torch.full((1,), 0.25)
    torchspeed.ops.grad_stats(cpu, inv_scale=inv)
    torchspeed.ops.grad_stats(dev, inv_scale=inv.to(DEV))
    assert_close(dev_base.cpu(), base, rtol=0, atol=0)
    assert_close(dev_mat.cpu(), mat, rtol=0, atol=0)


@needs_real_cuda
def test_grad_stats_int64_indexing_past_2_pow_31():
    n = 2**31 + 4099  # element offsets past int32 (4.3 GB of bf16)
    free, _ = torch.cuda.mem_get_info()
    if free < 3 * n * 2:
        pytest.skip(f"needs {3 * n * 2 / 2**30:.1f} GiB of free GPU memory, has {free / 2**30:.1f}")
    t = torch.ones(n, dtype=torch.bfloat16, device=DEV)
    t[-1] = 3.0
    out = torchspeed.ops.grad_stats([t], inv_scale=torch.full((1,), 0.5, device=DEV))
    assert out.found_inf.item() == 0.0
    assert_close(out.total_norm.item(), ((n - 1) * 0.25 + 2.25) ** 0.5, rtol=1e-6, atol=0)
    assert t[-1].item() == 1.5 and t[-4098].item() == 0.5 and t[0].item() == 0.5
    del t
    torch.cuda.empty_cache()


# ---- optimizers against torch.optim on the same device ---------------------------------------------

SHAPES = [(0,), (1,), (7, 3), (65537,), (300, 301)] + [(3,)] * 40  # > 24 tensors: several launches


def _params(dtype=torch.float32, shapes=SHAPES):
    return [
        _randn(s, torch.float32, seed=100 + i).to(dtype).to(DEV).requires_grad_()
        for i, s in enumerate(shapes)
    ]


def _grads(step, shapes=SHAPES, dtype=torch.float32):
    return [
        _randn(s, torch.float32, seed=10_000 * step + i).to(dtype).to(DEV)
        for i, s in enumerate(shapes)
    ]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_low_precision_params_with_master_match_cpu_and_fp32_torch(dtype):
    shapes = [(65537,), (33, 17), (5,)]
    ours = _params(dtype, shapes)
    cpu = [p.detach().to("cpu", copy=True).requires_grad_() for p in ours]
    ref = [p.detach().float().requires_grad_() for p in ours]  # fp32 torch on the device
    our_opt = torchspeed.optim.AdamW(ours, lr=1e-2)
    cpu_opt = torchspeed.optim.AdamW(cpu, lr=1e-2)
    ref_opt = torch.optim.AdamW(ref, lr=1e-2, foreach=False)
    for step in range(20):
        for a, b, c, g in zip(ref, ours, cpu, _grads(step, shapes, dtype)):
            a.grad, b.grad, c.grad = g.float(), g.clone(), g.to("cpu", copy=True)
        ref_opt.step()
        our_opt.step()
        cpu_opt.step()
    for a, b, c in zip(ref, ours, cpu):
        master = our_opt.state[b]["master"]
        assert_close(master.cpu(), cpu_opt.state[c]["master"], **FP32)
        assert_close(b.detach(), master.to(dtype), rtol=0, atol=0)  # param = rounded master
        assert_close(master, a.detach(), **FP32)  # the master follows fp32 torch.optim.AdamW


@pytest.mark.parametrize("grad_dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("param_dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_mixed_param_grad_dtypes_match_cpu_op(param_dtype, grad_dtype):
    """Every (param, grad) storage pair of the kernels, through the op (autograd never makes a
    grad of another dtype, but the op accepts one)."""
    outs = []
    for device in ("cpu", DEV):
        shapes = [(65537,), (7,), (4096,)]
        ps = [_randn(s, param_dtype, seed=i).to(device) for i, s in enumerate(shapes)]
        grads = [_randn(s, grad_dtype, seed=20 + i).to(device) for i, s in enumerate(shapes)]
        masters = [p.float() for p in ps] if param_dtype != torch.float32 else []
        m = [torch.zeros(s, device=device) for s in shapes]
        v = [torch.zeros(s, device=device) for s in shapes]
        steps = [torch.zeros((), device=device) for _ in shapes]
        for _ in range(3):
            torch.ops.torchspeed.adam_step_(
                ps,
                grads,
                m,
                v,
                [],
                masters,
                steps,
                [],
                [],
                lr=1e-2,
                beta1=0.9,
                beta2=0.999,
                eps=1e-8,
                weight_decay=0.01,
                amsgrad=False,
                maximize=False,
                decoupled_weight_decay=True,
            )
        outs.append([t.cpu() for t in ps + masters + m + v + steps])
    for a, b in zip(*outs):
        if a.dtype == torch.float32:
            assert_close(b, a, **FP32)
        else:  # rounded from masters that agree to an ulp: at most one low-precision ulp apart
            assert_close(b.float(), a.float(), rtol=1e-2, atol=1e-3)


def test_mask_ema_and_clip_match_cpu_op():
    kw = dict(lr=1e-2, ema_decay=0.9, max_grad_norm=0.5)
    cpu = [
        _randn(s, torch.float32, seed=100 + i).requires_grad_() for i, s in enumerate(SHAPES[:5])
    ]
    dev = [p.detach().to(DEV, copy=True).requires_grad_() for p in cpu]
    cpu_opt, dev_opt = torchspeed.optim.AdamW(cpu, **kw), torchspeed.optim.AdamW(dev, **kw)
    mask = (torch.arange(65537) % 3 != 0).float()
    for a, b in zip(cpu, dev):  # a mask on every param (ones where no pruning)
        full = mask if a.numel() == mask.numel() else torch.ones(a.numel())
        cpu_opt.set_mask(a, full)
        dev_opt.set_mask(b, full.to(DEV))
    for step in range(10):
        for a, b, g in zip(cpu, dev, _grads(step, SHAPES[:5])):
            a.grad, b.grad = g.cpu(), g.clone()
        cpu_opt.step()
        dev_opt.step()
    for a, b in zip(cpu, dev):
        assert_close(b.detach().cpu(), a.detach(), **FP32)
        assert_close(dev_opt.state[b]["ema"].cpu(), cpu_opt.state[a]["ema"], **FP32)
    assert (dev[3].detach().cpu()[mask == 0] == 0).all()


# ---- AMP -------------------------------------------------------------------------------------------


@needs_real_cuda
@pytest.mark.parametrize("cls", ["AdamW", "SGD", "Lion", "LAMB"])
def test_full_amp_step_never_syncs(cls):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.GELU(), torch.nn.Linear(128, 64))
    model = model.to(DEV)
    kw = dict(lr=1e-3, max_grad_norm=1.0)
    if cls == "SGD":
        kw["momentum"] = 0.9
    opt = getattr(torchspeed.optim, cls)(model.parameters(), **kw)
    scaler = torch.amp.GradScaler(DEV, init_scale=2.0**8)  # no fp16 overflow in the warm-up
    xs = [torch.randn(32, 64, device=DEV) for _ in range(4)]

    def amp_step(x, inject=False):
        opt.zero_grad(set_to_none=True)
        with torch.autocast(DEV, dtype=torch.float16):
            loss = model(x).float().pow(2).mean()
        scaler.scale(loss).backward()
        if inject:
            model[0].weight.grad.view(-1)[0:1].fill_(float("inf"))  # a kernel, no host value
        scaler.step(opt)
        scaler.update()

    amp_step(xs[0])  # creates the state, the scale and the growth tracker outside the check
    torch.cuda.synchronize()
    before = [p.detach().clone() for p in model.parameters()]
    previous = torch.cuda.get_sync_debug_mode()
    torch.cuda.set_sync_debug_mode("error")
    try:
        amp_step(xs[1])
        amp_step(xs[2], inject=True)
        amp_step(xs[3])
    finally:
        torch.cuda.set_sync_debug_mode(previous)
    torch.cuda.synchronize()
    assert all(not torch.equal(a, p) for a, p in zip(before, model.parameters()))
    if cls != "SGD":
        steps = {opt.state[p]["step"].item() for p in model.parameters()}
        assert steps == {3.0}  # 4 calls, one skipped by the injected inf


@needs_real_cuda
@pytest.mark.parametrize("cls", ["AdamW", "LAMB"])
def test_step_replays_in_a_cuda_graph(cls):
    """Device-resident step/lr/scale and no host sync: the fused step can be captured once and
    replayed; the replays equal eager steps."""
    shapes = [(65537,), (33, 17), (5,)]
    eager, graphed = _params(shapes=shapes), _params(shapes=shapes)
    kw = dict(lr=torch.tensor(1e-2, device=DEV), weight_decay=0.01)
    eager_opt = getattr(torchspeed.optim, cls)(eager, **kw)
    graph_opt = getattr(torchspeed.optim, cls)(graphed, **kw)
    grads = [_grads(step, shapes) for step in range(4)]
    for a, b, g in zip(eager, graphed, grads[0]):
        a.grad, b.grad = g.clone(), g.clone()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up creates the state outside the capture
        eager_opt.step()
        graph_opt.step()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        graph_opt.step()
    for step in range(1, 4):
        for a, b, g in zip(eager, graphed, grads[step]):
            a.grad.copy_(g)
            b.grad.copy_(g)
        eager_opt.step()
        graph.replay()
    torch.cuda.synchronize()
    for a, b in zip(eager, graphed):
        assert_close(b, a, **FP32)  # LAMB's fp64 atomics may round the trust ratio differently
        assert graph_opt.state[b]["step"].item() == eager_opt.state[a]["step"].item() == 4


# ---- opcheck ---------------------------------------------------------------------------------------


def _optim_lists(n_lists, with_steps=True):
    ps = [_randn(s, torch.float32, seed=i).to(DEV) for i, s in enumerate([(10,), (3, 4), (0,)])]
    grads = [_randn(p.shape, torch.float32, seed=50 + i).to(DEV) for i, p in enumerate(ps)]
    states = [[torch.zeros_like(p) for p in ps] for _ in range(n_lists)]
    steps = [torch.zeros((), device=DEV) for _ in ps] if with_steps else None
    return ps, grads, states, steps


def _scalars():
    return dict(
        lr_tensor=torch.full((1,), 1e-3, device=DEV),
        grad_scale=torch.full((1,), 4.0, device=DEV),
        found_inf=torch.zeros((1,), device=DEV),
        clip_coef=torch.full((1,), 0.5, device=DEV),
    )


@pytest.mark.parametrize("scalars", [False, True])
def test_optim_ops_opcheck(scalars):
    extra = _scalars() if scalars else {}
    ps, grads, (m, v, vmax, ema), steps = _optim_lists(4)
    masks = [
        torch.full(((p.numel() + 7) // 8,), 255, dtype=torch.uint8, device=p.device) for p in ps
    ]
    torch.library.opcheck(
        torch.ops.torchspeed.adam_step_.default,
        (ps, grads, m, v, vmax, [], steps, masks, ema),
        dict(
            lr=1e-3,
            beta1=0.9,
            beta2=0.999,
            eps=1e-8,
            weight_decay=0.01,
            amsgrad=True,
            maximize=False,
            decoupled_weight_decay=True,
            ema_decay=0.9,
            **extra,
        ),
    )
    ps, grads, (buf,), _ = _optim_lists(1, with_steps=False)
    torch.library.opcheck(
        torch.ops.torchspeed.sgd_step_.default,
        (ps, grads, buf, [], [], []),
        dict(
            lr=1e-2,
            momentum=0.9,
            dampening=0.0,
            weight_decay=0.0,
            nesterov=True,
            maximize=False,
            first_step=False,
            **extra,
        ),
    )
    ps, grads, (m,), steps = _optim_lists(1)
    torch.library.opcheck(
        torch.ops.torchspeed.lion_step_.default,
        (ps, grads, m, [], steps, [], []),
        dict(lr=1e-4, beta1=0.9, beta2=0.99, weight_decay=0.1, maximize=False, **extra),
    )
    ps, grads, (m, v), steps = _optim_lists(2)
    torch.library.opcheck(
        torch.ops.torchspeed.lamb_step_.default,
        (ps, grads, m, v, [], steps, [], []),
        dict(lr=1e-3, beta1=0.9, beta2=0.999, eps=1e-6, weight_decay=0.01, maximize=False, **extra),
    )


def test_optim_scalars_on_device_match_cpu():
    """lr_tensor, grad_scale, clip_coef and found_inf read on the device give the CPU op's result."""
    for found in (0.0, 1.0):
        outs = []
        for device in ("cpu", DEV):
            ps = [
                _randn(s, torch.float32, seed=i).to(device) for i, s in enumerate([(70_001,), (5,)])
            ]
            grads = [
                _randn(p.shape, torch.float32, seed=9 + i).to(device) * 4 for i, p in enumerate(ps)
            ]
            m = [torch.zeros_like(p) for p in ps]
            v = [torch.zeros_like(p) for p in ps]
            steps = [torch.full((), 4.0, device=device) for _ in ps]
            sc = {k: t.to(device) for k, t in _scalars().items()}
            sc["found_inf"].fill_(found)
            torch.ops.torchspeed.adam_step_(
                ps,
                grads,
                m,
                v,
                [],
                [],
                steps,
                [],
                [],
                lr=0.5,
                beta1=0.9,
                beta2=0.999,
                eps=1e-8,
                weight_decay=0.01,
                amsgrad=False,
                maximize=False,
                decoupled_weight_decay=True,
                **sc,
            )
            outs.append([t.cpu() for t in ps + m + v + steps])
        for a, b in zip(*outs):
            assert_close(b, a, **FP32)
        assert outs[1][-1].item() == (4.0 if found else 5.0)


def test_cuda_op_rejects_mixed_devices():
    if _ON_CPU:
        pytest.skip("needs a CUDA device (CPU dry run)")
    p = torch.zeros(4, device=DEV)
    with pytest.raises(RuntimeError, match="torchspeed.grad_stats: tensors\\[1\\] must be on"):
        torch.ops.torchspeed.grad_stats([p, torch.zeros(4)], False)
    with pytest.raises(RuntimeError, match="adam_step_: grads\\[0\\] must be on"):
        torch.ops.torchspeed.adam_step_(
            [p],
            [torch.zeros(4)],
            [torch.zeros_like(p)],
            [torch.zeros_like(p)],
            [],
            [],
            [torch.zeros((), device=DEV)],
            [],
            [],
            lr=1e-3,
            beta1=0.9,
            beta2=0.999,
            eps=1e-8,
            weight_decay=0.0,
            amsgrad=False,
            maximize=False,
            decoupled_weight_decay=True,
        )


def test_cpu_lr_tensor_with_device_params_matches_float_lr():
    # torch.optim accepts a CPU tensor lr for CUDA params; the step moves it to the device.
    p1 = _randn((1000,), torch.float32, seed=1).to(DEV)
    p2 = p1.clone()
    o1 = torchspeed.optim.AdamW([p1], lr=torch.tensor(0.01))
    o2 = torchspeed.optim.AdamW([p2], lr=0.01)
    for s in range(3):
        g = _randn((1000,), torch.float32, seed=10 + s).to(DEV)
        p1.grad, p2.grad = g.clone(), g.clone()
        o1.step()
        o2.step()
    assert_close(p1, p2, **FP32)
