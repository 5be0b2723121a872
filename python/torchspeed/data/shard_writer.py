"""Writing WebDataset tar shards: ShardWriter (numbered shards, each with its .tar.idx index), the
staging folder that makes a run all-or-nothing, WriteReport, and the errors write_shards reports.
Its users: image_folder.py and arrays.py (what goes into the samples), write_shards.py (the CLI)."""

from __future__ import annotations

import io
import os
import re
import shutil
import tarfile
import tempfile
from dataclasses import dataclass, field
from typing import List, Optional, Tuple

from .._atomic import check_target, replace_file
from .._native import native_module
from .._progress import progress_bar

_WHO = "torchspeed.data.write_shards"


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
    """torchspeed._C.data, or None: without the data area shards are still written, without their
    .tar.idx indexes and with Pillow's checks only."""
    try:
        return native_module("data")
    except ImportError:  # AreaNotBuiltError, or no native module at all
        return None


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
    # Shown on a terminal only: none when stderr is a file or a pipe.
    return progress_bar(total, "write_shards", "sample", enabled=enabled, terminal_only=True)


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


def _check_on_error(on_error: str) -> None:
    if on_error not in ("raise", "skip"):
        raise _usage(f"on_error must be 'raise' or 'skip', got {on_error!r}")


def _check_maxcount(maxcount: int) -> None:
    if isinstance(maxcount, bool) or not isinstance(maxcount, int) or maxcount < 1:
        raise _usage(f"maxcount must be an integer >= 1, got {maxcount!r}")
