"""torchspeed.quant: int8 quantize / dequantize on every device (each CPU ISA, CUDA) against
torch's reference formula bit for bit, the round trip within scale / 2, saturation at the int8
extremes, odd shapes, bf16/fp16 inputs, opcheck, bad input, and min-max qparams."""

from __future__ import annotations

import pytest
import torch

from torchspeed.quant import choose_qparams, dequantize_int8, quantize_int8

pytestmark = pytest.mark.skipif(
    not hasattr(torch.ops.torchspeed, "quantize_int8"), reason="built without the quant area"
)


def reference_quantize(x, scale, zp, cols):
    """torchao's quantize_affine formula on x.float(), scale broadcast by the granularity rule."""
    rows = x.numel() // cols
    v = x.float().reshape(rows, cols)
    if scale.numel() == 1:
        s, z = scale.reshape(1, 1), zp.reshape(1, 1)
    elif scale.dim() == 1:
        s, z = scale.reshape(rows, 1), zp.reshape(rows, 1)
    else:
        g = scale.shape[1]
        s = scale.repeat_interleave(cols // g, dim=1)
        z = zp.repeat_interleave(cols // g, dim=1)
    q = torch.clamp(torch.round(v * (1.0 / s)) + z, -128, 127).to(torch.int8)
    return q.reshape(x.shape), ((q.float() - z) * s).reshape(x.shape)


CASES = [  # (shape, granularity, group_size)
    ((1, 1), "per_tensor", None),
    ((7,), "per_tensor", None),
    ((3, 33), "per_channel", None),
    ((1, 4096), "per_channel", None),
    ((64, 70001 // 7), "per_tensor", None),  # 64 x 10001: chunks, tails
    ((5, 96), "per_group", 32),
    ((2, 3, 64), "per_group", 16),
    ((17, 128), "per_group", 128),
]


@pytest.mark.parametrize("shape,granularity,group", CASES, ids=lambda c: str(c))
@pytest.mark.parametrize("symmetric", [True, False], ids=["sym", "asym"])
@pytest.mark.parametrize(
    "dtype", [torch.float32, torch.bfloat16, torch.float16], ids=["fp32", "bf16", "fp16"]
)
def test_quantize_matches_torch_bit_for_bit_and_round_trips(
    device, shape, granularity, group, symmetric, dtype
):
    g = torch.Generator().manual_seed(sum(shape))
    x = (torch.randn(shape, generator=g) * 4).to(dtype).to(device)
    scale, zp = choose_qparams(x, granularity, group_size=group or 128, symmetric=symmetric)
    q = quantize_int8(x, scale, zp if not symmetric else None)
    want_q, want_back = reference_quantize(x, scale, zp, shape[-1])
    assert q.dtype == torch.int8 and q.shape == x.shape and q.device == x.device
    torch.testing.assert_close(q, want_q, rtol=0, atol=0)
    back = dequantize_int8(q, scale, zp if not symmetric else None)
    torch.testing.assert_close(back, want_back, rtol=0, atol=0)
    # min-max qparams cover x: the error is at most half a step (plus fp32 rounding of the product)
    step = scale.reshape(-1).max().item()
    assert (back - x.float()).abs().max().item() <= step / 2 * (1 + 1e-5) + 1e-7


@pytest.mark.filterwarnings("ignore:torch.quantize_per_tensor:UserWarning")
def test_saturation_and_ties_at_the_int8_extremes(device):
    x = torch.tensor(
        [[1e9, -1e9, 127.5, -128.5, 126.5, 0.5, 1.5, -0.5, 2.5, float("inf")]], device=device
    )
    q = quantize_int8(x, torch.ones(1, device=device))
    # ties go to even: 126.5 -> 126, 0.5 -> 0, 1.5 -> 2, -0.5 -> -0, 2.5 -> 2; inf saturates
    assert q.cpu().tolist() == [[127, -128, 127, -128, 126, 0, 2, 0, 2, 127]]
    # NaN has no int8 value: every device and granularity maps it to 127, as
    # torch.quantize_per_tensor does (issue 23 item 11; it was -128 before).
    nan = quantize_int8(
        torch.full((1, 37), float("nan"), device=device), torch.ones(1, device=device)
    )
    assert (nan.cpu() == 127).all()
    ref = torch.quantize_per_tensor(torch.full((37,), float("nan")), 1.0, 0, torch.qint8)
    assert torch.equal(nan.cpu().reshape(-1), ref.int_repr())
    x = torch.randn(3, 40)
    x[0, 0] = x[1, 17] = x[2, 39] = float("nan")
    zp = torch.tensor([[-5, 3], [0, 0], [9, -128]], dtype=torch.int32, device=device)
    per_group = quantize_int8(x.to(device), torch.full((3, 2), 0.02, device=device), zp)
    assert per_group.cpu()[x.isnan()].tolist() == [127, 127, 127]
    zp = torch.full((1,), -128, dtype=torch.int32, device=device)
    q = quantize_int8(
        torch.tensor([[0.0, 255.0, 300.0]], device=device), torch.ones(1, device=device), zp
    )
    assert q.cpu().tolist() == [[-128, 127, 127]]
    assert dequantize_int8(q, torch.ones(1, device=device), zp).cpu().tolist() == [[0, 255, 255]]


def test_quant_ops_opcheck():
    x = torch.randn(4, 64)
    scale, zp = choose_qparams(x, "per_group", group_size=16, symmetric=False)
    torch.library.opcheck(torch.ops.torchspeed.quantize_int8.default, (x, scale, zp))
    q = quantize_int8(x, scale, zp)
    torch.library.opcheck(torch.ops.torchspeed.dequantize_int8.default, (q, scale, zp))
    torch.library.opcheck(
        torch.ops.torchspeed.quantize_int8.default, (x, scale[:1, :1].reshape(1), None)
    )


@pytest.mark.parametrize(
    "make,match",
    [
        (lambda x: (x, torch.ones(3), None), "a per-channel scale must have 4 elements"),
        (lambda x: (x, torch.ones(4, 5), None), "groups dividing 64"),
        (lambda x: (x, torch.zeros(1), None), r"scale\[0\] must be finite and > 0, got 0"),
        (lambda x: (x, torch.full((1,), float("nan")), None), "must be finite and > 0"),
        (lambda x: (x, torch.ones(1, dtype=torch.float64), None), "scale must be a dense float32"),
        (
            lambda x: (x, torch.ones(1), torch.full((1,), 200, dtype=torch.int32)),
            r"zero_point\[0\] must be in \[-128, 127\], got 200",
        ),
        (lambda x: (x, torch.ones(1), torch.zeros(1)), "zero_point must be a contiguous int32"),
        (
            lambda x: (x, torch.ones(4), torch.zeros(1, dtype=torch.int32)),
            "must have scale's shape",
        ),
        (lambda x: (x.double(), torch.ones(1), None), "x must be float32, bfloat16 or float16"),
        (lambda x: (x.t(), torch.ones(1), None), "x must be contiguous"),
        (lambda x: (x.sum(), torch.ones(1), None), "at least one dimension"),
    ],
)
def test_bad_input_is_refused_with_the_argument_named(make, match):
    with pytest.raises(RuntimeError, match=match):
        quantize_int8(*make(torch.randn(4, 64)))


def test_dequantize_refuses_a_non_int8_tensor():
    with pytest.raises(RuntimeError, match="q must be int8, got Float"):
        dequantize_int8(torch.zeros(2, 2), torch.ones(1))


def test_choose_qparams_arguments():
    with pytest.raises(ValueError, match="granularity must be one of"):
        choose_qparams(torch.randn(2, 4), "per_row")
    with pytest.raises(ValueError, match="group_size must be a positive int dividing the last dim"):
        choose_qparams(torch.randn(2, 6), "per_group", group_size=4)
    s, z = choose_qparams(torch.zeros(3, 8), "per_channel")
    assert (s > 0).all() and (z == 0).all()  # an all-zero row gets the smallest positive scale


def test_matches_torch_ao_per_tensor_quantization_on_random_data():
    """torch.quantize_per_tensor divides by the scale where torchao multiplies by its inverse; on
    random data the two agree except at rare exact ties (counted, at most 0.1 %)."""
    x = torch.randn(100_000) * 3
    scale, _ = choose_qparams(x)
    ours = quantize_int8(x, scale)
    ao = torch.quantize_per_tensor(x, scale.item(), 0, torch.qint8).int_repr()
    assert (ours != ao).float().mean().item() <= 1e-3
    assert (ours.int() - ao.int()).abs().max().item() <= 1


def test_bad_argument_types_and_dtypes_are_named():
    """Adversarial pass (issue 23): non-tensors gave a ValueError or the dispatcher's
    RuntimeError, int and complex x were quantized (complex silently dropping its imaginary
    part), symmetric="no" counted as True and a NaN eps went through."""
    from torchspeed.quant import qparams_from_minmax

    x = torch.randn(2, 8)
    with pytest.raises(TypeError, match="choose_qparams: x must be a tensor, got list"):
        choose_qparams([1.0, 2.0])
    for bad in (torch.arange(8), torch.randn(8, dtype=torch.complex64)):
        with pytest.raises(ValueError, match="choose_qparams: x must be floating point"):
            choose_qparams(bad)
    with pytest.raises(TypeError, match="symmetric must be a bool, got 'no'"):
        choose_qparams(x, symmetric="no")
    with pytest.raises(ValueError, match="eps must be finite and > 0, got nan"):
        choose_qparams(x, eps=float("nan"))
    with pytest.raises(TypeError, match="eps must be finite and > 0"):
        choose_qparams(x, eps="1e-6")
    with pytest.raises(TypeError, match="group_size must be a positive int"):
        choose_qparams(x, "per_group", group_size=4.0)
    with pytest.raises(TypeError, match="qparams_from_minmax: min_val must be a tensor"):
        qparams_from_minmax(0.0, torch.ones(1))
    with pytest.raises(TypeError, match="quantize_int8: x must be a tensor, got list"):
        quantize_int8([1.0], torch.ones(1))
    with pytest.raises(TypeError, match="quantize_int8: scale must be a tensor, got float"):
        quantize_int8(x, 0.1)
    with pytest.raises(TypeError, match="dequantize_int8: zero_point must be a tensor or None"):
        dequantize_int8(torch.zeros(2, dtype=torch.int8), torch.ones(1), 0)
