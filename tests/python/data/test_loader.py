"""torchspeed.data.DataLoader: determinism, resume, errors, skip counts, torch parity; and under
hostile use: resume states (hypothesis), per-sample text conversions inside the error policy,
set_epoch inside the loop, several iterators, samplers, and an exact skipped count."""

import gc
import os
import time
import warnings

import numpy as np
import pytest
import torch
from data_helpers import (
    D,
    Image,
    assert_matches_pil,
    make_shards,
    needs_jpeg,
    pil_pipeline,
    write_tar,
)
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from torchspeed.data import DataLoader, DevicePrefetcher, NpySource, TensorSource, WebDataset  # noqa: E402


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
        assert_matches_pil(imgs[r], pil_pipeline(jpg, ds.image_options, draw))


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


# ---- under hostile use ----------------------------------------------------------------------
N = 23  # samples; batch_size 4 -> 6 batches (5 with drop_last)


def tensor_loader(**kw):
    kw.setdefault("batch_size", 4)
    kw.setdefault("shuffle", True)
    kw.setdefault("num_workers", 2)
    kw.setdefault("seed", 5)
    return DataLoader(TensorSource(torch.arange(N) * 10), **kw)


def epoch_of(dl):
    return [b.tolist() for b in dl]


# ---- item 6: load_state_dict validates every field, in C++, before changing anything


def reference_accepts(state, mine):
    """The rules written out independently of the implementation (the test's oracle)."""
    keys = set(mine)
    if set(state) != keys:
        return False
    for k in ("seed", "dataset_size", "batch_size", "world_size", "shuffle", "drop_last"):
        if state[k] != mine[k]:
            return False
    per_epoch = 6  # 23 samples, batch_size 4, drop_last False
    return (
        0 <= state["rank"] < 1
        and 0 <= state["epoch"] < 2**63 - 1
        and 0 <= state["batches_consumed"] <= per_epoch
        and state["skipped"] >= 0
    )


INT64 = st.one_of(
    st.integers(-3, 8),
    st.sampled_from([-(2**63), 2**63 - 1, 2**62, -1, 2**31, 6, 7]),
    st.integers(-(2**63), 2**63 - 1),
)


@settings(
    max_examples=120,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    changes=st.dictionaries(
        st.sampled_from(
            [
                "epoch",
                "batches_consumed",
                "seed",
                "dataset_size",
                "batch_size",
                "world_size",
                "rank",
                "shuffle",
                "drop_last",
                "skipped",
                "bogus",
            ]
        ),
        INT64,
        max_size=3,
    ),
    drop=st.sets(st.sampled_from(["epoch", "batches_consumed", "skipped", "shuffle"]), max_size=1),
)
def test_load_state_dict_random_states_load_exactly_or_raise_leaving_loader_unchanged(
    changes, drop
):
    dl = tensor_loader()
    it = iter(dl)
    next(it)
    next(it)
    mine = dl.state_dict()
    assert mine["batches_consumed"] == 2
    state = dict(mine, **changes)
    for k in drop:
        state.pop(k, None)
    if reference_accepts(state, mine):
        dl.load_state_dict(state)
        assert dl.state_dict() == state
        if state["epoch"] < 2**40:  # the order of huge epochs is fine too, but compare cheaply
            ref = tensor_loader()
            ref.set_epoch(state["epoch"])
            assert epoch_of(dl) == epoch_of(ref)[state["batches_consumed"] :]
    else:
        with pytest.raises(ValueError, match=r"torchspeed\.data\.Loader\.load_state_dict"):
            dl.load_state_dict(state)
        assert dl.state_dict() == mine  # nothing changed
        assert [b.tolist() for b in it] == epoch_of(tensor_loader())[2:]  # and it still runs


