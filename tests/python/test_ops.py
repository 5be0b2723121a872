"""torchspeed.ops.grad_stats against a float64 reference on every device (each CPU ISA, and CUDA),
opcheck, and bad input."""

import pytest
import torch
from torch.testing import assert_close

import torchspeed
from torchspeed.ops import grad_stats

SIZES = [0, 1, 15, 16, 17, 255, 4097, 65537, 200_003]


def sample_inputs(dtype, seed=0, device="cpu"):
    g = torch.Generator().manual_seed(seed)
    ts = [torch.randn(n, generator=g).to(dtype).to(device) for n in SIZES]
    ts.append(torch.randn(37, 19, generator=g).to(dtype).to(device).t())  # non-contiguous
    return ts


def reference(ts, inv_scale=None):
    xs = [t.double().cpu() * (inv_scale if inv_scale is not None else 1.0) for t in ts]
    per = torch.stack([x.pow(2).sum().sqrt() for x in xs])
    return per.pow(2).sum().sqrt(), per


# float32 accumulation per lane, float64 across chunks: 1e-6 relative is the stated tolerance.
TOL = dict(rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16, torch.float16])
def test_grad_stats_matches_float64_reference(device, dtype):
    ts = sample_inputs(dtype, device=device)
    total, per = reference(ts)
    out = grad_stats(ts, per_tensor=True)
    assert out.total_norm.dtype == torch.float32 and out.total_norm.dim() == 0
    assert out.total_norm.device.type == device
    assert_close(out.total_norm.double().cpu(), total, **TOL)
    assert_close(out.per_tensor_norms.double().cpu(), per, **TOL)
    assert out.found_inf.item() == 0.0
    assert grad_stats(ts).per_tensor_norms.shape == (0,)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_grad_stats_unscale_matches_torch_amp_unscale(device, dtype):
    ts = sample_inputs(dtype, seed=1, device=device)
    expected = [t.clone() for t in ts]
    inv = torch.full((1,), 1 / 1024.0, device=device)
    found = torch.zeros(1, device=device)
    torch._amp_foreach_non_finite_check_and_unscale_(expected, found, inv)
    total, per = reference(ts, inv_scale=1 / 1024.0)
    out = grad_stats(ts, inv_scale=inv, per_tensor=True)
    for a, b in zip(ts, expected):
        assert torch.equal(a, b)  # same rounding as torch's unscale
    assert_close(out.total_norm.double().cpu(), total, **TOL)
    assert_close(out.per_tensor_norms.double().cpu(), per, **TOL)
    assert out.found_inf.item() == found.item() == 0.0


@pytest.mark.parametrize("bad", [float("inf"), float("-inf"), float("nan")])
@pytest.mark.parametrize("where", [0, 17, 4096, 65536])
def test_grad_stats_flags_non_finite(device, bad, where):
    ts = [torch.ones(5, device=device), torch.ones(70_000, device=device)]
    ts[1][where] = bad
    assert grad_stats(ts).found_inf.item() == 1.0
    # The unscale still happens (as torch's), and the flag comes from the pre-unscale value.
    out = grad_stats(ts, inv_scale=torch.full((1,), 0.5, device=device))
    assert out.found_inf.item() == 1.0
    assert ts[0][0].item() == 0.5


def test_grad_stats_result_independent_of_thread_count():
    ts = sample_inputs(torch.float32, seed=2)
    old = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = grad_stats(ts, per_tensor=True)
        torch.set_num_threads(max(2, old))
        many = grad_stats(ts, per_tensor=True)
    finally:
        torch.set_num_threads(old)
    assert torch.equal(one.total_norm, many.total_norm)
    assert torch.equal(one.per_tensor_norms, many.per_tensor_norms)


def test_grad_stats_opcheck(device):
    ts = [torch.randn(100, device=device), torch.randn(3, 7, device=device), torch.randn(0)]
    ts[2] = ts[2].to(device)
    torch.library.opcheck(torch.ops.torchspeed.grad_stats.default, (ts, True))
    torch.library.opcheck(
        torch.ops.torchspeed.grad_stats_unscale_.default,
        ([t.clone() for t in ts], torch.ones(1, device=device) * 0.5, False),
    )


def test_grad_stats_meta_shapes():
    ts = [torch.empty(10, device="meta"), torch.empty(3, 4, device="meta")]
    out = grad_stats(ts, per_tensor=True)
    assert out.total_norm.shape == () and out.per_tensor_norms.shape == (2,)


@pytest.mark.parametrize(
    "tensors, message",
    [
        (
            [torch.ones(3), torch.ones(3, dtype=torch.int64)],
            r"tensors\[1\] must be float32, float64, bfloat16 or float16, got Long",
        ),
        (
            [torch.ones(3), torch.ones(3).to_sparse()],
            r"tensors\[1\] must be a dense \(strided\) tensor",
        ),
        (
            [torch.ones(3), torch.ones(3, device="meta")],
            r"tensors\[1\] must be on cpu like tensors\[0\], got meta",
        ),
    ],
)
def test_grad_stats_bad_input_changes_nothing(tensors, message):
    snapshot = [
        t.clone() if t.device.type == "cpu" and t.layout == torch.strided else None for t in tensors
    ]
    with pytest.raises(RuntimeError, match=message):
        grad_stats(tensors, inv_scale=torch.full((1,), 0.5))
    for t, s in zip(tensors, snapshot):
        if s is not None:
            assert torch.equal(t, s)


def test_bad_inv_scale_and_bad_isa(monkeypatch):
    t = torch.ones(4)
    with pytest.raises(
        RuntimeError, match="inv_scale must be a one-element float32 tensor, got Double"
    ):
        grad_stats([t], inv_scale=torch.ones(1, dtype=torch.float64))
    assert torch.equal(t, torch.ones(4))
    monkeypatch.setenv("TORCHSPEED_CPU_ISA", "sse9")
    with pytest.raises(
        RuntimeError,
        match=(
            "TORCHSPEED_CPU_ISA must be one of auto, scalar, avx2, avx512, avx512_vnni, amx, "
            "got 'sse9'"
        ),
    ):
        grad_stats([t])


def test_cpp_entry_point_and_info():
    from torchspeed import info

    data = info.collect()
    assert data["torch_built_against"] == torch.__version__
    assert data["cpu_isa_selected"] in data["cpu_isas_compiled"]
    assert torchspeed._C.version() == torchspeed.__version__


def test_info_features_tell_the_truth():
    from torchspeed import _C, info

    features = info.collect()["features"]
    has_data = hasattr(_C, "data")
    assert "optim" in features and hasattr(_C, "optim")  # the optimizer area is always built
    assert ("data" in features) == has_data
    assert ("jpeg" in features) == (has_data and _C.data.with_jpeg)
    # at::parallel_for only runs in parallel in code built with OpenMP when torch uses OpenMP.
    if "OpenMP" in torch.__config__.parallel_info():
        assert "openmp" in features
