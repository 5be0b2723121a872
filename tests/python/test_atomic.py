"""torchspeed's one atomic file write, in Python (torchspeed._atomic) and in C++
(csrc/core/atomic_file.h), and the places that use it: a target that is not a regular file (a
FIFO, a directory, a symlink to one) is refused and left as it was, write errors are raised with
the old file kept, temporaries are unique per call and the stale ones of a killed writer found.
Never run on a real device: every special file here is made in tmp_path."""

from __future__ import annotations

import errno
import io
import os
import subprocess
import sys
import tarfile
import threading

import pytest

from torchspeed import _atomic
from torchspeed._atomic import NotARegularFileError, atomic_write


def _specials(tmp_path):
    """A FIFO, a directory, a symlink to each and a dangling symlink, made here."""
    fifo, folder = tmp_path / "fifo", tmp_path / "folder"
    os.mkfifo(fifo)
    folder.mkdir()
    (tmp_path / "to_fifo").symlink_to(fifo)
    (tmp_path / "to_folder").symlink_to(folder)
    (tmp_path / "dangling").symlink_to(tmp_path / "missing")
    return {
        "fifo": "is a FIFO, not a regular file",
        "folder": "is a directory, not a regular file",
        "to_fifo": "is a symlink to a FIFO",
        "to_folder": "is a symlink to a directory",
        "dangling": "is a dangling symlink",
    }


def _state(tmp_path):
    return sorted((p.name, p.is_symlink(), p.is_fifo(), p.is_dir()) for p in tmp_path.iterdir())


def test_atomic_write_refuses_what_is_not_a_regular_file(tmp_path):
    cases = _specials(tmp_path)
    before = _state(tmp_path)
    for name, match in cases.items():
        with pytest.raises(NotARegularFileError, match=match):
            atomic_write(tmp_path / name, b"x", who="test")
    assert _state(tmp_path) == before  # nothing replaced, no temporary left
    with pytest.raises(NotARegularFileError, match="must name a file"):
        atomic_write("", b"x")


def test_atomic_write_replaces_a_regular_file_and_follows_a_symlink_to_one(tmp_path):
    target = tmp_path / "a.txt"
    atomic_write(target, "one")
    os.chmod(target, 0o640)
    atomic_write(target, lambda f: f.write(b"two"))
    assert target.read_bytes() == b"two" and (target.stat().st_mode & 0o777) == 0o640
    (tmp_path / "link").symlink_to(target)
    atomic_write(tmp_path / "link", b"three")
    assert (tmp_path / "link").is_symlink() and target.read_bytes() == b"three"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.txt", "link"]


def test_atomic_write_raises_write_errors_and_keeps_the_old_file(tmp_path, monkeypatch):
    target = tmp_path / "a.txt"
    atomic_write(target, b"old")

    def enospc(fd):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "fsync", enospc)
    with pytest.raises(OSError, match="No space left"):
        atomic_write(target, b"new")
    monkeypatch.undo()

    def broken(f):
        f.write(b"half")
        raise ValueError("the writer failed")

    with pytest.raises(ValueError, match="the writer failed"):
        atomic_write(target, broken)
    assert target.read_bytes() == b"old" and [p.name for p in tmp_path.iterdir()] == ["a.txt"]


_FSIZE = r"""
import resource, signal, sys
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
resource.setrlimit(resource.RLIMIT_FSIZE, (32, resource.RLIM_INFINITY))
{body}
"""