def test_load_state_dict_rejects_the_segfault_inputs_with_clear_errors():
    dl = tensor_loader()
    good = dl.state_dict()
    cases = {
        "batches_consumed": (-1, r"batches_consumed must be in \[0, 6\].*got -1"),
        "epoch": (-1, r"epoch must be in \[0, 2\^63 - 1\), got -1"),
        "skipped": (-5, r"skipped must be >= 0, got -5"),
        "shuffle": (0, r"saved with shuffle=0, this loader has shuffle=1"),
    }
    for key, (value, msg) in cases.items():
        with pytest.raises(ValueError, match=msg):
            dl.load_state_dict(dict(good, **{key: value}))
    with pytest.raises(ValueError, match=r"batches_consumed must be in \[0, 6\].*got 4611"):
        dl.load_state_dict(dict(good, batches_consumed=2**62))
    with pytest.raises(ValueError, match="unexpected key 'epochs'"):
        dl.load_state_dict(dict(good, epochs=1))
    with pytest.raises(ValueError, match="missing key 'skipped'"):
        dl.load_state_dict({k: v for k, v in good.items() if k != "skipped"})
    with pytest.raises(TypeError, match="batches_consumed must be an integer, got float"):
        dl.load_state_dict(dict(good, batches_consumed=1.5))
    with pytest.raises(TypeError, match="epoch must be an integer, got str"):
        dl.load_state_dict(dict(good, epoch="1"))
    with pytest.raises(ValueError, match="epoch must fit in int64"):
        dl.load_state_dict(dict(good, epoch=2**70))
    with pytest.raises(TypeError, match="state must be a mapping"):
        dl.load_state_dict([("epoch", 0)])
    with pytest.raises(ValueError, match="epoch must be in"):
        dl.set_epoch(-3)
    # numpy and 0-dim tensor integers are integers; the skipped count round-trips.
    dl.load_state_dict(dict(good, epoch=np.int64(3), batches_consumed=torch.tensor(1), skipped=4))
    assert dl.state_dict() == dict(good, epoch=3, batches_consumed=1, skipped=4)
    assert dl.stats()["skipped"] == 4


def test_resume_from_another_rank_and_state_is_small():
    a = tensor_loader(world_size=2, rank=0)
    it = iter(a)
    next(it)
    state = a.state_dict()
    b = tensor_loader(world_size=2, rank=1)
    b.load_state_dict(state)  # one rank's state restores every rank
    ref = tensor_loader(world_size=2, rank=1)
    assert epoch_of(b) == epoch_of(ref)[1:]
    with pytest.raises(ValueError, match=r"rank must be in \[0, 2\), got 2"):
        b.load_state_dict(dict(state, rank=2))


# ---- item 9: per-sample text conversions inside the error policy; stats() never raises


def text_shard(path, bad):
    """Samples <key>.cls + <key>.txt; keys in `bad` map to 'cls' or 'txt': that field gets
    bytes that are not UTF-8 (the .cls also not an integer)."""
    members = []
    for i in range(12):
        key = f"k{i:03d}"
        cls, txt = str(i).encode(), f"sample {i} é".encode()
        if bad.get(key) == "cls":
            cls = b"\xff\xfe1"
        if bad.get(key) == "txt":
            txt = b"caf\xe9 \xff"
        members += [(key + ".cls", cls), (key + ".txt", txt)]
    write_tar(path, members)
    return path


def test_non_utf8_txt_and_cls_are_per_sample_errors(tmp_path):
    url = text_shard(str(tmp_path / "t.tar"), {"k003": "txt", "k007": "cls"})
    ds = WebDataset(url, fields=("cls", "txt", "__key__"))
    dl = DataLoader(ds, batch_size=4, num_workers=2, seed=0)
    with pytest.raises(RuntimeError) as e:
        list(dl)
    msg = str(e.value)
    assert "t.tar" in msg and "k003" in msg and ".txt is not valid UTF-8 (byte 3 of 6)" in msg
    assert isinstance(dl.stats(), dict)

    dl = DataLoader(ds, batch_size=4, num_workers=2, seed=0, on_error="skip")
    with pytest.warns(UserWarning, match="skipped 2 sample") as w:
        got = list(dl)
    labels = sum((b[0].tolist() for b in got), [])
    assert labels == [i for i in range(12) if i not in (3, 7)]
    texts = sum((b[1] for b in got), [])
    assert texts == [f"sample {i} é" for i in labels]
    st_ = dl.stats()  # readable, repeatedly, with the raw bytes escaped
    assert st_["skipped"] == 2 and "\\xff\\xfe1" in st_["last_error"]
    assert "k007" in st_["last_error"] and dl.stats()["skipped"] == 2
    assert "\\xff" in str(w[0].message)


