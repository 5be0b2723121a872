"""torchspeed.quant's int8 Linear: every int8 path (scalar, avx2, avx512, avx512_vnni, amx; the
`int8_path` fixture forces each, skipping with the reason where this CPU lacks it) against an
int64 reference of the exact int32 accumulation and torch's fp32 formula for the row quantization
and the epilogue, bit for bit; the Int8Linear module's accuracy (vs fp32 and torch.ao's dynamic
quantization), quantize_dynamic on a small trained MLP, state_dict, opcheck and bad inputs."""

import io

import pytest
import torch
from support import cuda_skip_reason
from torch import nn

import torchspeed  # noqa: F401  (loads the ops)
from torchspeed import quant
from torchspeed.quant.linear import quantize_weight


def reference(x, w_q, w_scale, bias=None, relu=False):
    """torch's formula: per-row scale = absmax / 127 (1 for a zero row, NaN for a non-finite one),
    q = clamp(round_half_even(x * (1 / scale)), -127, 127), acc in int64, epilogue in fp32."""
    k = x.shape[-1]
    xf = x.float().reshape(-1, k)
    absmax = xf.abs().amax(dim=1)
    scale = torch.where(absmax == 0, torch.ones_like(absmax), absmax / 127.0)
    scale = torch.where(torch.isfinite(xf).all(dim=1), scale, torch.full_like(scale, float("nan")))
    q = torch.clamp(torch.round(xf * (1.0 / scale)[:, None]), -127, 127)
    q = torch.nan_to_num(q).to(torch.int64)
    acc = q @ w_q.to(torch.int64).T
    y = acc.to(torch.float32) * (scale[:, None] * w_scale[None, :])
    if bias is not None:
        y = y + bias
    if relu:
        y = torch.where(y < 0, torch.zeros_like(y), y)
    return y.to(x.dtype).reshape(*x.shape[:-1], w_q.shape[0]), acc


def run(x, w_q, w_scale, bias=None, relu=False):
    return quant.int8_linear(x, quant.int8_pack_weight(w_q), w_scale, bias, relu)


def rand_int8(*shape, gen):
    return torch.randint(-127, 128, shape, generator=gen, dtype=torch.int8)


def assert_bitwise(out, ref):
    torch.testing.assert_close(out, ref, rtol=0, atol=0, equal_nan=True)


# ---- exactness, on every int8 path ------------------------------------------------------------


@pytest.mark.parametrize(
    "m,n,k",
    [
        (1, 1, 1),
        (1, 17, 3),
        (3, 33, 65),
        (5, 1, 130),
        (7, 49, 257),
        (37, 97, 200),
        (48, 35, 129),
        (17, 16, 64),
        (70, 130, 300),
        (130, 1000, 72),  # several column blocks, the last one partial
    ],
)
def test_matches_int64_reference_bitwise(int8_path, m, n, k):
    gen = torch.Generator().manual_seed(m * 1000 + n * 10 + k)
    x = torch.randn(m, k, generator=gen) * 3
    w = rand_int8(n, k, gen=gen)
    w_scale = torch.rand(n, generator=gen) * 0.01 + 1e-3
    bias = torch.randn(n, generator=gen)
    for b, relu in ((None, False), (bias, True), (bias, False)):
        ref, _ = reference(x, w, w_scale, b, relu)
        assert_bitwise(run(x, w, w_scale, b, relu), ref)


def test_integer_rows_give_the_exact_int32_sums(int8_path):
    # Rows holding 127 quantize with scale 1 (q = x exactly), w_scale 1: out = float(acc).
    gen = torch.Generator().manual_seed(3)
    m, n, k = 9, 40, 1000
    q = rand_int8(m, k, gen=gen)
    q[:, 0] = 127
    w = rand_int8(n, k, gen=gen)
    out = run(q.float(), w, torch.ones(n))
    acc = q.long() @ w.long().T
    assert acc.abs().max() < 2**24  # every sum exactly representable in fp32
    assert torch.equal(out, acc.float())


