"""The one way torchspeed writes a file in Python: a unique temporary beside it, fsynced, renamed.

    from ._atomic import atomic_write
    atomic_write("trace.json", b"...", who="torchspeed.profile")          # bytes or str
    atomic_write("steps.png", lambda f: fig.savefig(f, format="png"), who="torchspeed.profile")

A reader sees the old file or the new one, never half of one, and a crash keeps the old one.
The target must be absent or a regular file (a symlink to a regular file writes that file):
a directory, FIFO, socket, device or a symlink to one of them is refused with
:class:`NotARegularFileError` before anything is written, so an output path can never turn a
device node or a pipe into a plain file. Every write error (ENOSPC on write, fsync or close) is
raised, the temporary removed and the target left as it was.

Temporary names are unique per call (host, pid, thread, random): threads saving to one path all
succeed and the last rename wins. :func:`remove_stale_temps` removes what a killed writer left.
The C++ side has the same helper (csrc/core/atomic_file.h: traces, shard indexes).
"""

from __future__ import annotations

import errno
import os
import re
import secrets
import socket
import stat
import threading
from typing import Callable, Iterable, List, Set, Union

_HOST = re.sub(r"[^A-Za-z0-9]", "_", socket.gethostname() or "host")[:40] or "host"
# .<name>.tmp-<host>-<pid>-<thread>-<random>; the old checkpoint temps were .<name>.tmp-<pid>.
_TEMP = re.compile(
    r"\.(?P<name>.+)\.tmp-(?:(?P<host>[A-Za-z0-9_]+)-)?(?P<pid>\d+)(?:-\d+-[0-9a-f]{8,})?"
)
_in_flight: Set[str] = set()  # temporaries this process is writing now
_lock = threading.Lock()


class NotARegularFileError(OSError):
    """The target of a write exists and is not a regular file (nor a symlink to one)."""


