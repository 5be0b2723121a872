""".npy arrays to shards (write_arrays): sample i holds row i of each array, exact dtype and
shape."""

from __future__ import annotations

import io
import os
import random
from typing import List, Optional, Sequence

from .shard_writer import (
    ShardWriter,
    WriteReport,
    _bad,
    _check_maxcount,
    _check_output,
    _note_foreign_tars,
    _progress,
    _run_staged,
    _usage,
)

# .npy dtypes the loader reads (csrc/data/npy.cpp), as little-endian numpy dtype strings.
_NPY_DTYPES = ("|b1", "|u1", "|i1", "<i2", "<i4", "<i8", "<u2", "<f2", "<f4", "<f8")


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
