"""The loader's native sources: WebDataset tar shards, memory-mapped .npy arrays and in-memory
tensors. Each wraps a C++ source (csrc/data/sources.cpp) that the DataLoader's worker threads read,
decode and transform from, with no Python per sample."""

from __future__ import annotations

import glob
import os
import re
from typing import Any, Mapping, Optional, Sequence, Union

import torch

from .._native import native_module

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
# Pillow's decompression-bomb error threshold (2 * PIL.Image.MAX_IMAGE_PIXELS).
DEFAULT_MAX_IMAGE_PIXELS = 178_956_970


def _native(what: str = "torchspeed.data"):
    """torchspeed._C.data, or the one "area not built" error naming TORCHSPEED_WITH_DATA."""
    return native_module("data", what)


def expand_urls(urls: Union[str, Sequence[str]]) -> list:
    """WebDataset-style shard lists: "a-{000000..000009}.tar", "{a,b}.tar", globs, or a list."""
    if isinstance(urls, (str, os.PathLike)):
        urls = [os.fspath(urls)]
    out = []
    for u in urls:
        for e in _brace_expand(os.fspath(u)):
            if any(c in e for c in "*?[") and not os.path.exists(e):
                matches = sorted(glob.glob(e))
                if not matches:
                    raise FileNotFoundError(f"torchspeed.data.WebDataset: no shard matches '{e}'")
                out.extend(matches)
            else:
                out.append(e)
    return out


def _brace_expand(s: str) -> list:
    m = re.search(r"\{([^{}]*)\}", s)
    if not m:
        return [s]
    head, body, tail = s[: m.start()], m.group(1), s[m.end() :]
    r = re.fullmatch(r"(\d+)\.\.(\d+)", body)
    if r:
        a, b = r.group(1), r.group(2)
        width = len(a) if a.startswith("0") or len(a) == len(b) else 0
        items = [str(i).zfill(width) for i in range(int(a), int(b) + 1)]
    else:
        items = body.split(",")
    return [x for item in items for x in _brace_expand(head + item + tail)]


def _image_options(
    crop,
    size,
    scale,
    ratio,
    resize_size,
    flip_prob,
    dtype,
    normalize,
    channels_last,
    decode_scaling,
    max_image_pixels=DEFAULT_MAX_IMAGE_PIXELS,
):
    o = _native().ImageTransformOptions()
    o.crop = crop
    h, w = (size, size) if isinstance(size, int) else tuple(size)
    o.height, o.width = int(h), int(w)
    o.resize_size = int(resize_size)
    o.scale = (float(scale[0]), float(scale[1]))
    o.ratio = (float(ratio[0]), float(ratio[1]))
    o.flip_prob = float(flip_prob)
    if dtype not in (torch.uint8, torch.float32):
        raise ValueError(
            f"torchspeed.data: dtype must be torch.uint8 or torch.float32, got {dtype}"
        )
    o.to_float = dtype == torch.float32
    if normalize:
        mean, std = (IMAGENET_MEAN, IMAGENET_STD) if normalize is True else normalize
        o.normalize, o.to_float = True, True
        o.mean, o.std = [float(x) for x in mean], [float(x) for x in std]
    o.channels_last = bool(channels_last)
    o.decode_scaling = decode_scaling  # True/"accurate", "fast", False/"off" (checked in C++)
    if max_image_pixels is None:
        o.max_image_pixels = 0
    elif isinstance(max_image_pixels, bool) or not isinstance(max_image_pixels, int):
        raise ValueError(
            f"torchspeed.data: max_image_pixels must be an int or None, got {max_image_pixels!r}"
        )
    elif max_image_pixels <= 0:
        raise ValueError(
            f"torchspeed.data: max_image_pixels must be positive (None = no limit), got "
            f"{max_image_pixels}"
        )
    else:
        o.max_image_pixels = max_image_pixels
    o.validate()
    return o


class _NativeSource:
    """Base of native sources: holds the C++ source and turns its batch dict into user output."""

    _source: Any
    _names: Optional[Sequence[str]] = None  # output tuple order; None -> dict

    def __len__(self) -> int:
        return len(self._source)

    def _convert(self, batch: dict) -> Any:
        if self._names is None:
            return batch
        if len(self._names) == 1:
            return batch[self._names[0]]
        return tuple(batch[n] for n in self._names)


