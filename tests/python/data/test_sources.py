"""Shard files under the loader: truncation/rewrite while in use, stale indexes, Ctrl-C while indexing."""

import os
import signal
import subprocess
import sys
import textwrap
import time
import warnings

import numpy as np
import pytest
import torch
from data_helpers import D, write_tar  # write_tar: mtime 0, headers depend on name and size only

from torchspeed.data import DataLoader, NpySource, WebDataset


def text_samples(n, prefix="k", size=lambda i: 100 + 37 * i):
    """n samples '<prefix><i>.txt' with distinct contents of distinct sizes."""
    return [
        (f"{prefix}{i:04d}.txt", (f"{prefix}{i:04d}:" * 10_000).encode()[: size(i)])
        for i in range(n)
    ]


def read_all(ds, on_error="raise"):
    """{key: txt} of every sample, and the loader's stats."""
    dl = DataLoader(ds, batch_size=5, num_workers=2, on_error=on_error)
    out = {}
    for b in dl:
        keys, texts = b  # fields given as a list: batches are tuples in that order
        for k, t in zip(keys, texts):
            out[k] = t
    return out, dl.stats()


def expected(members):
    return {name.rsplit(".", 1)[0]: data.decode() for name, data in members}


def run_child(code, *args, timeout=120):
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code), *map(str, args)],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
    )


# ----------------------------------------------------------------- files changing under the loader
TRUNCATE_TAR = """
    import os, sys
    from torchspeed.data import DataLoader, WebDataset
    path, on_error = sys.argv[1], sys.argv[2]
    dl = DataLoader(WebDataset(path, fields=["txt"]), batch_size=4, num_workers=1,
                    on_error=on_error)
    it = iter(dl)
    next(it)
    os.truncate(path, 8192)  # mid-epoch: most samples lie past the new end
    n = 1
    try:
        for _ in it:
            n += 1
    except RuntimeError as e:
        print("ERROR", e)
        sys.exit(0)
    st = dl.stats()
    print("END", n, st["skipped"], st["last_error"])
"""


def big_text_shard(path, n=200, size=8192):
    members = [(f"s{i:04d}.txt", bytes([65 + i % 26]) * size) for i in range(n)]
    write_tar(path, members)


def test_tar_truncated_mid_epoch_raises_naming_the_shard(tmp_path):
    path = tmp_path / "shard.tar"
    big_text_shard(path)
    r = run_child(TRUNCATE_TAR, path, "raise")
    # Before the loader read with pread, this died of SIGBUS (returncode -7).
    assert r.returncode == 0, (r.returncode, r.stderr[-3000:])
    assert r.stdout.startswith("ERROR"), r.stdout
    assert str(path) in r.stdout and "truncated" in r.stdout, r.stdout


def test_tar_truncated_mid_epoch_skip_counts_the_samples(tmp_path):
    path = tmp_path / "shard.tar"
    big_text_shard(path)
    r = run_child(TRUNCATE_TAR, path, "skip")
    assert r.returncode == 0, (r.returncode, r.stderr[-3000:])
    assert r.stdout.startswith("END"), r.stdout
    _, batches, skipped, last_error = r.stdout.split(" ", 3)
    # 200 samples; the ring holds at most a few batches, everything after the cut is skipped.
    assert int(skipped) >= 150 and int(skipped) + 4 * int(batches) >= 200, r.stdout
    assert str(path) in last_error, r.stdout


def test_tar_rewritten_in_place_same_size_is_an_error(tmp_path):
    path = tmp_path / "shard.tar"
    a = [(f"s{i:04d}.txt", bytes([65 + i % 26]) * (1000 + i)) for i in range(200)]
    write_tar(path, a)
    b_path = tmp_path / "other.tar"
    write_tar(b_path, [(f"t{i:04d}.txt", b"z" * (1000 + i)) for i in reversed(range(200))])
    assert os.path.getsize(b_path) == os.path.getsize(path)
    code = """
        import sys
        from torchspeed.data import DataLoader, WebDataset
        path, other = sys.argv[1], sys.argv[2]
        dl = DataLoader(WebDataset(path, fields=["__key__", "txt"]), batch_size=4, num_workers=1)
        it = iter(dl)
        next(it)
        with open(path, "r+b") as f:  # same inode, same size, other members
            f.write(open(other, "rb").read())
        try:
            for b in it:
                for k, t in zip(*b):
                    if not (k.startswith("s") and set(t) == {chr(65 + int(k[1:]) % 26)}):
                        print("GARBAGE", k, t[:20])
                        sys.exit(0)
        except RuntimeError as e:
            print("ERROR", e)
            sys.exit(0)
        print("END")
    """
    r = run_child(code, path, b_path)
    assert r.returncode == 0, (r.returncode, r.stderr[-3000:])
    assert r.stdout.startswith("ERROR"), r.stdout
    assert str(path) in r.stdout and "rewritten" in r.stdout, r.stdout