@pytest.mark.parametrize("k", [4, 63, 64, 1000, 4096 + 3])
def test_extreme_values_never_saturate(int8_path, k):
    # |pair sums| of 2 * 127 * 127 (and the u8 offset on VNNI) in every sign pattern: the naive
    # vpmaddubsw (a + 128) x w would saturate at 32767 on these.
    n = 19
    pats = {
        "all_max": torch.full((k,), 127),
        "all_min": torch.full((k,), -127),
        "alternate": torch.tensor([127, -127]).repeat(k // 2 + 1)[:k],
        "pairs": torch.tensor([127, 127, -127, -127]).repeat(k // 4 + 1)[:k],
        "sparse": torch.where(torch.arange(k) % 5 == 0, 127, 0),
    }
    a = torch.stack(list(pats.values())).to(torch.int8)
    w = torch.stack([pats[p] for p in pats] * 4)[:n].to(torch.int8)
    w[-1] = 127
    w[-2] = -127
    out = run(a.float(), w, torch.ones(n))
    acc = a.long() @ w.long().T
    assert torch.equal(out, acc.float())
    assert out.abs().max() >= 127 * 127 * (k // 2)


def test_k_65536(int8_path):
    gen = torch.Generator().manual_seed(5)
    k = 65536
    a = rand_int8(2, k, gen=gen)
    a[:, 0] = 127
    w = torch.stack([rand_int8(k, gen=gen), torch.full((k,), 127), torch.full((k,), -127)]).to(
        torch.int8
    )
    a[1] = 127  # row 1 x the constant channels: +-127 * 127 * 65536 (exact in fp32)
    out = run(a.float(), w, torch.ones(3))
    acc = a.long() @ w.long().T
    assert torch.equal(out, acc.float())
    assert out[1, 1] == 127 * 127 * 65536 and out[1, 2] == -127 * 127 * 65536


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_inputs_and_outputs_round_once(int8_path, dtype):
    gen = torch.Generator().manual_seed(7)
    # 36 rows: the AMX tiles (32 rows, full and partial 32-column blocks) and the VNNI tail rows
    x = (torch.randn(3, 12, 77, generator=gen) * 4).to(dtype)
    w = rand_int8(45, 77, gen=gen)
    w_scale = torch.rand(45, generator=gen) * 0.05
    bias = torch.randn(45, generator=gen)
    for b, relu in ((bias, True), (None, False)):
        out = run(x, w, w_scale, b, relu)
        assert out.dtype == dtype and out.shape == (3, 12, 45)
        assert_bitwise(out, reference(x, w, w_scale, b, relu)[0])


def test_zero_and_nonfinite_rows(int8_path):
    gen = torch.Generator().manual_seed(8)
    x = torch.randn(6, 70, generator=gen)
    x[1] = 0  # scale 1, output = bias
    x[2, 5] = float("nan")
    x[3, 0] = float("inf")
    x[4, 69] = -float("inf")
    w = rand_int8(20, 70, gen=gen)
    bias = torch.randn(20, generator=gen)
    out = run(x, w, torch.full((20,), 0.01), bias, True)
    assert torch.isnan(out[2:5]).all()
    assert torch.isfinite(out[[0, 1, 5]]).all()
    assert_bitwise(out, reference(x, w, torch.full((20,), 0.01), bias, True)[0])
    assert torch.equal(out[1], torch.where(bias < 0, 0, bias))


def test_rounding_ties_and_clamp(int8_path):
    # x * (1 / scale) lands on .5 ties and on +-127 exactly; round half to even, like torch.round.
    x = torch.tensor([[127.0, 0.5, 1.5, 2.5, -0.5, -1.5, -126.5, 126.5, -127.0]])
    w = torch.eye(9, dtype=torch.int8)
    out = run(x, w, torch.ones(9))
    assert out.tolist() == [[127.0, 0.0, 2.0, 2.0, 0.0, -2.0, -126.0, 126.0, -127.0]]


def test_threads_do_not_change_results(int8_path):
    gen = torch.Generator().manual_seed(9)
    x = torch.randn(300, 256, generator=gen)
    w = rand_int8(200, 256, gen=gen)
    s = torch.rand(200, generator=gen)
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = run(x, w, s)
    finally:
        torch.set_num_threads(before)
    assert torch.equal(one, run(x, w, s))
    assert_bitwise(one, reference(x, w, s)[0])


# ---- the module -----------------------------------------------------------------------------


def rel_err(y, ref):
    return ((y.float() - ref).norm() / ref.norm()).item()


def test_int8linear_accuracy_vs_fp32_and_torch_ao(int8_path):
    torch.manual_seed(0)
    lin = nn.Linear(512, 384)
    x = torch.randn(64, 512)
    with torch.no_grad():
        ref = lin(x)
        ours = quant.Int8Linear.from_float(lin)(x)
        ao = torch.ao.quantization.quantize_dynamic(
            nn.Sequential(lin), {nn.Linear}, dtype=torch.qint8
        )(x)
    e_ours, e_ao = rel_err(ours, ref), rel_err(ao, ref)
    assert e_ours <= 0.02, e_ours
    assert e_ours <= e_ao, (e_ours, e_ao)


def test_int8linear_module_api(int8_path):
    torch.manual_seed(1)
    lin = nn.Linear(40, 24)
    m = quant.Int8Linear.from_float(lin, relu=True)
    assert f"int8_path={int8_path}" in repr(m)
    x = torch.randn(3, 7, 40)
    with torch.no_grad():
        y = m(x)
    q, s = quantize_weight(lin.weight)
    assert torch.equal(m.weight, q) and torch.equal(m.weight_scale, s)
    assert_bitwise(y, reference(x, q, s, lin.bias.detach(), True)[0])
    # state_dict: the plain int8 weight, its scale and the bias; no packed buffer
    sd = m.state_dict()
    assert sorted(sd) == ["bias", "weight", "weight_scale"]
    assert sd["weight"].dtype == torch.int8 and sd["weight"].shape == (24, 40)
    buf = io.BytesIO()
    torch.save(sd, buf)
    buf.seek(0)
    m2 = quant.Int8Linear(40, 24, relu=True)
    m2.load_state_dict(torch.load(buf))
    with torch.no_grad():
        assert torch.equal(m2(x), y)
    # gradients: inference only, a clear error
    with pytest.raises(RuntimeError, match="inference-only"):
        m(x.requires_grad_())
    with torch.no_grad():
        assert torch.equal(m(x), y)
    # model.half() keeps the fp32 scale and bias; an empty batch gives an empty result
    half = quant.Int8Linear.from_float(lin).half()
    assert half.weight_scale.dtype == torch.float32 and half.bias.dtype == torch.float32
    with torch.no_grad():
        assert half(x.half()).dtype == torch.float16
        assert m(torch.randn(0, 40)).shape == (0, 24)
    no_bias = quant.Int8Linear.from_float(nn.Linear(40, 5, bias=False))
    with torch.inference_mode():
        assert no_bias(x).shape == (3, 7, 5)


def test_packed_cache_follows_the_path(monkeypatch):
    from support import runnable_isas

    lin = nn.Linear(64, 32)
    m = quant.Int8Linear.from_float(lin)
    x = torch.randn(4, 64)
    outs = {}
    for isa in runnable_isas():
        monkeypatch.setenv("TORCHSPEED_CPU_ISA", isa)
        with torch.no_grad():
            outs[isa] = m(x)  # repacks when the path changes
    assert all(torch.equal(o, outs["scalar"]) for o in outs.values())


def make_task(n, gen):
    # A learnable synthetic task: 4 classes, the argmax of a random teacher on 16
    # features through a tanh layer (nonlinear; a small MLP learns it to about 85%).
    t1 = torch.randn(16, 32, generator=gen)
    t2 = torch.randn(32, 4, generator=gen)
    x = torch.randn(n, 16, generator=gen)
    y = (torch.tanh(x @ t1 / 4) @ t2).argmax(dim=1)
    return x, y


def test_quantize_dynamic_on_a_trained_mlp_costs_under_one_point():
    gen = torch.Generator().manual_seed(0)
    torch.manual_seed(0)
    x, y = make_task(6000, gen)
    xt, yt = x[:4000], y[:4000]
    xv, yv = x[4000:], y[4000:]
    model = nn.Sequential(
        nn.Linear(16, 64),
        nn.ReLU(),
        nn.Sequential(nn.Linear(64, 64), nn.ReLU()),
        nn.Linear(64, 4),
    )
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # a tiny model: threads only add overhead
    try:
        for _ in range(10):
            for i in range(0, 4000, 200):
                opt.zero_grad()
                nn.functional.cross_entropy(model(xt[i : i + 200]), yt[i : i + 200]).backward()
                opt.step()
    finally:
        torch.set_num_threads(threads)
    with torch.no_grad():
        acc_fp32 = (model(xv).argmax(1) == yv).float().mean().item()
        qmodel = quant.quantize_dynamic(model)
        acc_int8 = (qmodel(xv).argmax(1) == yv).float().mean().item()
    assert acc_fp32 > 0.8, acc_fp32  # the task was learnt (chance: about 0.25)
    assert acc_int8 >= acc_fp32 - 0.01, (acc_fp32, acc_int8)
    assert type(model[0]) is nn.Linear  # not in place
    assert sum(isinstance(mod, quant.Int8Linear) for mod in qmodel.modules()) == 3
    # modules_to_not_convert and names, nested, inplace
    q2 = quant.quantize_dynamic(model, modules_to_not_convert=["2"])
    assert isinstance(q2[0], quant.Int8Linear) and type(q2[2][0]) is nn.Linear
    q3 = quant.quantize_dynamic(model, qconfig_spec={"2"})
    assert type(q3[0]) is nn.Linear and isinstance(q3[2][0], quant.Int8Linear)
    q4 = quant.quantize_dynamic(model, inplace=True)
    assert q4 is model and isinstance(model[3], quant.Int8Linear)
    with pytest.raises(ValueError, match="only dtype=torch.qint8"):
        quant.quantize_dynamic(model, dtype=torch.float16)


def test_quantize_dynamic_skips_attention_projections():
    mha = nn.MultiheadAttention(16, 2)
    wrapper = nn.ModuleDict({"attn": mha, "head": nn.Linear(16, 4)})
    q = quant.quantize_dynamic(wrapper)
    assert isinstance(q["head"], quant.Int8Linear)
    assert not isinstance(q["attn"].out_proj, quant.Int8Linear)


# ---- ops: opcheck, bad input ------------------------------------------------------------------


def test_opcheck(int8_path):
    gen = torch.Generator().manual_seed(11)
    w = rand_int8(20, 70, gen=gen)
    torch.library.opcheck(torch.ops.torchspeed.int8_pack_weight.default, (w,))
    packed = quant.int8_pack_weight(w)
    x = torch.randn(3, 70, generator=gen)
    s = torch.rand(20, generator=gen)
    b = torch.randn(20, generator=gen)
    torch.library.opcheck(torch.ops.torchspeed.int8_linear.default, (x, packed, s, b, True))
    torch.library.opcheck(torch.ops.torchspeed.int8_linear.default, (x, packed, s, None, False))


def test_bad_inputs_raise_clearly(monkeypatch):
    from support import runnable_isas

    w = torch.randint(-127, 128, (8, 16), dtype=torch.int8)
    packed = quant.int8_pack_weight(w)
    x, s = torch.randn(2, 16), torch.ones(8)
    op = quant.int8_linear
    with pytest.raises(RuntimeError, match="w must be a dense int8 tensor, got Float"):
        quant.int8_pack_weight(w.float())
    with pytest.raises(RuntimeError, match=r"w must be in \[-127, 127\].*-128 at \[1, 2\]"):
        bad = w.clone()
        bad[1, 2] = -128
        quant.int8_pack_weight(bad)
    with pytest.raises(RuntimeError, match="w must be contiguous"):
        quant.int8_pack_weight(torch.randint(-1, 2, (16, 8), dtype=torch.int8).T)
    with pytest.raises(RuntimeError, match=r"w must be \[N, K\]"):
        quant.int8_pack_weight(w.reshape(-1))
    with pytest.raises(RuntimeError, match="x must be float32, bfloat16 or float16, got Double"):
        op(x.double(), packed, s)
    with pytest.raises(RuntimeError, match="x must be contiguous"):
        op(torch.randn(16, 2).T, packed, s)
    with pytest.raises(
        RuntimeError, match=r"packed for N = 8, K = 16, got N = 8 \(w_scale\), K = 17"
    ):
        op(torch.randn(2, 17), packed, s)  # K mismatch, same padded size: the header tells
    with pytest.raises(RuntimeError, match="packed_w must be int8_pack_weight's result for N = 8"):
        op(torch.randn(2, 100), packed, s)  # K mismatch
    with pytest.raises(RuntimeError, match="packed for N = 8, K = 16, got N = 9"):
        op(x, packed, torch.ones(9))  # N mismatch
    with pytest.raises(RuntimeError, match="packed_w must be int8_pack_weight's result for N = 17"):
        op(x, packed, torch.ones(17))
    with pytest.raises(RuntimeError, match="w_scale must be a contiguous float32"):
        op(x, packed, s.double())
    with pytest.raises(RuntimeError, match="bias must be a contiguous float32 \\[8\\]"):
        op(x, packed, s, torch.ones(7))
    with pytest.raises(RuntimeError, match="on CPU packed_w must be int8_pack_weight's uint8"):
        op(x, w, s)
    corrupt = packed.clone()
    corrupt[0] ^= 1
    with pytest.raises(RuntimeError, match="bad header"):
        op(x, corrupt, s)
    isas = runnable_isas()
    if len(isas) > 1:
        monkeypatch.setenv("TORCHSPEED_CPU_ISA", "scalar")
        scalar_packed = quant.int8_pack_weight(w)
        monkeypatch.setenv("TORCHSPEED_CPU_ISA", isas[-1])
        with pytest.raises(RuntimeError, match="packed for the int8 path 'scalar' but the current"):
            op(x, scalar_packed, s)
    with pytest.raises(RuntimeError, match="inference-only"):
        quant.Int8Linear(16, 8)(x.requires_grad_())


def test_info_names_the_int8_path():
    from torchspeed import info

    data = info.collect()
    assert data["int8_path"].split(" ")[0] in ("scalar", "avx2", "avx512", "avx512_vnni", "amx")


# ---- CUDA -------------------------------------------------------------------------------------


def test_cuda_int8_linear_matches_cpu_bitwise():
    reason = cuda_skip_reason()
    if reason:
        pytest.skip(reason)
    gen = torch.Generator().manual_seed(12)
    for m, n, k in [(1, 1, 1), (37, 97, 200), (256, 512, 1024)]:
        x = torch.randn(m, k, generator=gen)
        w = rand_int8(n, k, gen=gen)
        s = torch.rand(n, generator=gen) * 0.01
        b = torch.randn(n, generator=gen)
        for dtype in (torch.float32, torch.bfloat16):
            xd = x.to(dtype)
            ref, _ = reference(xd, w, s, b, True)
            out = quant.int8_linear(xd.cuda(), w.cuda(), s.cuda(), b.cuda(), True)
            assert_bitwise(out.cpu(), ref)
    lin = nn.Linear(64, 32).cuda()
    with torch.no_grad():
        y = quant.Int8Linear.from_float(lin)(torch.randn(5, 64, device="cuda"))
    assert y.device.type == "cuda" and y.shape == (5, 32)


def test_amx_refused_falls_back_to_vnni():
    # A child process whose AMX tile permission is refused (the test hook of dispatch.cpp): the
    # best level is avx512_vnni, info says why, forcing amx fails clearly, results are unchanged.
    import os
    import subprocess
    import sys
    import tempfile

    from support import runnable_isas

    if "amx" not in runnable_isas():
        pytest.skip("needs a CPU (and build) that runs the amx path")
    code = (
        "import os, torch, torchspeed\n"
        "from torchspeed import _C, info, quant\n"
        "assert _C.cpu_isa_detected() == 'avx512_vnni', _C.cpu_isa_detected()\n"
        "assert _C.cpu_int8_path() == 'avx512_vnni'\n"
        "assert 'refused' in _C.cpu_amx_status()\n"
        "assert info.collect()['int8_path'].startswith('avx512_vnni (no amx: ')\n"
        "torch.manual_seed(0)\n"
        "x = torch.randn(40, 64); w = torch.randint(-127, 128, (20, 64), dtype=torch.int8)\n"
        "y = quant.int8_linear(x, quant.int8_pack_weight(w), torch.ones(20))\n"
        "torch.save(y, os.environ['OUT'])\n"
        "os.environ['TORCHSPEED_CPU_ISA'] = 'amx'\n"
        "try:\n"
        "    _C.cpu_isa()\n"
        "    raise SystemExit('forcing amx did not fail')\n"
        "except RuntimeError as e:\n"
        "    assert 'supports at most avx512_vnni' in str(e) and 'refused' in str(e), e\n"
    )
    with tempfile.TemporaryDirectory() as d:
        out = os.path.join(d, "y.pt")
        env = dict(os.environ, TORCHSPEED_TEST_DENY_AMX="1", OUT=out)
        env.pop("TORCHSPEED_CPU_ISA", None)
        r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
        assert r.returncode == 0, r.stdout + r.stderr
        y = torch.load(out)
    torch.manual_seed(0)
    x = torch.randn(40, 64)
    w = torch.randint(-127, 128, (20, 64), dtype=torch.int8)
    assert_bitwise(y, reference(x, w, torch.ones(20))[0])


def test_adversarial_module_cases():
    """Defects an adversarial run found: each now gets a correct result or a clear error."""
    torch.manual_seed(0)
    x = torch.randn(5, 40)
    # A weight edited through .data (no version bump) is picked up after repack().
    m = quant.Int8Linear.from_float(nn.Linear(40, 24))
    with torch.no_grad():
        m(x)
        m.weight.data.zero_()
        m.repack()
        torch.testing.assert_close(m(x), m.bias.expand(5, 24), rtol=0, atol=0)
    # A Linear registered twice is converted in both places, to one module.
    lin = nn.Linear(8, 8)
    q = quant.quantize_dynamic(nn.Sequential(lin, lin))
    assert isinstance(q[0], quant.Int8Linear) and q[0] is q[1]
    # A string names one module (not its characters).
    net = nn.Sequential()
    net.add_module("body", nn.Linear(8, 8))
    net.add_module("head", nn.Linear(8, 2))
    q = quant.quantize_dynamic(net, modules_to_not_convert="head")
    assert isinstance(q.body, quant.Int8Linear) and type(q.head) is nn.Linear
    q = quant.quantize_dynamic(net, qconfig_spec="head")
    assert type(q.body) is nn.Linear and isinstance(q.head, quant.Int8Linear)
    # Empty layers are refused at conversion, naming the size.
    for shape in ((0, 4), (4, 0)):
        with pytest.raises(ValueError, match="features must be >= 1"):
            quant.Int8Linear.from_float(nn.Linear(*shape))


def test_torch_compile_fullgraph():
    m = quant.Int8Linear.from_float(nn.Linear(40, 24))
    x = torch.randn(3, 40)
    with torch.no_grad():
        want = m(x)
        got = torch.compile(m, fullgraph=True, backend="eager")(x)
    torch.testing.assert_close(got, want, rtol=0, atol=0)


# ---- issue 23: bad inputs (each test failed before its fix) -------------------------------------
def _unchanged(m, before):
    after = m.state_dict()
    assert after.keys() == before.keys()
    for k, v in before.items():
        assert torch.equal(after[k], v), k


@pytest.mark.parametrize("strict", [True, False])
def test_load_float_linear_state_dict_is_refused_before_any_change(strict):
    torch.manual_seed(0)
    lin = nn.Linear(16, 8)
    m = quant.Int8Linear.from_float(nn.Linear(16, 8))
    before = {k: v.clone() for k, v in m.state_dict().items()}
    with pytest.raises(RuntimeError, match=r"float weight \(torch.float32\).*from_float"):
        m.load_state_dict(lin.state_dict(), strict=strict)
    _unchanged(m, before)
    # nested in a model too: the layer is left as it was
    net = nn.Sequential(quant.Int8Linear.from_float(nn.Linear(16, 8)))
    nbefore = {k: v.clone() for k, v in net.state_dict().items()}
    with pytest.raises(RuntimeError, match="from_float"):
        net.load_state_dict(nn.Sequential(lin).state_dict(), strict=strict)
    _unchanged(net, nbefore)


def test_load_state_dict_with_wrong_dtype_shape_or_values_is_refused():
    m = quant.Int8Linear.from_float(nn.Linear(16, 8))
    before = {k: v.clone() for k, v in m.state_dict().items()}
    good = quant.Int8Linear.from_float(nn.Linear(16, 8)).state_dict()
    cases = [
        ("weight", good["weight"][:4], r"'weight'\] must be torch.int8 of shape \[8, 16\]"),
        ("weight_scale", good["weight_scale"].double(), r"'weight_scale'\] must be torch.float32"),
        ("bias", good["bias"][:3], r"'bias'\] must be torch.float32 of shape \[8\]"),
        ("weight", torch.full((8, 16), -128, dtype=torch.int8), r"\[-127, 127\]"),
    ]
    for key, value, match in cases:
        for strict in (True, False):
            with pytest.raises(RuntimeError, match=match):
                m.load_state_dict({**good, key: value}, strict=strict)
            _unchanged(m, before)
    m.load_state_dict(good)
    assert torch.equal(m.weight, good["weight"])


def test_quantize_dynamic_rejects_a_non_module():
    for bad in ("not a model", None, [nn.Linear(2, 2)]):
        with pytest.raises(TypeError, match="quantize_dynamic: model must be an nn.Module"):
            quant.quantize_dynamic(bad)
    with pytest.raises(TypeError, match="inplace must be a bool"):
        quant.quantize_dynamic(nn.Sequential(nn.Linear(2, 2)), inplace="yes")


def test_inf_row_gives_nan_row_and_leaves_the_others(int8_path):
    """Documented in docs/QUANT.md: a row holding inf gives a NaN row (a float nn.Linear gives
    +-inf there); the other rows are the same bits as without it."""
    torch.manual_seed(0)
    lin = nn.Linear(32, 6)
    m = quant.Int8Linear.from_float(lin)
    x = torch.randn(4, 32)
    bad = x.clone()
    bad[1, 3] = float("inf")
    bad[2, 0] = -float("inf")
    with torch.no_grad():
        clean, out, ref = m(x), m(bad), lin(bad)
    assert torch.isnan(out[1:3]).all()
    assert torch.isinf(ref[1:3]).all()  # what the float layer gives instead
    assert torch.equal(out[[0, 3]], clean[[0, 3]])


def test_adversarial_pass_types_and_non_finite_weights():
    """Adversarial pass (issue 23): a NaN weight gave a NaN scale (every output NaN), a list x
    raised AttributeError, relu=1 went through, and modules_to_not_convert=5 raised Python's
    own 'int' object is not iterable."""
    bad = nn.Linear(8, 4)
    with torch.no_grad():
        bad.weight[1, 2] = float("nan")
    with pytest.raises(ValueError, match="from_float: linear.weight must be finite"):
        quant.Int8Linear.from_float(bad)
    m = quant.Int8Linear.from_float(nn.Linear(8, 4))
    with pytest.raises(TypeError, match="Int8Linear: x must be a tensor, got list"):
        m([[0.0] * 8])
    packed = quant.int8_pack_weight(m.weight)
    with pytest.raises(TypeError, match="int8_linear: relu must be a bool, got 1"):
        quant.int8_linear(torch.randn(2, 8), packed, m.weight_scale, None, 1)
    net = nn.Sequential(nn.Linear(8, 8), nn.Linear(8, 2))
    with pytest.raises(TypeError, match="modules_to_not_convert must be qualified module names"):
        quant.quantize_dynamic(net, modules_to_not_convert=5)
    q = quant.quantize_dynamic(net, modules_to_not_convert=(n for n in ["1"]))
    assert isinstance(q[0], quant.Int8Linear) and type(q[1]) is nn.Linear