def file_kind(mode: int) -> str:
    for test, name in (
        (stat.S_ISDIR, "a directory"),
        (stat.S_ISFIFO, "a FIFO"),
        (stat.S_ISSOCK, "a socket"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
    ):
        if test(mode):
            return name
    return "not a regular file"


def check_target(path, who: str = "torchspeed") -> str:
    """The file a write of ``path`` replaces: ``path`` itself, or the regular file a symlink
    points at. Raises NotARegularFileError when ``path`` exists and is anything else."""
    path = os.fsdecode(os.fspath(path))
    if path == "" or path.endswith(os.sep):
        raise NotARegularFileError(
            errno.EISDIR, f"{who}: the path must name a file, got {path!r}", path
        )
    try:
        lst = os.lstat(path)
    except FileNotFoundError:
        return path
    if stat.S_ISREG(lst.st_mode):
        return path
    if stat.S_ISLNK(lst.st_mode):
        try:
            st = os.stat(path)
        except FileNotFoundError:
            raise NotARegularFileError(
                errno.ENOENT,
                f"{who}: {path!r} is a dangling symlink; refusing to write through it",
                path,
            ) from None
        if stat.S_ISREG(st.st_mode):
            return os.path.realpath(path)
        what = f"a symlink to {file_kind(st.st_mode)}"
        code = errno.EISDIR if stat.S_ISDIR(st.st_mode) else errno.EINVAL
    else:
        what = file_kind(lst.st_mode)
        code = errno.EISDIR if stat.S_ISDIR(lst.st_mode) else errno.EINVAL
    raise NotARegularFileError(
        code, f"{who}: {path!r} is {what}, not a regular file; refusing to replace it", path
    )


def temp_path(target: str) -> str:
    """A fresh temporary name beside ``target``: ``.<name>.tmp-<host>-<pid>-<thread>-<random>``."""
    folder, name = os.path.split(target)
    tmp = f".{name}.tmp-{_HOST}-{os.getpid()}-{threading.get_ident()}-{secrets.token_hex(4)}"
    return os.path.join(folder, tmp)


def _fsync_dir(folder: str) -> None:
    try:
        fd = os.open(folder or ".", os.O_RDONLY | os.O_DIRECTORY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError as e:
        if e.errno not in (errno.EINVAL, errno.ENOTSUP, errno.EBADF):
            raise  # EIO: the rename may not be durable; say so
    finally:
        os.close(fd)


def atomic_write(
    path, content: Union[bytes, str, Callable], *, who: str = "torchspeed", fsync: bool = True
) -> str:
    """Writes ``content`` (bytes, str as UTF-8, or a function given the open binary file) to
    ``path`` atomically; returns ``path``. The folder must exist. See the module docstring."""
    path = os.fsdecode(os.fspath(path))
    target = check_target(path, who)
    if isinstance(content, str):
        content = content.encode("utf-8")
    try:
        old_mode = stat.S_IMODE(os.stat(target).st_mode)
    except FileNotFoundError:
        old_mode = None
    tmp = os.path.abspath(temp_path(target))
    with _lock:
        _in_flight.add(tmp)
    try:
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o666)
        except OSError as e:  # name the file asked for, not the temporary
            raise type(e)(e.errno, f"{who}: cannot write {path!r}: {e.strerror}", path) from None
        try:
            f = os.fdopen(fd, "wb")
        except BaseException:
            os.close(fd)
            raise
        try:
            with f:  # close() errors (a delayed ENOSPC on NFS) are raised too
                if callable(content):
                    content(f)
                else:
                    f.write(content)
                f.flush()
                if fsync:
                    os.fsync(f.fileno())
            if old_mode is not None:
                os.chmod(tmp, old_mode)
            check_target(path, who)  # changed while we wrote (a FIFO made since): refuse
            os.replace(tmp, target)
        except BaseException:
            try:
                os.unlink(tmp)
            except FileNotFoundError:
                pass
            raise
    finally:
        with _lock:
            _in_flight.discard(tmp)
    if fsync:
        _fsync_dir(os.path.dirname(target))
    return path


def replace_file(src, dst, *, who: str = "torchspeed") -> str:
    """Renames the finished file ``src`` over ``dst`` (same folder or same filesystem), with the
    same refusal as :func:`atomic_write` for a ``dst`` that is not a regular file."""
    target = check_target(dst, who)
    os.replace(src, target)
    return os.fspath(dst)


def _pid_alive(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def stale_temps(folder, names: Iterable[str] = ()) -> List[str]:
    """Temporaries in ``folder`` left by a writer on this host that is gone (killed during a
    write): their process no longer exists, or it is this process and no write uses them.
    ``names``: only temporaries of these target names (regexes, full match); all when empty."""
    patterns = [re.compile(n) for n in names]
    try:
        entries = os.listdir(folder)
    except (FileNotFoundError, NotADirectoryError):
        return []
    with _lock:
        busy = set(_in_flight)
    out = []
    for entry in entries:
        m = _TEMP.fullmatch(entry)
        if m is None or (patterns and not any(p.fullmatch(m["name"]) for p in patterns)):
            continue
        if m["host"] is not None and m["host"] != _HOST:
            continue  # another machine's writer on a shared filesystem: not ours to judge
        full = os.path.abspath(os.path.join(folder, entry))
        pid = int(m["pid"])
        if (pid == os.getpid() and full not in busy) or not _pid_alive(pid):
            out.append(full)
    return out


def remove_stale_temps(folder, names: Iterable[str] = ()) -> List[str]:
    """Removes :func:`stale_temps` (regular files only); returns the paths removed."""
    removed = []
    for p in stale_temps(folder, names):
        try:
            if stat.S_ISREG(os.lstat(p).st_mode):
                os.unlink(p)
                removed.append(p)
        except FileNotFoundError:
            pass
    return removed


__all__ = [
    "NotARegularFileError",
    "atomic_write",
    "check_target",
    "remove_stale_temps",
    "replace_file",
    "stale_temps",
    "temp_path",
]
