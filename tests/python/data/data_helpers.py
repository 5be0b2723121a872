"""Shared helpers for the torchspeed.data tests: textured images, shard writing, PIL references."""

import io
import os
import tarfile

import numpy as np
import pytest
import torch

PIL = pytest.importorskip("PIL")
from PIL import Image  # noqa: E402

from torchspeed._native import AreaNotBuiltError, native_module  # noqa: E402
from torchspeed.data.pil_reference import pil_reference  # noqa: E402


def native_data():
    """torchspeed._C.data; skips the test module that asks when this build has no data area."""
    try:
        return native_module("data")
    except AreaNotBuiltError as e:
        pytest.skip(str(e), allow_module_level=True)


D = native_data()  # every data test module imports this file: all skip without the area
needs_jpeg = pytest.mark.skipif(not D.with_jpeg, reason="torchspeed built without libjpeg-turbo")


def textured(w, h, seed, noise=12.0):
    r = np.random.default_rng(seed)
    y, x = np.mgrid[0:h, 0:w]
    base = np.stack(
        [
            128
            + 60 * np.sin(0.07 * x * (c + 1) + 0.05 * y + seed)
            + 30 * np.cos(0.11 * y * (c + 2))
            for c in range(3)
        ],
        -1,
    )
    base = base + r.normal(0, noise, base.shape)
    return np.clip(base, 0, 255).astype(np.uint8)


def jpeg_bytes(arr, quality=90, **kw):
    buf = io.BytesIO()
    img = Image.fromarray(arr)
    if kw.pop("gray", False):
        img = img.convert("L")
    img.save(buf, "JPEG", quality=quality, **kw)
    return buf.getvalue()


def png_bytes(img):
    buf = io.BytesIO()
    img.save(buf, "PNG")
    return buf.getvalue()


def write_tar(path, members):
    with tarfile.open(path, "w", format=tarfile.USTAR_FORMAT) as tf:
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tf.addfile(info, io.BytesIO(data))


def make_shards(root, n_shards=3, per_shard=12, corrupt=(), size=(60, 45)):
    """Shards of <key>.jpg + <key>.cls (label = index % 10); keys in `corrupt` get a cut JPEG."""
    urls = []
    for s in range(n_shards):
        members = []
        for i in range(per_shard):
            idx = s * per_shard + i
            key = f"s{s:02d}/{idx:06d}"
            w, h = size[0] + (idx * 7) % 23, size[1] + (idx * 5) % 17
            jpg = jpeg_bytes(textured(w, h, idx))
            if key in corrupt:
                jpg = jpg[: len(jpg) // 3]
            members += [(key + ".jpg", jpg), (key + ".cls", str(idx % 10).encode())]
        path = os.path.join(root, f"shard-{s:06d}.tar")
        write_tar(path, members)
        urls.append(path)
    return urls


def pil_pipeline(jpg, options, draw, scaled_decode=True):
    """torchspeed.data.pil_reference (torchvision on PIL given the loader's draws) as uint8 CHW."""
    out = pil_reference(jpg, options, draw, scaled_decode=scaled_decode)
    return torch.from_numpy(out.copy()).permute(2, 0, 1).contiguous()


def assert_matches_pil(out, ref):
    """Pillow-resampled pixels: equal within 1 level, on average far below (PIL_TOLERANCE_NOTE)."""

    def as_int(x):
        if isinstance(x, torch.Tensor):
            return x.to(torch.int32)
        return torch.as_tensor(np.array(x, dtype=np.int32))

    out, ref = as_int(out), as_int(ref)
    assert out.shape == ref.shape, (out.shape, ref.shape)
    diff = (out - ref).abs()
    assert int(diff.max()) <= 1, f"max |diff| {int(diff.max())} > 1"
    assert float(diff.float().mean()) <= 0.3, f"mean |diff| {float(diff.float().mean()):.3f}"


# PIL_TOLERANCE_NOTE: our resampler reproduces Pillow's BILINEAR algorithm (same coefficients,
# 22-bit fixed point, horizontal pass then vertical, uint8 intermediate) and is bit-exact with
# the Pillow source we followed; the Pillow wheel installed here (13.x) differs by one level on
# some pixels for some crop shapes (it appears to order or round its passes differently when the
# vertical reduction dominates), so resampled comparisons allow |diff| <= 1. Decoding is compared
# bit-exactly.