def _run_with_a_file_size_limit(body: str, *args) -> subprocess.CompletedProcess:
    """A real write error (EFBIG past RLIMIT_FSIZE: 32 bytes), without a full disk or a device."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    return subprocess.run(
        [sys.executable, "-c", _FSIZE.format(body=body), *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_a_real_write_error_is_reported_by_the_python_and_the_cpp_writers(tmp_path):
    py, trace = tmp_path / "big.bin", tmp_path / "trace.json"
    py.write_bytes(b"old")
    trace.write_text("old")
    r = _run_with_a_file_size_limit(
        "from torchspeed._atomic import atomic_write\n"
        "try:\n    atomic_write(sys.argv[1], b'x' * 100000)\n"
        "except OSError as e:\n    print('raised', e.errno)\n",
        str(py),
    )
    assert r.stdout.strip() == f"raised {errno.EFBIG}", r.stderr
    r = _run_with_a_file_size_limit(
        "import torchspeed.profile as P\n"
        "try:\n    P.export_chrome_trace(sys.argv[1])\n"
        "except RuntimeError as e:\n    print('raised', e)\n",
        str(trace),
    )
    assert r.stdout.startswith("raised torchspeed.profile.export_chrome_trace: cannot write"), (
        r.stdout + r.stderr
    )
    assert py.read_bytes() == b"old" and trace.read_text() == "old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["big.bin", "trace.json"]


def test_threads_writing_one_path_all_succeed(tmp_path):
    target = tmp_path / "same.bin"
    errors, barrier = [], threading.Barrier(8)

    def worker(i):
        barrier.wait()
        for _ in range(20):
            try:
                atomic_write(target, bytes([i]) * 10000)
            except Exception as e:  # noqa: BLE001 (the test counts every failure)
                errors.append(e)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    data = target.read_bytes()
    assert errors == [] and len(data) == 10000 and data == data[:1] * 10000
    assert [p.name for p in tmp_path.iterdir()] == ["same.bin"]


def test_stale_temporaries_are_those_of_dead_writers_only(tmp_path):
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True)  # fmt: skip
    dead_pid = int(dead.stdout)
    host = _atomic._HOST
    names = {
        f".a.pt.tmp-{host}-{dead_pid}-1-0123abcd": True,  # its writer is gone
        f".a.pt.tmp-{dead_pid}": True,  # the old format (pid only)
        f".a.pt.tmp-{host}-{os.getppid()}-1-0123abcd": False,  # a live process
        f".a.pt.tmp-{host}-{os.getpid()}-1-0123abcd": True,  # ours, but no write uses it
        f".a.pt.tmp-otherhost-{dead_pid}-1-0123abcd": False,  # another machine's: not judged
        f".b.pt.tmp-{host}-{dead_pid}-1-0123abcd": False,  # not a name asked for
        "a.pt": False,
    }
    for n in names:
        (tmp_path / n).write_bytes(b"x")
    got = sorted(os.path.basename(p) for p in _atomic.remove_stale_temps(tmp_path, [r"a\.pt"]))
    assert got == sorted(n for n, stale in names.items() if stale)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        n for n, s in names.items() if not s
    )


# ---- the writers that use it ----------------------------------------------------------------------


def test_chrome_trace_export_refuses_a_fifo_a_directory_and_symlinks(tmp_path):
    """Issue 23 item 2: the trace went to <path>.tmp and was renamed over the node."""
    import torchspeed.profile as P

    cases = _specials(tmp_path)
    before = _state(tmp_path)
    for name, match in cases.items():
        with pytest.raises(RuntimeError, match=match):
            P.export_chrome_trace(str(tmp_path / name))
    assert _state(tmp_path) == before
    assert P.export_chrome_trace(str(tmp_path / "t.json")) == str(tmp_path / "t.json")


def test_png_writers_refuse_a_fifo_and_write_exactly_the_path(tmp_path):
    pytest.importorskip("matplotlib")
    import torchspeed.profile as P
    from torchspeed.profile.report import write_png

    with P.StepProfiler() as prof:
        for _ in range(4):
            prof.step()
    hist = prof.history()
    # write_png adds ".png" to a name without a suffix (as matplotlib does), so the special
    # files are named with it; a folder is refused before drawing (ValueError, see
    # profile/test_profile_report.py), a symlink to one too.
    cases = {k: v for k, v in _specials(tmp_path).items() if k not in ("folder", "to_folder")}
    os.rename(tmp_path / "fifo", tmp_path / "fifo.png")
    for name in ("to_fifo", "dangling"):
        target = os.readlink(tmp_path / name).replace(f"{os.sep}fifo", f"{os.sep}fifo.png")
        os.remove(tmp_path / name)
        os.symlink(target, tmp_path / f"{name}.png")
    before = _state(tmp_path)
    for name, match in cases.items():
        with pytest.raises(NotARegularFileError, match=match):
            write_png(hist, tmp_path / f"{name}.png")
    assert _state(tmp_path) == before
    assert write_png(hist, tmp_path / "steps.png") == str(tmp_path / "steps.png")
    assert (tmp_path / "steps.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def _tar(path, n=2):
    with tarfile.open(path, "w") as tf:
        for i in range(n):
            data = b"%d" % i
            info = tarfile.TarInfo(f"s{i}.cls")
            info.size = len(data)
            tf.addfile(info, io.BytesIO(data))


def test_shard_index_write_refuses_a_fifo(tmp_path):
    """The .idx file is written by the C++ helper (csrc/data/sources.cpp)."""
    from torchspeed._native import native_module

    data = native_module("data")
    shard = tmp_path / "a.tar"
    _tar(shard)
    os.mkfifo(tmp_path / "a.tar.idx")
    with pytest.raises(RuntimeError, match="is a FIFO, not a regular file"):
        data.write_shard_index(str(shard))
    assert (tmp_path / "a.tar.idx").is_fifo()
    os.unlink(tmp_path / "a.tar.idx")
    data.write_shard_index(str(shard))
    assert (tmp_path / "a.tar.idx").is_file()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.tar", "a.tar.idx"]


def test_staged_shards_refuse_a_fifo_destination_and_change_nothing(tmp_path):
    """write_shards moves its staged files in with the same refusal, checked for every file
    before the first is moved or an old shard removed (--overwrite)."""
    import numpy as np

    from torchspeed.data.write_shards import write_arrays

    arr = tmp_path / "x.npy"
    np.save(arr, np.arange(12, dtype=np.float32).reshape(6, 2))
    out = tmp_path / "out"
    write_arrays([str(arr)], None, str(out), maxcount=3, progress=False)
    os.unlink(out / "shard-000001.tar")
    os.mkfifo(out / "shard-000001.tar")
    before = _state(out)
    with pytest.raises(NotARegularFileError, match="shard-000001.tar' is a FIFO"):
        write_arrays([str(arr)], None, str(out), maxcount=3, progress=False, overwrite=True)
    assert _state(out) == before  # the old shard 0 and its index kept, no staging folder left
