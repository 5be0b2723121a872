"""torchspeed.data.DataLoader: determinism, resume, errors, skip counts, torch parity, writer."""

import os
import subprocess
import sys
import warnings

import numpy as np
import pytest
import torch

torchspeed = pytest.importorskip("torchspeed")
if not hasattr(torchspeed._C, "data"):
    pytest.skip("torchspeed built without the data loader", allow_module_level=True)
from data_helpers import Image, assert_matches_pil, make_shards, pil_pipeline, textured  # noqa: E402

from torchspeed.data import DataLoader, DevicePrefetcher, NpySource, TensorSource, WebDataset  # noqa: E402

D = torchspeed._C.data
needs_jpeg = pytest.mark.skipif(not D.with_jpeg, reason="built without libjpeg-turbo")


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    return make_shards(str(tmp_path_factory.mktemp("shards")), n_shards=3, per_shard=12)


def collect(loader, n=None):
    out = []
    for i, b in enumerate(loader):
        if n is not None and i >= n:
            break
        out.append(tuple(x.clone() if isinstance(x, torch.Tensor) else list(x) for x in b))
    return out


def assert_same(a, b):
    assert len(a) == len(b)
    for x, y in zip(a, b):
        for u, v in zip(x, y):
            if isinstance(u, torch.Tensor):
                assert torch.equal(u, v)
            else:
                assert u == v


def wds(urls, **kw):
    kw.setdefault("size", 40)
    kw.setdefault("flip_prob", 0.5)
    return WebDataset(urls, fields=("jpg;png", "cls", "__key__"), **kw)


@needs_jpeg
def test_batches_identical_for_1_2_4_workers(shards):
    runs = []
    for w in (1, 2, 4):
        dl = DataLoader(wds(shards), batch_size=5, shuffle=True, num_workers=w, seed=3)
        runs.append(collect(dl))
        assert len(runs[-1]) == len(dl) == 8  # 36 samples
        second = collect(dl)  # next epoch: different order and draws
        assert [b[2] for b in second] != [b[2] for b in runs[-1]]
    assert_same(runs[0], runs[1])
    assert_same(runs[0], runs[2])
    imgs, labels, keys = runs[0][0]
    assert imgs.shape == (5, 3, 40, 40) and imgs.dtype == torch.uint8
    assert labels.tolist() == [int(k.split("/")[1]) % 10 for k in keys]


@needs_jpeg
def test_pixels_equal_pil_reference_given_the_draws(shards):
    ds = wds(shards, scale=(0.3, 1.0))
    dl = DataLoader(ds, batch_size=6, shuffle=True, num_workers=2, seed=11)
    dl.set_epoch(4)
    import tarfile

    members = {}
    for u in shards:
        with tarfile.open(u) as tf:
            for m in tf.getmembers():
                members[m.name] = tf.extractfile(m).read()
    imgs, labels, keys = next(iter(dl))
    for r, key in enumerate(keys):
        jpg = members[key + ".jpg"]
        w, h = Image.open(__import__("io").BytesIO(jpg)).size
        idx = int(key.split("/")[1])  # dataset index == position in the shard list here
        draw = D.draw_image_params(ds.image_options, w, h, True, 11, 4, idx)
        assert_matches_pil(imgs[r], pil_pipeline(jpg, ds.image_options, draw, (40, 40)))


@needs_jpeg
@pytest.mark.parametrize("workers_after", [1, 3])
def test_resume_mid_epoch_with_other_worker_count(shards, workers_after):
    full = DataLoader(wds(shards), batch_size=4, shuffle=True, num_workers=2, seed=5)
    full.set_epoch(2)
    all_batches = collect(full)
    first = DataLoader(wds(shards), batch_size=4, shuffle=True, num_workers=2, seed=5)
    first.set_epoch(2)
    it = iter(first)
    head = [next(it) for _ in range(3)]
    state = first.state_dict()
    assert state["epoch"] == 2 and state["batches_consumed"] == 3
    assert len(state) <= 10  # small
    second = DataLoader(wds(shards), batch_size=4, shuffle=True, num_workers=workers_after, seed=5)
    second.load_state_dict(state)
    assert_same(collect(second), all_batches[3:])
    assert len(head) == 3
    # After the resumed epoch, the next one is epoch 3, as in the uninterrupted run.
    full_next = collect(full)
    assert_same(collect(second), full_next)