def test_npy_truncated_mid_epoch_raises_naming_the_file(tmp_path):
    path = tmp_path / "x.npy"
    np.save(path, np.arange(4096 * 256, dtype=np.float32).reshape(4096, 256))
    code = """
        import os, sys
        from torchspeed.data import DataLoader, NpySource
        path = sys.argv[1]
        dl = DataLoader(NpySource(path), batch_size=64, num_workers=1)
        it = iter(dl)
        next(it)
        os.truncate(path, 4096)
        try:
            for _ in it:
                pass
        except RuntimeError as e:
            print("ERROR", e)
            sys.exit(0)
        print("END")
    """
    r = run_child(code, path)
    # Before, the mapping of the cut pages raised SIGBUS (returncode -7).
    assert r.returncode == 0, (r.returncode, r.stderr[-3000:])
    assert r.stdout.startswith("ERROR"), r.stdout
    assert str(path) in r.stdout and "truncated" in r.stdout, r.stdout


def test_npy_rows_read_exactly(tmp_path):
    path = tmp_path / "x.npy"
    ref = np.random.default_rng(0).standard_normal((301, 3, 5)).astype(np.float32)
    np.save(path, ref)
    dl = DataLoader(NpySource(path), batch_size=64, shuffle=True, seed=3, num_workers=2)
    rows = {}
    for b in dl:
        assert b.shape[1:] == (3, 5)
        for r in b:
            rows[float(r[0, 0])] = r
    assert len(rows) == 301
    got = torch.stack([rows[float(x)] for x in ref[:, 0, 0]])
    torch.testing.assert_close(got, torch.from_numpy(ref), rtol=0, atol=0)


def test_fifo_shard_is_refused_not_waited_on(tmp_path):
    fifo = tmp_path / "shard.tar"
    os.mkfifo(fifo)
    code = """
        import sys
        from torchspeed.data import WebDataset
        try:
            WebDataset(sys.argv[1], fields=["txt"])
        except RuntimeError as e:
            print("ERROR", e)
    """
    r = run_child(code, fifo, timeout=60)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "not a regular file" in r.stdout and str(fifo) in r.stdout, r.stdout


# ----------------------------------------------------------------------------------- stale indexes
def test_stale_index_same_size_other_order_is_rebuilt(tmp_path):
    path = str(tmp_path / "shard.tar")
    a = text_samples(50)
    write_tar(path, a)
    assert D.write_shard_index(path) == 50
    b = list(reversed(a))  # same members, other order: same size, every offset moves
    time.sleep(0.01)
    write_tar(path, b)
    with pytest.warns(UserWarning, match="ignoring the index .*modified after the index"):
        ds = WebDataset(path, fields=["__key__", "txt"])
    got, st = read_all(ds)
    # Before: the index was trusted on its size alone and 49 of 50 samples had others' bytes.
    assert got == expected(b) and st["skipped"] == 0


def test_stale_index_with_kept_mtime_is_caught_by_header_check(tmp_path):
    path = str(tmp_path / "shard.tar")
    a = text_samples(50)
    write_tar(path, a)
    D.write_shard_index(path)
    st = os.stat(path)
    b = text_samples(50, prefix="q")  # other members, same sizes (rsync -t, tar -x keep mtimes)
    write_tar(path, b)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    with pytest.warns(UserWarning, match="ignoring the index .*tar header at offset 0"):
        ds = WebDataset(path, fields=["__key__", "txt"])
    got, _ = read_all(ds)
    assert got == expected(b)


