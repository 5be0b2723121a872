"""The demo's image set: procedural JPEGs in 10 learnable classes, as WebDataset tar shards, made
once and cached.

Each image (varied sizes around 500x375) is a smooth coloured background with film grain, plus a
class-specific foreground drawn in a random colour, position, size and angle: circle, square,
triangle, star, cross, ring (shapes), horizontal stripes, vertical stripes, checkerboard, dots
(textures). A small CNN tells them apart from a 64 px random crop, and the JPEGs cost what photos
cost to decode (about 2 bits per pixel at quality 90). Everything comes from numpy's generator
seeded with the image index, so a cache is the same bytes on every machine with the same Pillow.

Layout of a cache folder (``prepare(...)`` returns it):

    <root>/demo-v1-<name>/train-000000.tar (+ .tar.idx), ..., val-000000.tar, manifest.json

The folder is built under a temporary name and renamed into place once complete; manifest.json
(format version, counts, sizes, seconds) is what marks it complete, so a half-written or older
cache is rebuilt.
"""

from __future__ import annotations

import io
import json
import math
import multiprocessing
import os
import shutil
import tempfile
import time
from typing import List, Optional, Tuple

import numpy as np

from .._progress import progress_bar

FORMAT_VERSION = 1
CLASSES = (
    "circle",
    "square",
    "triangle",
    "star",
    "cross",
    "ring",
    "h_stripes",
    "v_stripes",
    "checkerboard",
    "dots",
)
# name -> (train images, held-out images, images per shard)
SIZES = {"full": (9000, 1000, 1000), "quick": (480, 160, 160)}
ENV_DATA_DIR = "TORCHSPEED_DEMO_DATA"
_QUALITY = 90


def default_root() -> str:
    """$TORCHSPEED_DEMO_DATA, else $XDG_CACHE_HOME/torchspeed, else ~/.cache/torchspeed."""
    env = os.environ.get(ENV_DATA_DIR)
    if env:
        return env
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(cache, "torchspeed")


def cpu_count() -> int:
    """The cores this process may run on (its affinity mask), which is what the demo uses."""
    if hasattr(os, "sched_getaffinity"):
        return max(1, len(os.sched_getaffinity(0)))
    return os.cpu_count() or 1


# ---- one image ---------------------------------------------------------------------------------
_GRAIN: dict = {}


def _grain():
    """A 640x640 RGB tile of grain around 128, made once per process; images add windows of it."""
    if "tile" not in _GRAIN:
        from PIL import Image

        r = np.random.default_rng(1234)
        g = 128 + r.normal(0, 6.0, (640, 640, 1)) + r.normal(0, 3.0, (640, 640, 3))
        _GRAIN["tile"] = Image.fromarray(np.clip(g, 88, 168).astype(np.uint8))
    return _GRAIN["tile"]


def _colour(r: np.random.Generator, far_from: Optional[np.ndarray] = None) -> Tuple[int, ...]:
    for _ in range(20):
        c = r.integers(0, 256, 3)
        if far_from is None or np.abs(c - far_from).sum() > 180:
            break
    return tuple(int(v) for v in c)


def _polygon(cx, cy, radius, angle, points) -> List[Tuple[float, float]]:
    return [
        (
            cx + radius * rr * math.cos(angle + 2 * math.pi * k / len(points)),
            cy + radius * rr * math.sin(angle + 2 * math.pi * k / len(points)),
        )
        for k, rr in enumerate(points)
    ]


