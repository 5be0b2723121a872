"""The loader's image pipeline re-done with Pillow, given the loader's own random draws
(``torchspeed._C.data.draw_image_params``): the reference that the tests compare the native
pipeline with and that the loader benchmark measures its fidelity against."""

from __future__ import annotations

import io

import numpy as np


def pil_reference(data: bytes, options, draw: dict, scaled_decode: bool = False) -> np.ndarray:
    """torchvision's transforms on PIL for one image: decode, then RandomResizedCrop /
    Resize + CenterCrop / Resize as ``options.crop`` says, with the crop, sizes and flip of
    ``draw``; BILINEAR with antialiasing, as torchvision resizes PIL images. Returns uint8 HWC.

    ``scaled_decode``: decode at 1/``draw["scale_denom"]`` with Pillow's JPEG draft mode and map
    the crop into the smaller image with a fractional box, as the loader's decode_scaling does;
    otherwise decode in full (plain torchvision)."""
    from PIL import Image  # optional dependency (pip install torchspeed[bench])

    img = Image.open(io.BytesIO(data))
    f = draw.get("scale_denom", 1) if scaled_decode else 1
    if f > 1:
        W, H = img.size
        img.draft("RGB", (W // f, H // f))
        if img.size != (-(-W // f), -(-H // f)):
            raise AssertionError(f"Pillow's draft gave {img.size} for 1/{f} of {(W, H)}")
    img = img.convert("RGB")
    oh, ow = options.height, options.width
    if options.crop == "random_resized_crop":
        t, left, h, w = draw["top"], draw["left"], draw["height"], draw["width"]
        if f == 1:
            out = img.crop((left, t, left + w, t + h)).resize((ow, oh), Image.BILINEAR)
        else:
            fx0, fy0, fx1, fy1 = left / f, t / f, (left + w) / f, (t + h) / f
            ix0, iy0 = int(np.floor(fx0)), int(np.floor(fy0))
            ix1, iy1 = min(int(np.ceil(fx1)), img.size[0]), min(int(np.ceil(fy1)), img.size[1])
            out = img.crop((ix0, iy0, ix1, iy1)).resize(
                (ow, oh), Image.BILINEAR, box=(fx0 - ix0, fy0 - iy0, fx1 - ix0, fy1 - iy0)
            )
    elif options.crop == "resize_center_crop":
        rw, rh = draw["resize_width"], draw["resize_height"]
        out = img.resize((rw, rh), Image.BILINEAR)
        top, left = int(round((rh - oh) / 2.0)), int(round((rw - ow) / 2.0))
        out = out.crop((left, top, left + ow, top + oh))
    else:
        out = img.resize((ow, oh), Image.BILINEAR)
    if draw.get("flip"):
        out = out.transpose(Image.FLIP_LEFT_RIGHT)
    return np.asarray(out)