@needs_jpeg
def test_corrupt_jpeg_raises_with_shard_and_key(tmp_path):
    urls = make_shards(str(tmp_path), 2, 6, corrupt={"s01/000008"})
    dl = DataLoader(wds(urls), batch_size=4, num_workers=2, seed=0)
    it = iter(dl)
    assert len(next(it)[0]) == 4
    with pytest.raises(RuntimeError) as e:
        next(it)  # batch 1 holds samples 4..7; batch 2 holds 8..11
        next(it)
    msg = str(e.value)
    assert "shard-000001.tar" in msg and "s01/000008" in msg and "JPEG" in msg


@needs_jpeg
def test_skip_counts_and_reports(tmp_path):
    urls = make_shards(str(tmp_path), 2, 6, corrupt={"s00/000002", "s01/000009"})
    dl = DataLoader(wds(urls), batch_size=4, num_workers=2, seed=0, on_error="skip")
    with pytest.warns(UserWarning, match="skipped 2 sample"):
        batches = collect(dl)
    assert sum(len(b[2]) for b in batches) == 10
    assert "s00/000002" not in sum((b[2] for b in batches), [])
    assert dl.stats()["skipped"] == 2


@needs_jpeg
def test_truncated_tar_and_missing_file(tmp_path):
    urls = make_shards(str(tmp_path), 1, 8)
    data = open(urls[0], "rb").read()
    with open(urls[0], "wb") as f:
        f.write(data[: len(data) // 2])
    dl = DataLoader(wds(urls), batch_size=2, num_workers=2, seed=0)
    with pytest.raises(RuntimeError, match=r"shard-000000\.tar.*(truncated|checksum)"):
        collect(dl)
    dl = DataLoader(wds(urls), batch_size=2, num_workers=2, seed=0, on_error="skip")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        got = collect(dl)
    assert 0 < sum(len(b[2]) for b in got) < 8
    assert dl.stats()["skipped"] >= 1
    with pytest.raises(RuntimeError, match=r"missing\.tar.*No such file"):
        wds([str(tmp_path / "missing.tar")])


@needs_jpeg
def test_distributed_ranks_partition(shards):
    seen = []
    for rank in range(3):
        dl = DataLoader(wds(shards), batch_size=4, shuffle=True, seed=1, rank=rank, world_size=3)
        seen += sum((b[2] for b in collect(dl)), [])
    assert len(seen) == 36 and len(set(seen)) == 36


@needs_jpeg
def test_sampler_order_is_used(shards):
    order = list(range(35, -1, -3))
    dl = DataLoader(wds(shards), batch_size=4, sampler=order, num_workers=2, seed=0)
    keys = sum((b[2] for b in collect(dl)), [])
    assert [int(k.split("/")[1]) for k in keys] == order
    assert len(dl) == 3


class SquareDataset(torch.utils.data.Dataset):
    def __len__(self):
        return 50

    def __getitem__(self, i):
        return torch.tensor([i, i * i], dtype=torch.float32), i % 3


@pytest.mark.parametrize("workers", [0, 2])
def test_python_dataset_matches_torch_batch_for_batch(workers):
    kw = dict(batch_size=7, shuffle=True, num_workers=workers)
    ours = DataLoader(SquareDataset(), generator=torch.Generator().manual_seed(4), **kw)
    ref = torch.utils.data.DataLoader(
        SquareDataset(), generator=torch.Generator().manual_seed(4), **kw
    )
    a, b = list(ours), list(ref)
    assert len(a) == len(b) == len(ours) == 8
    for (x1, y1), (x2, y2) in zip(a, b):
        assert torch.equal(x1, x2) and torch.equal(y1, y2)
    with pytest.raises(NotImplementedError):
        ours.state_dict()


def test_tensor_source_equals_default_collate():
    x = torch.randn(103, 3, 4)
    y = torch.arange(103)
    ours = DataLoader(TensorSource(x, y), batch_size=10, num_workers=2)
    ref = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=10)
    a, b = list(ours), list(ref)
    assert len(a) == len(b) == 11
    for (x1, y1), (x2, y2) in zip(a, b):
        assert torch.equal(x1, x2) and torch.equal(y1, y2)
    # Shuffled: same rows as an index_select of the loader's order, for any worker count.
    s1 = collect(DataLoader(TensorSource(x, y), batch_size=10, shuffle=True, seed=2, num_workers=1))
    s3 = collect(DataLoader(TensorSource(x, y), batch_size=10, shuffle=True, seed=2, num_workers=3))
    assert_same(s1, s3)
    for xb, yb in s1:
        assert torch.equal(xb, x[yb])


def test_kept_batches_are_not_overwritten():
    x = torch.arange(400.0).reshape(100, 4)
    dl = DataLoader(
        TensorSource(x), batch_size=4, shuffle=True, seed=0, num_workers=2, prefetch_factor=1
    )
    kept = list(dl)  # hold every batch while the ring keeps going
    assert torch.equal(torch.cat(kept).sort(0).values, x)


def test_npy_source(tmp_path):
    a = np.arange(60, dtype=np.float32).reshape(20, 3)
    b = np.arange(20, dtype=np.int64)
    np.save(tmp_path / "a.npy", a)
    np.save(tmp_path / "b.npy", b)
    dl = DataLoader(
        NpySource({"a": str(tmp_path / "a.npy"), "b": str(tmp_path / "b.npy")}),
        batch_size=6,
        shuffle=True,
        seed=1,
        num_workers=2,
    )
    n = 0
    for batch in dl:
        assert torch.equal(batch["a"], torch.from_numpy(a)[batch["b"]])
        n += len(batch["b"])
    assert n == 20
    np.save(tmp_path / "c.npy", np.zeros((19, 2)))
    with pytest.raises(RuntimeError, match="c.npy.*19 samples"):
        NpySource([str(tmp_path / "a.npy"), str(tmp_path / "c.npy")])


def test_stats_and_repr():
    dl = DataLoader(TensorSource(torch.randn(64, 8)), batch_size=8, num_workers=2, seed=0)
    assert len(list(dl)) == 8
    st = dl.stats()
    for k in (
        "samples_per_s",
        "read_s",
        "decode_s",
        "transform_s",
        "collate_s",
        "copy_s",
        "consumer_wait_s",
        "mean_ready_batches",
        "slots",
        "skipped",
    ):
        assert k in st
    assert st["samples"] == 64 and st["slots"] == 2 * 2 + 2
    assert "num_workers=2" in repr(dl)


def _threads():
    return len(os.listdir("/proc/self/task"))


@pytest.mark.skipif(not os.path.isdir("/proc/self/task"), reason="needs /proc")
def test_dropping_the_iterator_stops_the_threads():
    import gc

    dl = DataLoader(TensorSource(torch.randn(4000, 8)), batch_size=4, num_workers=4, seed=0)
    before = _threads()
    it = iter(dl)
    next(it)
    assert _threads() >= before + 4
    del it
    gc.collect()
    assert _threads() == before
    # ... and the next iteration starts the following epoch with fresh threads.
    assert len(list(dl)) == 1000
    assert dl.epoch == 2


def test_device_prefetcher_passes_through_without_cuda():
    batches = [(torch.ones(2), {"a": torch.zeros(1)}, "meta")] * 3
    out = list(DevicePrefetcher(batches, device="cpu"))
    assert out == batches
    if not torch.cuda.is_available():
        assert not DevicePrefetcher(batches).enabled
    dl = DataLoader(TensorSource(torch.randn(10, 2)), batch_size=5, device="cpu", seed=0)
    assert len(list(dl)) == 2


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_device_prefetcher_cuda():
    x = torch.randn(64, 16)
    dl = DataLoader(TensorSource(x), batch_size=8, seed=0, device="cuda", pin_memory=True)
    got = torch.cat([b.cpu() for b in dl])
    assert got.shape == x.shape and torch.equal(got.sort(0).values, x.sort(0).values)


@needs_jpeg
def test_write_shards_cli(tmp_path):
    src = tmp_path / "imgs"
    for c, name in enumerate(["cat", "dog"]):
        (src / name).mkdir(parents=True)
        for i in range(5):
            Image.fromarray(textured(50, 40, seed=c * 10 + i)).save(src / name / f"{i}.jpg")
    Image.fromarray(textured(50, 40, seed=99)).save(src / "dog" / "x.png")
    out = tmp_path / "shards"
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(sys.path)
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "torchspeed.data.write_shards",
            str(src),
            str(out),
            "--maxcount",
            "4",
        ],
        capture_output=True,
        text=True,
        env=env,
    )
    assert r.returncode == 0, r.stderr
    tars = sorted(str(p) for p in out.glob("*.tar"))
    assert len(tars) == 3 and all(os.path.exists(t + ".idx") for t in tars)
    assert (out / "classes.txt").read_text().split() == ["cat", "dog"]
    dl = DataLoader(
        WebDataset(
            str(out / "shard-{000000..000002}.tar"),
            fields=("jpg;png", "cls"),
            crop="resize",
            size=(40, 50),
        ),
        batch_size=11,
    )
    ((imgs, labels),) = list(dl)
    assert imgs.shape == (11, 3, 40, 50)
    assert labels.tolist() == [0] * 5 + [1] * 6
