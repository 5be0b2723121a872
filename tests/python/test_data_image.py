"""torchspeed.data image pipeline vs PIL/torchvision-style references (bit-exact where stated)."""

import io

import numpy as np
import pytest
import torch

torchspeed = pytest.importorskip("torchspeed")
if not hasattr(torchspeed._C, "data"):
    pytest.skip("torchspeed built without the data loader", allow_module_level=True)
from data_helpers import Image, assert_matches_pil, jpeg_bytes, pil_pipeline, png_bytes, textured  # noqa: E402

D = torchspeed._C.data
needs_jpeg = pytest.mark.skipif(not D.with_jpeg, reason="built without libjpeg-turbo")


def options(**kw):
    o = D.ImageTransformOptions()
    for k, v in kw.items():
        setattr(o, k, v)
    return o


@needs_jpeg
@pytest.mark.parametrize(
    "quality,size,kw",
    [
        (90, (500, 375), {}),
        (75, (131, 97), {}),
        (95, (64, 200), {"subsampling": 0}),
        (80, (77, 51), {"gray": True}),
    ],
)
def test_jpeg_decode_equals_pil(quality, size, kw):
    jpg = jpeg_bytes(textured(*size, seed=quality), quality, **kw)
    ref = np.asarray(Image.open(io.BytesIO(jpg)).convert("RGB"))
    # Same libjpeg-turbo algorithms (islow IDCT, fancy upsampling): bit-exact with Pillow.
    np.testing.assert_array_equal(D.decode_image(jpg, 1).numpy(), ref)


