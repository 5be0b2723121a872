"""Image folders and image lists to shards (write_images, write_image_folder): torchvision
ImageFolder's classes and order, each image decoded once by the loader's own decoder, Pillow for
what it cannot store as it is."""

from __future__ import annotations

import io
import os
import random
from typing import List, Optional, Sequence, Tuple

from .shard_writer import (
    _WHO,
    BadSampleError,
    ShardWriter,
    WriteReport,
    _bad,
    _check_maxcount,
    _check_on_error,
    _check_output,
    _native_data,
    _note_foreign_tars,
    _progress,
    _run_staged,
    _usage,
)

# torchvision's ImageFolder extensions, so that a folder gives the same samples as ImageFolder.
IMG_EXTENSIONS = (".jpg", ".jpeg", ".png", ".ppm", ".bmp", ".pgm", ".tif", ".tiff", ".webp")


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