def make_image(index: int, label: int, seed: int = 0) -> bytes:
    """The JPEG bytes of image `index` of class `label` (deterministic)."""
    from PIL import Image, ImageChops, ImageDraw

    r = np.random.default_rng([seed, index])
    w = int(r.integers(400, 601))
    h = int(round(w * r.uniform(0.62, 0.88)))
    # Background: a 4x4 grid of random colours, smoothly interpolated, plus a faint sinusoid.
    small = r.integers(40, 216, (4, 4, 3)).astype(np.uint8)
    img = Image.fromarray(small).resize((w, h), Image.BILINEAR)
    fg = np.array(img.getpixel((w // 2, h // 2)))
    draw = ImageDraw.Draw(img)
    col = _colour(r, fg)
    name = CLASSES[label]
    m = min(w, h)
    cx, cy = w / 2 + r.uniform(-0.15, 0.15) * w, h / 2 + r.uniform(-0.15, 0.15) * h
    rad = m * r.uniform(0.22, 0.36)
    ang = r.uniform(0, 2 * math.pi)
    if name == "circle":
        draw.ellipse((cx - rad, cy - rad, cx + rad, cy + rad), fill=col)
    elif name == "square":
        draw.polygon(_polygon(cx, cy, rad * 1.2, ang, [1] * 4), fill=col)
    elif name == "triangle":
        draw.polygon(_polygon(cx, cy, rad * 1.3, ang, [1] * 3), fill=col)
    elif name == "star":
        draw.polygon(_polygon(cx, cy, rad * 1.3, ang, [1, 0.4] * 5), fill=col)
    elif name == "cross":
        t = rad * 0.32
        for a in (ang, ang + math.pi / 2):
            dx, dy = math.cos(a), math.sin(a)
            draw.polygon(
                [
                    (cx + dx * rad * 1.2 + s * -dy * t, cy + dy * rad * 1.2 + s * dx * t)
                    for s in (1, -1)
                ]
                + [
                    (cx - dx * rad * 1.2 + s * -dy * t, cy - dy * rad * 1.2 + s * dx * t)
                    for s in (-1, 1)
                ],
                fill=col,
            )
    elif name == "ring":
        draw.ellipse((cx - rad, cy - rad, cx + rad, cy + rad), outline=col, width=int(rad * 0.3))
    elif name in ("h_stripes", "v_stripes"):
        period = r.uniform(0.07, 0.14) * m
        tilt = r.uniform(-0.15, 0.15)
        horizontal = name == "h_stripes"
        n = int((h if horizontal else w) / period) + 4
        for k in range(-2, n):
            a = k * period
            if horizontal:
                draw.polygon(
                    [
                        (0, a),
                        (w, a + tilt * w),
                        (w, a + tilt * w + period / 2),
                        (0, a + period / 2),
                    ],
                    fill=col,
                )
            else:
                draw.polygon(
                    [
                        (a, 0),
                        (a + tilt * h, h),
                        (a + tilt * h + period / 2, h),
                        (a + period / 2, 0),
                    ],
                    fill=col,
                )
    elif name == "checkerboard":
        cell = r.uniform(0.08, 0.15) * m
        x0, y0 = r.uniform(-cell, 0), r.uniform(-cell, 0)
        for i in range(int(h / cell) + 2):
            for j in range(int(w / cell) + 2):
                if (i + j) % 2 == 0:
                    x, y = x0 + j * cell, y0 + i * cell
                    draw.rectangle((x, y, x + cell, y + cell), fill=col)
    else:  # dots
        cell = r.uniform(0.09, 0.15) * m
        dot = cell * r.uniform(0.25, 0.38)
        x0, y0 = r.uniform(0, cell), r.uniform(0, cell)
        for i in range(int(h / cell) + 1):
            for j in range(int(w / cell) + 1):
                x, y = x0 + j * cell, y0 + i * cell
                draw.ellipse((x - dot, y - dot, x + dot, y + dot), fill=col)
    # Grain: JPEGs of the entropy of photos (flat images would flatter every decoder).
    oy, ox = int(r.integers(0, 640 - h + 1)), int(r.integers(0, 640 - w + 1))
    out = ImageChops.add(img, _grain().crop((ox, oy, ox + w, oy + h)), offset=-128)
    buf = io.BytesIO()
    out.save(buf, "JPEG", quality=_QUALITY)
    return buf.getvalue()


def _label(index: int, seed: int) -> int:
    return int(np.random.default_rng([seed, index, 7]).integers(0, len(CLASSES)))


def _make_chunk(args) -> List[Tuple[int, int, bytes]]:
    start, stop, seed = args
    return [(i, _label(i, seed), make_image(i, _label(i, seed), seed)) for i in range(start, stop)]


# ---- the cache ---------------------------------------------------------------------------------
def _valid(folder: str, name: str, seed: int) -> Optional[dict]:
    try:
        with open(os.path.join(folder, "manifest.json")) as f:
            m = json.load(f)
    except (OSError, ValueError):
        return None
    n_train, n_val, per_shard = SIZES[name]
    ok = (
        m.get("version") == FORMAT_VERSION
        and m.get("seed") == seed
        and m.get("train") == n_train
        and m.get("val") == n_val
        and all(
            os.path.isfile(os.path.join(folder, p))
            for p in m.get("train_shards", []) + m.get("val_shards", [])
        )
        and m.get("train_shards")
        and m.get("val_shards")
    )
    return m if ok else None


def prepare(
    name: str = "full",
    root: Optional[str] = None,
    workers: Optional[int] = None,
    seed: int = 0,
    progress: bool = True,
) -> dict:
    """Returns the manifest of cache `name` ("full": 9,000 train + 1,000 held-out images, "quick":
    480 + 160), generating it first if it is missing or incomplete. The manifest's train_urls /
    val_urls are absolute shard paths; "generated_s" says how long this call spent generating
    (0 when the cache was reused)."""
    if name not in SIZES:
        raise ValueError(
            f"torchspeed.demo: dataset must be one of {', '.join(SIZES)}, got {name!r}"
        )
    root = os.path.abspath(root or default_root())
    folder = os.path.join(root, f"demo-v{FORMAT_VERSION}-{name}-seed{seed}")
    m = _valid(folder, name, seed)
    generated_s = 0.0
    if m is None:
        t0 = time.perf_counter()
        _generate(folder, name, seed, workers, progress)
        generated_s = time.perf_counter() - t0
        m = _valid(folder, name, seed)
        if m is None:
            raise RuntimeError(
                f"torchspeed.demo: the dataset in {folder} is incomplete after generation"
            )
    m = dict(m)
    m["folder"] = folder
    m["train_urls"] = [os.path.join(folder, p) for p in m["train_shards"]]
    m["val_urls"] = [os.path.join(folder, p) for p in m["val_shards"]]
    m["generated_s"] = generated_s
    return m


def _generate(folder: str, name: str, seed: int, workers: Optional[int], progress: bool) -> None:
    from ..data.write_shards import ShardWriter

    n_train, n_val, per_shard = SIZES[name]
    total = n_train + n_val
    workers = workers or cpu_count()
    parent = os.path.dirname(folder)
    os.makedirs(parent, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix=f".{os.path.basename(folder)}.tmp-", dir=parent)
    t0 = time.perf_counter()
    try:
        chunk = 20
        jobs = [(s, min(s + chunk, total), seed) for s in range(0, total, chunk)]
        # fork: the children only run numpy and Pillow (no torch threads, no loader).
        methods = multiprocessing.get_all_start_methods()
        ctx = multiprocessing.get_context("fork" if "fork" in methods else "spawn")
        bar = _bar(
            total, progress, f"generating the demo images ({name}, once; cached in {parent})"
        )
        counts = [0] * len(CLASSES)
        nbytes = 0
        with (
            ctx.Pool(max(1, workers)) as pool,
            ShardWriter(tmp, "train", per_shard) as wtrain,
            ShardWriter(tmp, "val", per_shard) as wval,
        ):
            for results in pool.imap(_make_chunk, jobs):
                for i, label, data in results:
                    w, key = (wtrain, f"train{i:06d}") if i < n_train else (wval, f"val{i:06d}")
                    w.write(key, {"jpg": data, "cls": str(label).encode()})
                    if i < n_train:
                        counts[label] += 1
                    nbytes += len(data)
                bar.update(len(results))
            train_paths, val_paths = list(wtrain.paths), list(wval.paths)
        bar.close()
        manifest = {
            "version": FORMAT_VERSION,
            "seed": seed,
            "train": n_train,
            "val": n_val,
            "classes": list(CLASSES),
            "train_class_counts": counts,
            "train_shards": [os.path.basename(p) for p in train_paths],
            "val_shards": [os.path.basename(p) for p in val_paths],
            "jpeg_quality": _QUALITY,
            "mean_jpeg_kb": nbytes / total / 1e3,
            "generation_s": time.perf_counter() - t0,
            "generation_processes": workers,
        }
        with open(os.path.join(tmp, "classes.txt"), "w") as f:
            f.write("\n".join(CLASSES) + "\n")
        with open(os.path.join(tmp, "manifest.json"), "w") as f:
            json.dump(manifest, f, indent=1)
        if os.path.exists(folder):  # an incomplete or outdated cache: replace it
            shutil.rmtree(folder, ignore_errors=True)
        try:
            os.replace(tmp, folder)
        except OSError:
            if _valid(folder, name, seed) is None:  # another run did not finish it either
                raise
            shutil.rmtree(tmp, ignore_errors=True)  # another run finished first: use its cache
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def _bar(total: int, enabled: bool, desc: str):
    return progress_bar(total, desc, "img", enabled=enabled)
