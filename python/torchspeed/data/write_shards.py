"""Write WebDataset tar shards from an image folder or from .npy arrays.

    python -m torchspeed.data.write_shards IMAGE_DIR OUT_DIR [--maxcount 1000] [--shuffle SEED]
    python -m torchspeed.data.write_shards --arrays x.npy y.npy --names x y OUT_DIR

Image folders: with class subdirectories (ImageFolder layout) each sample gets ``<key>.<jpg|png>``
and ``<key>.cls`` (the class index in sorted order; the class names are written to
``OUT_DIR/classes.txt``); a flat folder gives images only. JPEG and PNG bytes are stored as they
are (no re-encoding); other formats are converted to JPEG (quality 95) when Pillow is available.
Arrays: sample i gets ``<key>.<name>.npy`` holding row i of each array. Each shard also gets a
``.idx`` index (when torchspeed's native module is available) so loading needs no header scan.
"""

from __future__ import annotations

import argparse
import io
import os
import random
import sys
import tarfile
import time
from typing import Iterable, List, Optional, Sequence, Tuple

IMAGE_EXTS = {".jpg": "jpg", ".jpeg": "jpg", ".png": "png"}
CONVERTIBLE_EXTS = {".bmp", ".gif", ".tif", ".tiff", ".webp", ".ppm", ".pgm"}


class _Progress:
    """tqdm when installed, else a small stderr bar (no dependency)."""

    def __init__(self, total: int, desc: str, enabled: bool = True):
        self.total, self.desc, self.n, self.enabled = total, desc, 0, enabled
        self.t0 = time.monotonic()
        self._last = 0.0
        self._tqdm = None
        if enabled:
            try:
                from tqdm import tqdm  # type: ignore

                self._tqdm = tqdm(total=total, desc=desc, unit="sample")
            except ImportError:
                pass

    def update(self, n: int = 1) -> None:
        self.n += n
        if not self.enabled:
            return
        if self._tqdm is not None:
            self._tqdm.update(n)
            return
        now = time.monotonic()
        if now - self._last < 0.1 and self.n < self.total:
            return
        self._last = now
        frac = self.n / self.total if self.total else 1.0
        rate = self.n / max(now - self.t0, 1e-9)
        bar = "#" * int(30 * frac)
        sys.stderr.write(f"\r{self.desc}: [{bar:<30}] {self.n}/{self.total} {rate:.0f} samples/s")
        sys.stderr.flush()

    def close(self) -> None:
        if self._tqdm is not None:
            self._tqdm.close()
        elif self.enabled:
            sys.stderr.write("\n")


class ShardWriter:
    """Writes samples (dicts of extension -> bytes) into numbered tar shards."""

    def __init__(
        self, out_dir: str, prefix: str = "shard", maxcount: int = 1000, write_index: bool = True
    ):
        if maxcount < 1:
            raise ValueError(f"torchspeed.data.write_shards: maxcount must be >= 1, got {maxcount}")
        self.out_dir, self.prefix, self.maxcount = out_dir, prefix, maxcount
        self.write_index = write_index
        self.paths: List[str] = []
        self._tar: Optional[tarfile.TarFile] = None
        self._count = 0
        os.makedirs(out_dir, exist_ok=True)

    def write(self, key: str, fields: dict) -> None:
        if "." in os.path.basename(key):
            raise ValueError(
                f"torchspeed.data.write_shards: key {key!r} must not contain a dot in "
                "its basename (WebDataset splits the extension at the first dot)"
            )
        if self._tar is None or self._count >= self.maxcount:
            self._open_next()
        for ext, data in fields.items():
            info = tarfile.TarInfo(f"{key}.{ext}")
            info.size = len(data)
            info.mtime = 0
            info.mode = 0o644
            self._tar.addfile(info, io.BytesIO(data))  # type: ignore[union-attr]
        self._count += 1

    def _open_next(self) -> None:
        self._close_current()
        path = os.path.join(self.out_dir, f"{self.prefix}-{len(self.paths):06d}.tar")
        self._tar = tarfile.open(path, "w", format=tarfile.USTAR_FORMAT)
        self.paths.append(path)
        self._count = 0

    def _close_current(self) -> None:
        if self._tar is not None:
            self._tar.close()
            self._tar = None
            if self.write_index:
                _write_index(self.paths[-1])

    def close(self) -> None:
        self._close_current()

    def __enter__(self) -> ShardWriter:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _write_index(path: str) -> None:
    try:
        from torchspeed import _C
    except ImportError:
        return
    if hasattr(_C, "data"):
        _C.data.write_shard_index(path)