def test_non_utf8_member_names_decode_like_os_fsdecode(tmp_path):
    url = str(tmp_path / "names.tar")
    key = os.fsdecode(b"caf\xe9")  # latin-1 name bytes, as old tar tools write them
    write_tar(url, [(key + ".cls", b"1"), ("ok.cls", b"2")])
    ((labels, keys),) = list(DataLoader(WebDataset(url, fields=("cls", "__key__")), batch_size=2))
    assert labels.tolist() == [1, 2] and keys == [key, "ok"]
    assert os.fsencode(keys[0]) == b"caf\xe9"


# ---- item 10: set_epoch inside the loop, several iterators, samplers, skipped count


def test_set_epoch_inside_the_loop_ends_after_len_batches_like_torch():
    dl = tensor_loader()
    ref0, ref7 = tensor_loader(), tensor_loader()
    ref7.set_epoch(7)
    got = []
    for i, b in enumerate(dl):
        dl.set_epoch(7)  # takes effect for the next epoch, as torch's sampler.set_epoch does
        got.append(b.tolist())
        assert i < len(dl)
    tdl = torch.utils.data.DataLoader(list(range(N)), batch_size=4)
    assert len(got) == len(dl) == len(tdl) == 6
    assert got == epoch_of(ref0)
    assert epoch_of(dl) == epoch_of(ref7)
    # Broken out of, then set: the next iter() runs the epoch that was set.
    it = iter(dl)
    next(it)
    dl.set_epoch(2)
    ref2 = tensor_loader()
    ref2.set_epoch(2)
    assert epoch_of(dl) == epoch_of(ref2)


def test_a_second_iterator_supersedes_the_first_with_a_clear_error():
    dl = tensor_loader()
    first = iter(dl)
    next(first)
    second = iter(dl)  # a new epoch, like torch's new iterator
    ref = tensor_loader()
    ref.set_epoch(1)
    head = next(second).tolist()
    with pytest.raises(RuntimeError, match="superseded by a newer iter"):
        next(first)
    del first
    gc.collect()  # dropping the old iterator must not stop the new one's threads
    assert [head] + [b.tolist() for b in second] == epoch_of(ref)
    with pytest.raises(RuntimeError, match="superseded"):
        for _ in zip(dl, dl):
            pass


def test_sampler_edge_cases_match_torch():
    x = torch.arange(N) * 10
    for sampler in ([], [5], list(range(N - 1, -1, -2)), torch.randperm(N), np.arange(4)):
        ours = DataLoader(TensorSource(x), batch_size=4, sampler=sampler, num_workers=2)
        theirs = torch.utils.data.DataLoader(x, batch_size=4, sampler=sampler)
        assert len(ours) == len(theirs)
        assert epoch_of(ours) == [b.tolist() for b in theirs]
    with pytest.raises(TypeError, match="sampler must yield integer indices, got float"):
        list(DataLoader(TensorSource(x), batch_size=4, sampler=[1.0, 2.0]))
    with pytest.raises(TypeError, match="sampler must yield integer indices, got list"):
        list(DataLoader(TensorSource(x), batch_size=4, sampler=[[0, 1], [2, 3]]))
    with pytest.raises(ValueError, match=r"sampler index must be in \[0, 23\), got 23"):
        list(DataLoader(TensorSource(x), batch_size=4, sampler=[0, 23]))
    with pytest.raises(ValueError, match=r"sampler index must be in \[0, 23\), got -1"):
        list(DataLoader(TensorSource(x), batch_size=4, sampler=[-1]))
    # A state that resumes past the end of a (shorter) sampler's epoch is refused at iter().
    long = DataLoader(TensorSource(x), batch_size=2, sampler=list(range(20)), seed=0)
    it = iter(long)
    for _ in range(8):
        next(it)
    short = DataLoader(TensorSource(x), batch_size=2, sampler=list(range(6)), seed=0)
    short.load_state_dict(long.state_dict())
    with pytest.raises(ValueError, match="resumes after batch 8 but this epoch has 3 batches"):
        list(short)
    assert len(list(short)) == 3  # refused once, then usable from the start