@needs_jpeg
@pytest.mark.parametrize("f", [2, 4, 8])
def test_scaled_jpeg_decode_equals_pil_draft(f):
    jpg = jpeg_bytes(textured(500, 375, seed=3))
    img = Image.open(io.BytesIO(jpg))
    img.draft("RGB", (500 // f, 375 // f))
    ref = np.asarray(img.convert("RGB"))
    np.testing.assert_array_equal(D.decode_image(jpg, f).numpy(), ref)


@pytest.mark.parametrize("mode", ["RGB", "L", "P", "RGBA"])
def test_png_decode_equals_pil(mode):
    img = Image.fromarray(textured(53, 41, seed=1))
    img = img.convert(mode) if mode != "P" else img.quantize(64)
    data = png_bytes(img)
    np.testing.assert_array_equal(
        D.decode_image(data, 1).numpy(), np.asarray(Image.open(io.BytesIO(data)).convert("RGB"))
    )


@pytest.mark.parametrize(
    "box,size",
    [
        ((0, 0, 500, 375), (224, 224)),
        ((10.5, 20.25, 300.75, 200.5), (100, 80)),
        ((3, 4, 50, 60), (224, 224)),
        ((0, 0, 500, 375), (500, 375)),
        ((100, 0, 400, 375), (37, 301)),
    ],
)
def test_resample_equals_pil_bilinear(box, size):
    arr = textured(500, 375, seed=5)
    ref = np.asarray(Image.fromarray(arr).resize(size, Image.BILINEAR, box=box))
    out = D.resample_bilinear(torch.from_numpy(arr), list(box), size[0], size[1]).numpy()
    assert_matches_pil(out, ref)


def test_resample_small_crops_match_pil_within_one_level():
    arr = textured(200, 200, seed=1)
    exact = 0
    for w in range(30, 90, 4):
        for h in range(30, 90, 4):
            crop = np.ascontiguousarray(arr[:h, :w])
            ref = np.asarray(Image.fromarray(crop).resize((40, 40), Image.BILINEAR))
            out = D.resample_bilinear(torch.from_numpy(crop), [0, 0, w, h], 40, 40).numpy()
            assert_matches_pil(out, ref)
            exact += bool((out == ref).all())
    assert exact >= 100  # of 225: most shapes are bit-exact


@needs_jpeg
@pytest.mark.parametrize("decode_scaling", [False, True])
def test_random_resized_crop_and_flip_equal_reference(decode_scaling):
    o = options(
        crop="random_resized_crop",
        height=64,
        width=48,
        flip_prob=0.5,
        decode_scaling=decode_scaling,
        scale=(0.05, 1.0),
    )
    scaled = flipped = 0
    for idx in range(40):
        w, h = 300 + idx * 3, 220 + idx
        jpg = jpeg_bytes(textured(w, h, seed=idx))
        draw = D.draw_image_params(o, w, h, True, 17, 2, idx)
        scaled += draw["scale_denom"] > 1
        flipped += draw["flip"]
        out = D.process_image(jpg, o, 17, 2, idx)
        assert_matches_pil(out, pil_pipeline(jpg, o, draw, (64, 48)))
    assert 5 < flipped < 35
    assert (scaled > 0) == decode_scaling


@needs_jpeg
def test_region_decode_equals_full_decode_exactly():
    """Random crops decode only their region (libjpeg-turbo skip/crop scanlines); the pixels must
    equal a full decode followed by the same resample and flip, bit for bit."""
    o = options(crop="random_resized_crop", height=56, width=72, flip_prob=0.5, scale=(0.02, 0.9))
    for idx in range(60):
        w, h = 200 + 13 * idx, 150 + 7 * idx
        kind = [dict(subsampling=2), dict(subsampling=0), dict(subsampling=1), dict(gray=True)]
        jpg = jpeg_bytes(textured(w, h, seed=idx), 85 + idx % 10, **kind[idx % 4])
        d = D.draw_image_params(o, w, h, True, 5, 1, idx)
        f = d["scale_denom"]
        full = D.decode_image(jpg, f)
        if f == 1:
            crop = full[d["top"] : d["top"] + d["height"], d["left"] : d["left"] + d["width"]]
            box = [0, 0, d["width"], d["height"]]
        else:
            fx0, fy0 = d["left"] / f, d["top"] / f
            fx1, fy1 = (d["left"] + d["width"]) / f, (d["top"] + d["height"]) / f
            ix0, iy0 = int(np.floor(fx0)), int(np.floor(fy0))
            ix1 = min(int(np.ceil(fx1)), full.shape[1])
            iy1 = min(int(np.ceil(fy1)), full.shape[0])
            crop = full[iy0:iy1, ix0:ix1]
            box = [fx0 - ix0, fy0 - iy0, fx1 - ix0, fy1 - iy0]
        ref = D.resample_bilinear(crop.contiguous(), box, 72, 56)
        if d["flip"]:
            ref = ref.flip(1)
        out = D.process_image(jpg, o, 5, 1, idx)
        assert torch.equal(out, ref.permute(2, 0, 1)), (idx, d)


def test_draws_follow_torchvision_rules():
    o = options(crop="random_resized_crop", height=224, width=224, flip_prob=0.5)
    for idx in range(500):
        d = D.draw_image_params(o, 500, 375, False, 1, 0, idx)
        assert d == D.draw_image_params(o, 500, 375, False, 1, 0, idx)  # pure function
        area = d["width"] * d["height"] / (500 * 375)
        assert 0.079 <= area <= 1.0 + 1e-9
        assert 3 / 4 - 0.02 <= d["width"] / d["height"] <= 4 / 3 + 0.02
        assert 0 <= d["top"] <= 375 - d["height"] and 0 <= d["left"] <= 500 - d["width"]
        assert d["scale_denom"] == 1  # is_jpeg=False
    # Fallback when no attempt fits (ratio range impossible for a very wide image): center crop.
    d = D.draw_image_params(options(scale=(0.99, 1.0), ratio=(1.0, 1.0)), 1000, 10, False, 1, 0, 0)
    assert (d["height"], d["width"], d["top"], d["left"]) == (10, 10, 0, 495)


@needs_jpeg
def test_resize_center_crop_equals_reference():
    o = options(
        crop="resize_center_crop",
        resize_size=64,
        height=56,
        width=56,
        flip_prob=0.0,
        decode_scaling=True,
    )
    for idx, (w, h) in enumerate([(500, 375), (200, 333), (640, 480)]):
        jpg = jpeg_bytes(textured(w, h, seed=idx))
        draw = D.draw_image_params(o, w, h, True, 0, 0, idx)
        out = D.process_image(jpg, o, 0, 0, idx)
        assert_matches_pil(out, pil_pipeline(jpg, o, draw, (56, 56)))


@needs_jpeg
def test_float_normalize_and_channels_last_match_torch_reference():
    jpg = jpeg_bytes(textured(120, 90, seed=9))
    base = options(crop="resize", height=32, width=40, decode_scaling=False)
    u8 = D.process_image(jpg, base, 0, 0, 0)
    mean, std = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
    norm = options(
        crop="resize",
        height=32,
        width=40,
        decode_scaling=False,
        normalize=True,
        mean=list(mean),
        std=list(std),
    )
    out = D.process_image(jpg, norm, 0, 0, 0)
    ref = (u8.float() / 255 - torch.tensor(mean).view(3, 1, 1)) / torch.tensor(std).view(3, 1, 1)
    torch.testing.assert_close(out, ref, rtol=0, atol=0)
    hwc = D.process_image(
        jpg,
        options(crop="resize", height=32, width=40, decode_scaling=False, channels_last=True),
        0,
        0,
        0,
    )
    assert torch.equal(hwc, u8.permute(1, 2, 0))


def test_corrupt_inputs_raise_value_or_runtime_errors():
    with pytest.raises(RuntimeError, match="unknown image format"):
        D.decode_image(b"not an image", 1)
    if D.with_jpeg:
        jpg = jpeg_bytes(textured(64, 48, seed=0))
        with pytest.raises(RuntimeError, match="corrupt JPEG"):
            D.decode_image(jpg[: len(jpg) // 2], 1)
    with pytest.raises(ValueError, match="flip_prob"):
        options(flip_prob=2.0).validate()