def _list_images(root: str) -> Tuple[List[Tuple[str, Optional[int]]], List[str]]:
    entries = sorted(os.listdir(root))
    classes = [e for e in entries if os.path.isdir(os.path.join(root, e))]
    files: List[Tuple[str, Optional[int]]] = []
    exts = set(IMAGE_EXTS) | CONVERTIBLE_EXTS
    if classes:
        for ci, c in enumerate(classes):
            for dirpath, _, names in sorted(os.walk(os.path.join(root, c))):
                for n in sorted(names):
                    if os.path.splitext(n)[1].lower() in exts:
                        files.append((os.path.join(dirpath, n), ci))
    else:
        files = [
            (os.path.join(root, n), None) for n in entries if os.path.splitext(n)[1].lower() in exts
        ]
    return files, classes


def _image_fields(path: str) -> dict:
    ext = os.path.splitext(path)[1].lower()
    with open(path, "rb") as f:
        data = f.read()
    if ext in IMAGE_EXTS:
        return {IMAGE_EXTS[ext]: data}
    from PIL import Image  # only needed for conversions

    buf = io.BytesIO()
    Image.open(io.BytesIO(data)).convert("RGB").save(buf, format="JPEG", quality=95)
    return {"jpg": buf.getvalue()}


def write_image_folder(
    root: str,
    out_dir: str,
    maxcount: int = 1000,
    prefix: str = "shard",
    shuffle_seed: Optional[int] = None,
    progress: bool = True,
    write_index: bool = True,
) -> List[str]:
    """Shards an image folder; returns the shard paths."""
    files, classes = _list_images(root)
    if not files:
        raise FileNotFoundError(f"torchspeed.data.write_shards: no images under '{root}'")
    if shuffle_seed is not None:
        random.Random(shuffle_seed).shuffle(files)
    bar = _Progress(len(files), "write_shards", progress)
    with ShardWriter(out_dir, prefix, maxcount, write_index) as w:
        for i, (path, label) in enumerate(files):
            fields = _image_fields(path)
            if label is not None:
                fields["cls"] = str(label).encode()
            w.write(f"{i:08d}", fields)
            bar.update()
    bar.close()
    if classes:
        with open(os.path.join(out_dir, "classes.txt"), "w", encoding="utf-8") as f:
            f.write("\n".join(classes) + "\n")
    return w.paths


def write_arrays(
    arrays: Sequence[str],
    names: Sequence[str],
    out_dir: str,
    maxcount: int = 1000,
    prefix: str = "shard",
    progress: bool = True,
    write_index: bool = True,
) -> List[str]:
    """Shards .npy arrays row by row (sample i gets row i of each); returns the shard paths."""
    import numpy as np

    if len(arrays) != len(names):
        raise ValueError("torchspeed.data.write_shards: --names must match --arrays")
    mats = [np.load(a, mmap_mode="r") for a in arrays]
    n = len(mats[0])
    for a, m in zip(arrays, mats):
        if len(m) != n:
            raise ValueError(f"torchspeed.data.write_shards: '{a}' has {len(m)} rows, expected {n}")
    bar = _Progress(n, "write_shards", progress)
    with ShardWriter(out_dir, prefix, maxcount, write_index) as w:
        for i in range(n):
            fields = {}
            for name, m in zip(names, mats):
                buf = io.BytesIO()
                np.save(buf, np.ascontiguousarray(m[i]))
                fields[f"{name}.npy"] = buf.getvalue()
            w.write(f"{i:08d}", fields)
            bar.update()
    bar.close()
    return w.paths


def main(argv: Optional[Iterable[str]] = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m torchspeed.data.write_shards", description=__doc__.split("\n\n")[0]
    )
    p.add_argument("inputs", nargs="*", help="IMAGE_DIR OUT_DIR, or OUT_DIR with --arrays")
    p.add_argument("--arrays", nargs="+", help=".npy files (axis 0 = samples)")
    p.add_argument("--names", nargs="+", help="field names for --arrays (default: file stems)")
    p.add_argument("--maxcount", type=int, default=1000, help="samples per shard (default 1000)")
    p.add_argument("--prefix", default="shard", help="shard file prefix (default 'shard')")
    p.add_argument(
        "--shuffle",
        type=int,
        default=None,
        metavar="SEED",
        help="shuffle images before sharding with this seed",
    )
    p.add_argument("--no-index", action="store_true", help="do not write .idx files")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    a = p.parse_args(list(argv) if argv is not None else None)
    if a.arrays:
        if len(a.inputs) != 1:
            p.error("with --arrays give exactly one positional argument: OUT_DIR")
        names = a.names or [os.path.splitext(os.path.basename(x))[0] for x in a.arrays]
        paths = write_arrays(
            a.arrays, names, a.inputs[0], a.maxcount, a.prefix, not a.quiet, not a.no_index
        )
    else:
        if len(a.inputs) != 2:
            p.error("give IMAGE_DIR OUT_DIR (or --arrays ... OUT_DIR)")
        paths = write_image_folder(
            a.inputs[0], a.inputs[1], a.maxcount, a.prefix, a.shuffle, not a.quiet, not a.no_index
        )
    print(f"wrote {len(paths)} shard(s) to {os.path.dirname(paths[0]) or '.'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
