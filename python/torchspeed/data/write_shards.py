"""Write WebDataset tar shards from an image folder, a list of images or .npy arrays.

Examples (each line runs as written; tests/python/test_write_shards.py runs them all):

    python -m torchspeed.data.write_shards train/ shards/ --maxcount 1000 --shuffle 0
    python -m torchspeed.data.write_shards train/ -o shards/ --on-error skip
    python -m torchspeed.data.write_shards --arrays x.npy y.npy --names x y shards/
    python -m torchspeed.data.write_shards --arrays x.npy y.npy --names x y -o shards/ --overwrite

Image folders follow torchvision's ImageFolder: each subfolder is a class, its index is the
position of the folder name in sorted order, and its images are found recursively in sorted order
(extensions .jpg .jpeg .png .ppm .bmp .pgm .tif .tiff .webp, in any case). Each sample gets
<key>.jpg or <key>.png and <key>.cls; the class names go to OUT_DIR/classes.txt. A folder without
subfolders gives images only. Every image is decoded once with the loader's own decoder: JPEG and
PNG bytes that decode are stored unchanged, under the extension of their content. Other formats,
and JPEG/PNG files the loader cannot decode but Pillow can (a CMYK JPEG, say), are converted with
Pillow: a JPEG to JPEG quality 95, anything else to lossless PNG. A file that cannot be read or decoded stops the run
naming the file (--on-error raise, the default) or is left out and counted (--on-error skip).

Arrays: sample i gets <key>.<name>.npy holding row i of each array with the row's exact dtype and
shape (rows of a 1-D array are 0-d, so a labels array loads as [B], as with NpySource).

Output: OUT_DIR/PREFIX-000000.tar, PREFIX-000001.tar, ... each with a .tar.idx index. OUT_DIR
must be empty or missing; --overwrite first removes the PREFIX-NNNNNN.tar and .tar.idx files of
an earlier run (and nothing else). Shards are written into a hidden folder inside OUT_DIR and
moved into place at the end, so a failed or interrupted run leaves OUT_DIR as it was.

Exit status: 0 done, 1 bad input data (the message names the file), 2 usage error.
"""

from __future__ import annotations

import argparse
import io
import os
import random
import re
import shutil
import sys
import tarfile
import tempfile
from dataclasses import dataclass, field
from typing import Iterable, List, Optional, Sequence, Tuple

from .._atomic import check_target, replace_file

_WHO = "torchspeed.data.write_shards"

# torchvision's ImageFolder extensions, so that a folder gives the same samples as ImageFolder.
IMG_EXTENSIONS = (".jpg", ".jpeg", ".png", ".ppm", ".bmp", ".pgm", ".tif", ".tiff", ".webp")

# .npy dtypes the loader reads (csrc/data/npy.cpp), as little-endian numpy dtype strings.
_NPY_DTYPES = ("|b1", "|u1", "|i1", "<i2", "<i4", "<i8", "<u2", "<f2", "<f4", "<f8")


class WriteShardsError(Exception):
    """An error the command line reports as one line; ``exit_code`` is its exit status."""

    exit_code = 1


class UsageError(WriteShardsError, ValueError):
    """Bad arguments: a missing input, a non-empty output folder, a bad option value."""

    exit_code = 2


class BadSampleError(WriteShardsError, ValueError):
    """An input file (image or array) that cannot be read or written; the message names it."""

    exit_code = 1


def _usage(msg: str) -> UsageError:
    return UsageError(f"{_WHO}: {msg}")


def _bad(msg: str) -> BadSampleError:
    return BadSampleError(f"{_WHO}: {msg}")