class WebDataset(_NativeSource):
    """WebDataset tar shards decoded and augmented in C++.

    Samples are consecutive tar members sharing a key (path up to the first dot of the basename);
    the rest of the name is the extension. ``fields`` picks what each batch holds, in order (a
    tuple is yielded); alternatives are separated by ';' ("jpg;png"). Without ``fields`` a dict
    of every recognised field of the first sample is yielded. Kinds by extension: jpg/jpeg/png
    -> image tensor (after the transform below), cls/cls2/id/index -> int64, txt/json -> list of
    str, npy -> stacked tensor; "__key__" -> list of sample keys.

    Image transform (matching torchvision on PIL, pixel for pixel, given the same draws):
    ``crop="random_resized_crop"``: RandomResizedCrop(size, scale, ratio);
    ``"resize_center_crop"``: Resize(resize_size) + CenterCrop(size); ``"resize"``: Resize to
    exactly ``size``; ``"none"``: images must already be ``size``. Then horizontal flip with
    ``flip_prob``, output ``dtype`` uint8 (0..255) or float32 (0..1), ``normalize=True`` or
    ``(mean, std)``, CHW (default) or ``channels_last`` HWC.

    Decoding follows ``Image.open(...).convert("RGB")``: the format comes from the bytes (a PNG
    named ``.jpg`` decodes; extensions match in any case, e.g. ImageNet's ``.JPEG``); CMYK/YCCK
    JPEGs, grayscale, palette, alpha and 16-bit PNGs convert as Pillow converts them.
    ``decode_scaling`` picks libjpeg-turbo's 1/2, 1/4, 1/8 decode-time downscaling:
    ``True``/``"accurate"`` (default) scales only while the decoded crop stays >= 4x the output,
    so pixels stay within 1 level mean absolute difference per image of a full decode + PIL
    BILINEAR resize (measured <= 0.5 on noise textures; from ~500x375 photos it only scales for
    outputs under ~60 px); ``"fast"`` scales whenever the crop is >= the output: measured on one core
    with 500x375 q90 JPEGs (`torchspeed bench loader`), 1.2x the images/s of the default for 112 px
    random crops, 1.4x for 112 px resize / resize_center_crop, 1.7x for 64 px resize, nothing at
    224 px; its pixels are 0.4-1.1 levels mean per image off torchvision there (worst image 1.4),
    2-7 levels mean (single pixels up to ~50) on noise/checkerboard textures. ``False``/``"off"``
    always decodes at full size.
    ``max_image_pixels`` (default 178,956,970, Pillow's error threshold; None = no limit) refuses
    larger images before anything is allocated; PNG/JPEG data too small for the size its header
    declares is refused as a decompression bomb too.
    Randomness comes from (seed, epoch, sample index), never from the worker.
    """

    def __init__(
        self,
        urls: Union[str, Sequence[str]],
        fields: Optional[Sequence[str]] = None,
        *,
        crop: str = "random_resized_crop",
        size: Union[int, Sequence[int]] = 224,
        scale: Sequence[float] = (0.08, 1.0),
        ratio: Sequence[float] = (3 / 4, 4 / 3),
        resize_size: int = 256,
        flip_prob: float = 0.0,
        dtype: torch.dtype = torch.uint8,
        normalize: Union[bool, tuple] = False,
        channels_last: bool = False,
        decode_scaling: Union[bool, str] = True,
        max_image_pixels: Optional[int] = DEFAULT_MAX_IMAGE_PIXELS,
    ):
        if isinstance(fields, str):
            fields = [fields]
        self.urls = expand_urls(urls)
        self.fields = list(fields) if fields else []
        self.image_options = _image_options(
            crop,
            size,
            scale,
            ratio,
            resize_size,
            flip_prob,
            dtype,
            normalize,
            channels_last,
            decode_scaling,
            max_image_pixels,
        )
        self._source = _native().webdataset_source(self.urls, self.fields, self.image_options)
        self._names = self.fields if fields else None

    def __repr__(self) -> str:
        o = self.image_options
        return (
            f"WebDataset({len(self.urls)} shards, {len(self)} samples, fields={self.fields}, "
            f"crop={o.crop}, size=({o.height}, {o.width}), flip_prob={o.flip_prob}, "
            f"decode_scaling={o.decode_scaling!r}, max_image_pixels={o.max_image_pixels or None})"
        )


class NpySource(_NativeSource):
    """Memory-mapped .npy arrays; axis 0 is the sample axis.

    ``NpySource("x.npy")`` yields tensors; ``NpySource({"x": "x.npy", "y": "y.npy"})`` yields dicts;
    ``NpySource(["x.npy", "y.npy"])`` yields tuples.
    """

    def __init__(self, arrays: Union[str, Sequence[str], Mapping[str, str]]):
        if isinstance(arrays, (str, os.PathLike)):
            pairs, names = [("0", os.fspath(arrays))], ["0"]
        elif isinstance(arrays, Mapping):
            pairs, names = [(str(k), os.fspath(v)) for k, v in arrays.items()], None
        else:
            pairs = [(str(i), os.fspath(p)) for i, p in enumerate(arrays)]
            names = [n for n, _ in pairs]
        self._source = _native().npy_source(pairs)
        self._names = names


class TensorSource(_NativeSource):
    """In-memory tensors gathered per batch with index_select (like TensorDataset, but batched).

    ``TensorSource(x, y)`` yields tuples; ``TensorSource(x)`` yields tensors;
    ``TensorSource(x=x, y=y)`` yields dicts.
    """

    def __init__(self, *tensors: torch.Tensor, **named: torch.Tensor):
        if tensors and named:
            raise ValueError("torchspeed.data.TensorSource: pass tensors positionally or by name")
        if named:
            pairs, names = list(named.items()), None
        else:
            pairs = [(str(i), t) for i, t in enumerate(tensors)]
            names = [n for n, _ in pairs]
        self._source = _native().tensor_source(pairs)
        self._names = names