def test_stale_index_missed_by_spot_checks_fails_per_sample_never_silently(tmp_path):
    path = str(tmp_path / "shard.tar")
    a = text_samples(50, size=lambda i: 300)  # equal sizes: swapping two keeps every offset
    write_tar(path, a)
    D.write_shard_index(path)
    st = os.stat(path)
    b = list(a)
    b[3], b[4] = b[4], b[3]  # not among the spot-checked members (0, 7, ..., 49)
    write_tar(path, b)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        ds = WebDataset(path, fields=["__key__", "txt"])
    got, stats = read_all(ds, on_error="skip")
    want = expected(b)
    assert stats["skipped"] == 2
    assert "rewritten after it was indexed" in stats["last_error"] and path in stats["last_error"]
    assert set(got) == set(want) - {"k0003", "k0004"}
    assert all(got[k] == want[k] for k in got)
    with pytest.raises(RuntimeError, match="rewritten after it was indexed"):
        read_all(ds, on_error="raise")


def test_old_index_format_is_rebuilt_with_a_warning(tmp_path):
    path = str(tmp_path / "shard.tar")
    a = text_samples(20)
    write_tar(path, a)
    D.write_shard_index(path)
    with open(path + ".idx", "r+b") as f:
        assert f.read(8) == b"TSIDX003"
        f.seek(5)
        f.write(b"002")
    with pytest.warns(UserWarning, match="format version '002' is not supported"):
        ds = WebDataset(path, fields=["__key__", "txt"])
    assert read_all(ds)[0] == expected(a)


def test_fresh_index_is_used_without_warning(tmp_path):
    path = str(tmp_path / "shard.tar")
    a = text_samples(20)
    write_tar(path, a)
    D.write_shard_index(path)
    with open(path + ".idx", "rb") as f:
        idx = f.read()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        ds = WebDataset(path, fields=["__key__", "txt"])
    assert read_all(ds)[0] == expected(a)
    assert not [n for n in os.listdir(tmp_path) if ".tmp" in n]  # no temporary left
    assert len(idx) > 8


# ------------------------------------------------------------------------ Ctrl-C during indexing
def test_ctrl_c_stops_indexing_many_shards(tmp_path):
    # One sample and 4,000 ignored (extension-less) members: every scan of it takes milliseconds,
    # so indexing 3,000 of them takes seconds without an interrupt check.
    path = str(tmp_path / "pad.tar")
    members = [("real.txt", b"x")] + [(f"pad{i:05d}", b"") for i in range(4000)]
    write_tar(path, members)
    code = """
        import sys, time
        from torchspeed.data import WebDataset
        urls = [sys.argv[1]] * 3000
        print("READY", flush=True)
        t = time.perf_counter()
        try:
            WebDataset(urls, fields=["txt"])
        except KeyboardInterrupt:
            print("INTERRUPTED", time.perf_counter() - t, flush=True)
            sys.exit(0)
        print("DONE", time.perf_counter() - t, flush=True)
    """
    p = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(code), path],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert p.stdout.readline().strip() == "READY"
        time.sleep(0.3)
        p.send_signal(signal.SIGINT)
        t0 = time.monotonic()
        out, err = p.communicate(timeout=60)
        elapsed = time.monotonic() - t0
    finally:
        p.kill()
    assert p.returncode == 0, (p.returncode, err[-3000:])
    assert out.startswith("INTERRUPTED"), out
    assert elapsed < 1.0, f"exited {elapsed:.2f} s after SIGINT"


def test_a_build_without_the_data_area_says_which_option_builds_it(monkeypatch, tmp_path):
    # As a TORCHSPEED_WITH_DATA=OFF build: torchspeed._C has no data module.
    import torchspeed
    from torchspeed._native import AreaNotBuiltError
    from torchspeed.data import TensorSource
    from torchspeed.data.shard_writer import ShardWriter

    monkeypatch.delattr(torchspeed._C, "data")
    for make in (
        lambda: TensorSource(torch.zeros(4)),
        lambda: NpySource(str(tmp_path / "x.npy")),
        lambda: WebDataset(str(tmp_path / "x.tar"), fields=("txt",)),
    ):
        with pytest.raises(AreaNotBuiltError, match="TORCHSPEED_WITH_DATA=ON"):
            make()
    # Writing shards needs no native code: they are written, without their .tar.idx index.
    with ShardWriter(str(tmp_path / "out")) as w:
        w.write("a", {"txt": b"x"})
    assert os.path.exists(w.paths[0]) and not os.path.exists(w.paths[0] + ".idx")