# ---- shard writing -----------------------------------------------------------------------------
class ShardWriter:
    """Writes samples (dicts of extension -> bytes) into numbered tar shards in ``out_dir``."""

    def __init__(
        self, out_dir: str, prefix: str = "shard", maxcount: int = 1000, write_index: bool = True
    ):
        if maxcount < 1:
            raise _usage(f"maxcount must be >= 1, got {maxcount}")
        self.out_dir, self.prefix, self.maxcount = out_dir, prefix, maxcount
        self.write_index = write_index
        self.paths: List[str] = []
        self._tar: Optional[tarfile.TarFile] = None
        self._count = 0
        os.makedirs(out_dir, exist_ok=True)

    def write(self, key: str, fields: dict) -> None:
        if "." in os.path.basename(key):
            raise ValueError(
                f"{_WHO}: key {key!r} must not contain a dot in "
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


def _native_data():
    try:
        from torchspeed import _C
    except ImportError:
        return None
    return getattr(_C, "data", None)


def _write_index(path: str) -> None:
    d = _native_data()
    if d is not None:
        d.write_shard_index(path)


def _own_file_pattern(prefix: str) -> re.Pattern[str]:
    return re.compile(re.escape(prefix) + r"-\d{6,}\.tar(\.idx)?")


_STAGING_PREFIX = ".write_shards-"


def _check_output(out_dir: str, prefix: str, overwrite: bool) -> None:
    """Validates OUT_DIR before anything is written (a usage error if it cannot be used)."""
    if not prefix or "/" in prefix or os.sep in prefix or prefix.startswith("."):
        raise _usage(
            f"prefix must be a plain file name start (no '/', no leading '.'), got {prefix!r}"
        )
    if os.path.exists(out_dir) and not os.path.isdir(out_dir):
        raise _usage(f"output '{out_dir}' exists and is not a folder")
    if os.path.isdir(out_dir) and not overwrite:
        entries = sorted(os.listdir(out_dir))
        if entries:
            raise _usage(
                f"output folder '{out_dir}' is not empty ({len(entries)} entries, e.g. "
                f"'{entries[0]}'); pass --overwrite to replace its {prefix}-NNNNNN.tar shards "
                "(other files are kept)"
            )


class _Staging:
    """A hidden folder inside OUT_DIR: commit() moves its files in, abort() leaves OUT_DIR as it was."""

    def __init__(self, out_dir: str):
        self.out_dir = out_dir
        self.created: List[str] = []  # folders this run made, deepest first
        d = os.path.abspath(out_dir)
        while not os.path.exists(d):
            self.created.append(d)
            d = os.path.dirname(d)
        os.makedirs(out_dir, exist_ok=True)
        self.dir = tempfile.mkdtemp(prefix=_STAGING_PREFIX, dir=out_dir)

    def commit(self, prefix: str, overwrite: bool) -> List[str]:
        names = sorted(os.listdir(self.dir))
        own = _own_file_pattern(prefix)
        for name in names:  # every destination checked before anything is removed or moved
            dst = os.path.join(self.out_dir, name)
            if not (
                overwrite and own.fullmatch(name) and (os.path.isfile(dst) or os.path.islink(dst))
            ):
                check_target(dst, _WHO)
        if overwrite:
            own = _own_file_pattern(prefix)
            for name in os.listdir(self.out_dir):
                path = os.path.join(self.out_dir, name)
                if own.fullmatch(name) and (os.path.isfile(path) or os.path.islink(path)):
                    os.remove(path)
                elif name.startswith(_STAGING_PREFIX) and path != self.dir and os.path.isdir(path):
                    shutil.rmtree(path, ignore_errors=True)  # left by a killed run
        moved = []
        for name in names:
            dst = os.path.join(self.out_dir, name)
            replace_file(os.path.join(self.dir, name), dst, who=_WHO)
            moved.append(dst)
        os.rmdir(self.dir)
        return moved

    def abort(self) -> None:
        shutil.rmtree(self.dir, ignore_errors=True)
        for d in self.created:
            try:
                os.rmdir(d)
            except OSError:
                break


@dataclass
class WriteReport:
    """What a write did: final shard paths and per-sample counts."""

    paths: List[str] = field(default_factory=list)
    written: int = 0
    skipped: List[Tuple[str, str]] = field(default_factory=list)  # (file, why)
    converted: int = 0
    unchecked: int = 0  # images only format-sniffed (no decoder available)
    notes: List[str] = field(default_factory=list)


def _progress(total: int, enabled: bool):
    try:
        from tqdm import tqdm
    except ImportError:  # tqdm is a dependency; an environment without it just gets no bar
        return _NoBar()
    # disable=None: a bar on a terminal, none when stderr is a file or a pipe.
    return tqdm(total=total, desc="write_shards", unit="sample", disable=None if enabled else True)


class _NoBar:
    def update(self, n: int = 1) -> None:
        pass

    def set_postfix_str(self, s: str) -> None:
        pass

    def close(self) -> None:
        pass


def _run_staged(out_dir, prefix, overwrite, fill) -> List[str]:
    """Runs fill(staging_dir) and moves what it wrote into out_dir; on any error, nothing changes."""
    staging = _Staging(out_dir)
    try:
        fill(staging.dir)
        moved = staging.commit(prefix, overwrite)
    except BaseException:
        staging.abort()
        raise
    own = _own_file_pattern(prefix)
    return sorted(p for p in moved if own.fullmatch(os.path.basename(p)) and p.endswith(".tar"))


def _note_foreign_tars(out_dir: str, prefix: str, report: WriteReport) -> None:
    own = _own_file_pattern(prefix)
    other = sorted(n for n in os.listdir(out_dir) if n.endswith(".tar") and not own.fullmatch(n))
    if other:
        report.notes.append(
            f"'{out_dir}' also holds {len(other)} other .tar file(s) (e.g. '{other[0]}') that "
            f"were kept; a glob like '*.tar' would mix them in, use '{prefix}-*.tar'"
        )


# ---- images ------------------------------------------------------------------------------------
def _has_image_ext(name: str) -> bool:
    return name.lower().endswith(IMG_EXTENSIONS)


def find_images(root: str) -> Tuple[List[Tuple[str, Optional[int]]], List[str]]:
    """(path, class index or None) for every image under ``root``, and the class names.

    Same classes, indices and sample order as ``torchvision.datasets.ImageFolder(root)``.
    """
    if not os.path.isdir(root):
        raise _usage(f"image folder '{root}' does not exist or is not a folder")
    with os.scandir(root) as it:
        entries = sorted(it, key=lambda e: e.name)
    classes = [e.name for e in entries if e.is_dir()]
    if not classes:
        return [(e.path, None) for e in entries if e.is_file() and _has_image_ext(e.name)], []

    def walk_error(e: OSError) -> None:
        raise _bad(f"cannot list '{e.filename}': {e.strerror}")

    files: List[Tuple[str, Optional[int]]] = []
    for ci, c in enumerate(classes):
        for dirpath, _, names in sorted(
            os.walk(os.path.join(root, c), onerror=walk_error, followlinks=True)
        ):
            for n in sorted(names):
                if _has_image_ext(n):
                    files.append((os.path.join(dirpath, n), ci))
    return files, classes


def _sniff(data: bytes) -> Optional[str]:
    if data[:3] == b"\xff\xd8\xff":
        return "jpg"
    if data[:8] == b"\x89PNG\r\n\x1a\n":
        return "png"
    return None


class _Decoders:
    """The loader's native decoder when built (the real test: what it decodes, training reads),
    Pillow as the checker for what it cannot do and as the converter."""

    def __init__(self, verify: bool):
        self.verify = verify
        d = _native_data() if verify else None
        self.native = d if d is not None and hasattr(d, "decode_image") else None
        self.native_jpeg = bool(getattr(self.native, "with_jpeg", False))
        try:
            from PIL import Image

            self.pil = Image
        except ImportError:
            self.pil = None

    def native_error(self, data: bytes) -> Optional[str]:
        """None if the loader decodes it; the decoder's message otherwise."""
        try:
            self.native.decode_image(data)  # type: ignore[union-attr]
        except (ValueError, RuntimeError) as e:
            return str(e)
        return None

    def native_checks(self, kind: str) -> bool:
        return self.native is not None and (kind == "png" or self.native_jpeg)

    def pil_load(self, data: bytes):
        """(image, None) if Pillow decodes the whole image, (None, why) otherwise."""
        if self.pil is None:
            return None, "Pillow is not installed"
        try:
            img = self.pil.open(io.BytesIO(data))
            img.load()
            return img, None
        except Exception as e:  # noqa: BLE001 (Pillow raises many types for bad data)
            return None, f"{type(e).__name__}: {e}"


def _reencode(img, fmt: str) -> bytes:
    buf = io.BytesIO()
    if fmt == "png":
        img.convert("RGB").save(buf, format="PNG")
    else:  # 4:4:4 keeps the colour detail that 4:2:0 would blur a second time
        img.convert("RGB").save(buf, format="JPEG", quality=95, subsampling=0)
    return buf.getvalue()


def _image_field(path: str, dec: _Decoders, report: WriteReport) -> Tuple[str, bytes]:
    """(extension, bytes) to store for one image file; raises BadSampleError naming the file."""
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as e:
        raise _bad(f"cannot read '{path}': {e.strerror or e}") from None
    if not data:
        raise _bad(f"'{path}' is empty")
    kind = _sniff(data)
    if kind is not None and not dec.verify:
        return kind, data
    native_problem = None
    if kind is not None and dec.native_checks(kind):
        native_problem = dec.native_error(data)
        if native_problem is None:
            return kind, data
    img, pil_problem = dec.pil_load(data)
    if kind is not None and native_problem is None:
        # The native decoder could not check this format here; Pillow (if any) is the check.
        if dec.pil is None:
            report.unchecked += 1
            return kind, data
        if img is None:
            raise _bad(f"cannot decode '{path}' ({kind.upper()}): {pil_problem}")
        return kind, data
    if img is None:
        if kind is not None:
            raise _bad(f"cannot decode '{path}': {native_problem}")
        head = data[:8].hex()
        raise _bad(
            f"'{path}' is not a JPEG or PNG (starts with 0x{head}) and cannot be converted: "
            f"{pil_problem}"
        )
    report.converted += 1
    fmt = "jpg" if kind == "jpg" else "png"  # lossy stays lossy; anything else is kept lossless
    return fmt, _reencode(img, fmt)


def _check_on_error(on_error: str) -> None:
    if on_error not in ("raise", "skip"):
        raise _usage(f"on_error must be 'raise' or 'skip', got {on_error!r}")


def _check_maxcount(maxcount: int) -> None:
    if isinstance(maxcount, bool) or not isinstance(maxcount, int) or maxcount < 1:
        raise _usage(f"maxcount must be an integer >= 1, got {maxcount!r}")


def _write_images(
    items: Sequence[Tuple[str, Optional[int]]],
    out_dir: str,
    maxcount: int = 1000,
    prefix: str = "shard",
    shuffle_seed: Optional[int] = None,
    progress: bool = True,
    write_index: bool = True,
    *,
    classes: Optional[Sequence[str]] = None,
    on_error: str = "raise",
    overwrite: bool = False,
    verify: bool = True,
    inputs: Sequence[str] = (),
) -> WriteReport:
    _check_maxcount(maxcount)
    _check_on_error(on_error)
    items = [(os.fspath(p), None if c is None else int(c)) for p, c in items]
    if not items:
        raise _usage("no images to write")
    labelled = [c is not None for _, c in items]
    if any(labelled) and not all(labelled):
        raise _usage("give a class index for every image or for none")
    if classes is not None:
        bad = [c for _, c in items if c is not None and not 0 <= c < len(classes)]
        if bad:
            raise _usage(f"class index {bad[0]} is out of range for {len(classes)} classes")
    out_real = os.path.realpath(out_dir)
    for src in inputs:
        src_real = os.path.realpath(src)
        if out_real == src_real or out_real.startswith(src_real.rstrip(os.sep) + os.sep):
            raise _usage(f"output '{out_dir}' must not be inside the image folder '{src}'")
    _check_output(out_dir, prefix, overwrite)
    if shuffle_seed is not None:
        random.Random(shuffle_seed).shuffle(items)

    report = WriteReport()
    dec = _Decoders(verify)

    def fill(stage: str) -> None:
        bar = _progress(len(items), progress)
        try:
            with ShardWriter(stage, prefix, maxcount, write_index) as w:
                for path, label in items:
                    try:
                        ext, data = _image_field(path, dec, report)
                    except BadSampleError as e:
                        if on_error == "raise":
                            raise
                        report.skipped.append((path, str(e)))
                        bar.set_postfix_str(f"skipped {len(report.skipped)}")
                        bar.update()
                        continue
                    fields = {ext: data}
                    if label is not None:
                        fields["cls"] = str(label).encode()
                    w.write(f"{report.written:08d}", fields)
                    report.written += 1
                    bar.update()
        finally:
            bar.close()
        if report.written == 0:
            raise _bad(
                f"none of the {len(items)} image(s) could be written; first: "
                f"{report.skipped[0][1].removeprefix(_WHO + ': ')}"
            )
        if classes:
            with open(os.path.join(stage, "classes.txt"), "w", encoding="utf-8") as f:
                f.write("\n".join(classes) + "\n")

    had_classes_txt = os.path.exists(os.path.join(out_dir, "classes.txt"))
    report.paths = _run_staged(out_dir, prefix, overwrite, fill)
    if had_classes_txt and not classes:
        report.notes.append(f"'{os.path.join(out_dir, 'classes.txt')}' of an earlier run was kept")
    _note_foreign_tars(out_dir, prefix, report)
    return report


def write_images(
    items: Sequence[Tuple[str, Optional[int]]],
    out_dir: str,
    maxcount: int = 1000,
    prefix: str = "shard",
    shuffle_seed: Optional[int] = None,
    progress: bool = True,
    write_index: bool = True,
    *,
    classes: Optional[Sequence[str]] = None,
    on_error: str = "raise",
    overwrite: bool = False,
    verify: bool = True,
) -> List[str]:
    """Shards a list of ``(image path, class index or None)``; returns the shard paths.

    ``classes`` (names by index) is written to ``out_dir/classes.txt``. See the module docstring
    for validation, ``on_error`` and ``overwrite``.
    """
    return _write_images(
        items,
        out_dir,
        maxcount,
        prefix,
        shuffle_seed,
        progress,
        write_index,
        classes=classes,
        on_error=on_error,
        overwrite=overwrite,
        verify=verify,
    ).paths


def _write_image_folder(root: str, out_dir: str, *args, **kwargs) -> WriteReport:
    items, classes = find_images(root)
    if not items:
        raise _usage(f"no images under '{root}' (extensions: {' '.join(IMG_EXTENSIONS)})")
    notes = []
    if classes:
        used = {c for _, c in items}
        empty = [c for i, c in enumerate(classes) if i not in used]
        if empty:
            notes.append(
                f"class folder(s) without images keep their index: {', '.join(empty[:5])}"
                + (" ..." if len(empty) > 5 else "")
            )
        loose = [
            n
            for n in os.listdir(root)
            if _has_image_ext(n) and os.path.isfile(os.path.join(root, n))
        ]
        if loose:
            notes.append(
                f"{len(loose)} image(s) directly in '{root}' are not in a class folder and are "
                "left out (as in torchvision's ImageFolder)"
            )
    r = _write_images(items, out_dir, *args, classes=classes or None, inputs=[root], **kwargs)
    r.notes[:0] = notes
    return r


def write_image_folder(
    root: str,
    out_dir: str,
    maxcount: int = 1000,
    prefix: str = "shard",
    shuffle_seed: Optional[int] = None,
    progress: bool = True,
    write_index: bool = True,
    *,
    on_error: str = "raise",
    overwrite: bool = False,
    verify: bool = True,
) -> List[str]:
    """Shards an image folder (ImageFolder layout or flat); returns the shard paths."""
    return _write_image_folder(
        root,
        out_dir,
        maxcount,
        prefix,
        shuffle_seed,
        progress,
        write_index,
        on_error=on_error,
        overwrite=overwrite,
        verify=verify,
    ).paths


# ---- arrays ------------------------------------------------------------------------------------
def _open_array(path: str):
    import numpy as np

    if not os.path.exists(path):
        raise _usage(f"array file '{path}' does not exist")
    if os.path.isdir(path):
        raise _usage(f"array file '{path}' is a folder")
    try:
        m = np.load(path, mmap_mode="r", allow_pickle=False)
    except (ValueError, OSError, EOFError) as e:
        raise _bad(f"'{path}' is not a readable .npy array: {e}") from None
    if not isinstance(m, np.ndarray):
        if hasattr(m, "close"):
            m.close()
        raise _bad(f"'{path}' is a .npz archive, not a .npy array")
    if m.ndim == 0:
        raise _bad(f"'{path}' is 0-d; axis 0 must be the sample axis")
    dt = m.dtype
    stored = dt.newbyteorder("<") if dt.byteorder == ">" else dt  # big-endian: same values, LE
    if dt.fields is not None or stored.str not in _NPY_DTYPES:
        names = ", ".join(str(np.dtype(s)) for s in _NPY_DTYPES)
        raise _bad(f"'{path}' has dtype {dt}, which the loader cannot read (supported: {names})")
    return m, stored


def _check_names(names: Sequence[str]) -> None:
    seen = set()
    for n in names:
        if not n or "/" in n or "\\" in n or any(c.isspace() for c in n) or "\0" in n:
            raise _usage(f"field name {n!r} must be non-empty, without '/' or spaces")
        if len(n) > 80:
            raise _usage(f"field name {n[:20]!r}... is longer than 80 characters (tar name limit)")
        if n in seen:
            raise _usage(f"field name {n!r} is given twice (use --names to tell them apart)")
        seen.add(n)


def _write_arrays(
    arrays: Sequence[str],
    names: Optional[Sequence[str]],
    out_dir: str,
    maxcount: int = 1000,
    prefix: str = "shard",
    progress: bool = True,
    write_index: bool = True,
    *,
    shuffle_seed: Optional[int] = None,
    overwrite: bool = False,
) -> WriteReport:
    import numpy as np

    _check_maxcount(maxcount)
    arrays = [os.fspath(a) for a in arrays]
    if not arrays:
        raise _usage("give at least one .npy file")
    if names is None:
        names = [os.path.splitext(os.path.basename(a))[0] for a in arrays]
    names = list(names)
    if len(arrays) != len(names):
        raise _usage(f"--names gives {len(names)} name(s) for {len(arrays)} array(s)")
    _check_names(names)
    opened = [_open_array(a) for a in arrays]
    n = len(opened[0][0])
    for a, (m, _) in zip(arrays, opened):
        if len(m) != n:
            raise _bad(f"'{a}' has {len(m)} rows, expected {n} like '{arrays[0]}'")
    if n == 0:
        raise _bad(f"'{arrays[0]}' has no rows")
    _check_output(out_dir, prefix, overwrite)
    order = list(range(n))
    if shuffle_seed is not None:
        random.Random(shuffle_seed).shuffle(order)

    report = WriteReport()

    def fill(stage: str) -> None:
        bar = _progress(n, progress)
        try:
            with ShardWriter(stage, prefix, maxcount, write_index) as w:
                for j, i in enumerate(order):
                    fields = {}
                    for name, (m, stored) in zip(names, opened):
                        # np.array keeps a 0-d row 0-d (np.ascontiguousarray would make it (1,)),
                        # and order="C" keeps rows of Fortran-ordered arrays readable by the loader.
                        row = np.array(m[i], dtype=stored, order="C")
                        buf = io.BytesIO()
                        np.lib.format.write_array(buf, row, allow_pickle=False)
                        fields[f"{name}.npy"] = buf.getvalue()
                    w.write(f"{j:08d}", fields)
                    report.written += 1
                    bar.update()
        finally:
            bar.close()

    report.paths = _run_staged(out_dir, prefix, overwrite, fill)
    _note_foreign_tars(out_dir, prefix, report)
    return report


def write_arrays(
    arrays: Sequence[str],
    names: Optional[Sequence[str]],
    out_dir: str,
    maxcount: int = 1000,
    prefix: str = "shard",
    progress: bool = True,
    write_index: bool = True,
    *,
    shuffle_seed: Optional[int] = None,
    overwrite: bool = False,
) -> List[str]:
    """Shards .npy arrays row by row (sample i gets row i of each); returns the shard paths.

    Rows keep their exact dtype and shape; ``names`` defaults to the file stems.
    """
    return _write_arrays(
        arrays,
        names,
        out_dir,
        maxcount,
        prefix,
        progress,
        write_index,
        shuffle_seed=shuffle_seed,
        overwrite=overwrite,
    ).paths


# ---- command line ------------------------------------------------------------------------------
class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # one line, exit status 2, no usage dump
        sys.stderr.write(f"{_WHO}: {message} (see --help)\n")
        sys.exit(2)


def _positive_int(s: str) -> int:
    try:
        v = int(s)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer >= 1, got {s!r}") from None
    if v < 1:
        raise argparse.ArgumentTypeError(f"expected an integer >= 1, got {s!r}")
    return v


def _build_parser() -> _Parser:
    doc = __doc__ or ""
    first, _, rest = doc.partition("\n\n")
    p = _Parser(
        prog="python -m torchspeed.data.write_shards",
        description=first,
        epilog=rest,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        allow_abbrev=False,
    )
    p.add_argument("inputs", nargs="*", metavar="PATH", help="IMAGE_DIR [OUT_DIR], or OUT_DIR")
    p.add_argument("-o", "--output", metavar="OUT_DIR", help="output folder (or give it last)")
    p.add_argument("--arrays", nargs="+", metavar="NPY", help=".npy files (axis 0 = samples)")
    p.add_argument("--names", nargs="+", metavar="NAME", help="field names (default: file stems)")
    p.add_argument("--maxcount", type=_positive_int, default=1000, help="samples per shard")
    p.add_argument("--prefix", default="shard", help="shard file name prefix (default 'shard')")
    p.add_argument("--shuffle", type=int, default=None, metavar="SEED", help="shuffle samples")
    p.add_argument(
        "--on-error",
        choices=("raise", "skip"),
        default="raise",
        help="an image that cannot be read or decoded: stop naming it (default), or skip it",
    )
    p.add_argument("--overwrite", action="store_true", help="replace shards already in OUT_DIR")
    p.add_argument("--no-verify", action="store_true", help="only sniff image formats, no decode")
    p.add_argument("--no-index", action="store_true", help="do not write .tar.idx files")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    return p


def _take_swallowed_output(a: argparse.Namespace) -> Optional[str]:
    """argparse gives every value after --arrays/--names to that option, so in the documented
    '--arrays x.npy y.npy --names x y OUT_DIR' (or '--arrays x.npy OUT_DIR --maxcount 9') OUT_DIR
    lands in one of those lists. When no OUT_DIR was found otherwise, it is the last value of the
    list that has one value too many (names must pair up with arrays). Returns that list's name."""
    if a.output is not None or a.inputs:
        return None
    if a.names is not None and len(a.names) == len(a.arrays) + 1:
        a.output = a.names.pop()
        return "names"
    if a.arrays and (a.names is None or len(a.arrays) == len(a.names) + 1):
        a.output = a.arrays.pop()
        return "arrays"
    return None


def _resolve(p: _Parser, argv: List[str]) -> Tuple[argparse.Namespace, str]:
    a = p.parse_intermixed_args(argv)  # IMAGE_DIR --maxcount 9 OUT_DIR works too
    if a.arrays is not None:
        taken = _take_swallowed_output(a)
        if taken == "arrays" and a.output.endswith(".npy"):
            p.error(f"OUT_DIR is missing ('{a.output}' looks like an input array)")
        if not a.arrays:
            p.error("--arrays needs at least one .npy file (and OUT_DIR last or with -o)")
        if a.names is not None and len(a.names) != len(a.arrays):
            p.error(
                f"--names gives {len(a.names)} name(s) for {len(a.arrays)} array(s) "
                "(OUT_DIR goes last or with -o)"
            )
        if a.output is not None and a.inputs:
            p.error("with --arrays, give OUT_DIR once (positional or -o), not both")
        if len(a.inputs) > 1:
            p.error(f"with --arrays, give only OUT_DIR, got {len(a.inputs)} paths")
        out = a.output if a.output is not None else (a.inputs[0] if a.inputs else None)
        if out is None:
            hint = "; --names takes one name per array" if a.names is not None else ""
            p.error(f"OUT_DIR is missing (give it last or with -o{hint})")
        if a.on_error != "raise" or a.no_verify:
            p.error("--on-error and --no-verify apply to images, not to --arrays")
        return a, out
    if a.names is not None:
        p.error("--names needs --arrays")
    if not a.inputs:
        p.error("give IMAGE_DIR and OUT_DIR (or --arrays ... OUT_DIR)")
    if a.output is not None:
        if len(a.inputs) != 1:
            p.error(f"with -o, give only IMAGE_DIR, got {len(a.inputs)} paths")
        return a, a.output
    if len(a.inputs) != 2:
        p.error(f"give IMAGE_DIR and OUT_DIR, got {len(a.inputs)} path(s)")
    return a, a.inputs[1]


def _print_report(r: WriteReport, out_dir: str) -> None:
    msg = f"wrote {r.written} sample(s) in {len(r.paths)} shard(s) to '{out_dir}'"
    if r.converted:
        msg += f" ({r.converted} image(s) converted with Pillow)"
    print(msg)
    for n in r.notes:
        sys.stderr.write(f"{_WHO}: note: {n}\n")
    if r.unchecked:
        sys.stderr.write(
            f"{_WHO}: note: {r.unchecked} image(s) were only format-checked "
            "(no decoder for them here: build torchspeed with JPEG support or install Pillow)\n"
        )
    if r.skipped:
        first = r.skipped[0][1].removeprefix(_WHO + ": ")
        sys.stderr.write(
            f"{_WHO}: skipped {len(r.skipped)} image(s) that cannot be read (--on-error skip); "
            f"first: {first}\n"
        )


def main(argv: Optional[Iterable[str]] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    p = _build_parser()
    a, out = _resolve(p, argv)
    common = dict(progress=not a.quiet, write_index=not a.no_index)
    try:
        if a.arrays is not None:
            r = _write_arrays(
                a.arrays,
                a.names,
                out,
                a.maxcount,
                a.prefix,
                shuffle_seed=a.shuffle,
                overwrite=a.overwrite,
                **common,
            )
        else:
            r = _write_image_folder(
                a.inputs[0],
                out,
                a.maxcount,
                a.prefix,
                a.shuffle,
                on_error=a.on_error,
                overwrite=a.overwrite,
                verify=not a.no_verify,
                **common,
            )
    except WriteShardsError as e:
        sys.stderr.write(f"{e}\n")
        return e.exit_code
    except OSError as e:  # the output cannot be written: disk full, permissions, ...
        where = f" '{e.filename}'" if e.filename else ""
        sys.stderr.write(f"{_WHO}: cannot write{where}: {e.strerror or e}\n")
        return 1
    except KeyboardInterrupt:
        sys.stderr.write(f"{_WHO}: interrupted; '{out}' is unchanged\n")
        return 130
    _print_report(r, out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