def bad_label_shard(path, n=60):
    members = []
    for i in range(n):
        members.append((f"k{i:03d}.cls", b"x" if i % 3 == 1 else str(i).encode()))
    write_tar(path, members)
    return path


@pytest.mark.parametrize("workers", [1, 4])
def test_skipped_count_is_exact_mid_epoch_and_in_the_warning(tmp_path, workers):
    url = bad_label_shard(str(tmp_path / "bad.tar"))
    ds = WebDataset(url, fields=("cls",))
    dl = DataLoader(ds, batch_size=3, num_workers=workers, prefetch_factor=4, on_error="skip")
    for epoch in range(3):
        it = iter(dl)
        for m in range(1, 6):
            next(it)
            time.sleep(0.01)  # let the workers run ahead: they must not be counted yet
            assert dl.stats()["skipped"] == 20 * epoch + m  # one bad sample per batch
        with pytest.warns(UserWarning, match=r"skipped 20 sample\(s\) this epoch") as w:
            rest = list(it)
        assert len(rest) == 15 and len(w) == 1
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        state = dl.state_dict()
    assert state["skipped"] == 60


# torch=True: torch's DataLoader raises ValueError for the same argument too.
@pytest.mark.parametrize(
    "kw, error, message, torch_too",
    [
        (dict(batch_size=0), ValueError, "batch_size must be >= 1, got 0", True),
        (dict(batch_size=2.5), TypeError, "batch_size must be an integer, got float", False),
        (dict(num_workers=-1), ValueError, "num_workers must be >= 0, got -1", True),
        (dict(prefetch_factor=0), ValueError, "prefetch_factor must be >= 1, got 0", True),
        (dict(num_workers=2**20, prefetch_factor=2**12), ValueError, "batches in flight", False),
        (dict(num_workers=2**40), ValueError, "num_workers must fit in int32", False),
        (dict(timeout=-1), ValueError, "timeout must be >= 0", True),
        (dict(timeout=float("nan")), ValueError, "timeout must be >= 0", False),
        (dict(on_error="ignore"), ValueError, "on_error must be 'raise' or 'skip'", False),
        (dict(rank=2, world_size=2), ValueError, r"rank must be in \[0, world_size\)", False),
        (dict(world_size=0), ValueError, r"rank must be in \[0, world_size\)", False),
        (dict(worker_init_fn=print), ValueError, "worker_init_fn does not apply", False),
        (dict(batch_sampler=[[0, 1]]), ValueError, "no batch_sampler", False),
        (dict(sampler=[0], shuffle=True), ValueError, "mutually exclusive with shuffle", True),
    ],
)
def test_bad_loader_arguments_raise_like_torch(kw, error, message, torch_too):
    with pytest.raises(error, match=message):
        DataLoader(TensorSource(torch.arange(N)), **kw)
    if torch_too:
        with pytest.raises(ValueError):
            torch.utils.data.DataLoader(list(range(N)), **kw)


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_a_forked_child_can_drop_but_not_use_a_loader_whose_threads_run_in_the_parent():
    # torch DataLoader workers and multiprocessing fork the process: a torchspeed loader with
    # running threads is inherited without them. Dropping it in the child (GC) used to hang in
    # pthread_cond_destroy; using it must raise, not wait forever.
    dl = tensor_loader()
    it = iter(dl)
    next(it)
    pid = os.fork()
    if pid == 0:  # child: exit code 0 only if both behave
        code = 1
        try:
            try:
                next(it)
            except RuntimeError as e:
                code = 0 if "forked process" in str(e) else 2
            del it, dl
            gc.collect()
        finally:
            os._exit(code)
    deadline = time.monotonic() + 60
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            break
        if time.monotonic() > deadline:
            os.kill(pid, 9)
            os.waitpid(pid, 0)
            pytest.fail("the forked child hung on the inherited loader")
        time.sleep(0.05)
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0, status
    assert len(list(it)) == len(dl) - 1  # the parent's loader is unaffected
