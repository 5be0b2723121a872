"""torchspeed.data.DataLoader under hostile use: resume states (hypothesis), per-sample text
conversions inside the error policy, set_epoch inside the loop, several iterators, samplers,
and an exact skipped count."""

import gc
import os
import time
import warnings

import numpy as np
import pytest
import torch

torchspeed = pytest.importorskip("torchspeed")
if not hasattr(torchspeed._C, "data"):
    pytest.skip("torchspeed built without the data loader", allow_module_level=True)
from data_helpers import write_tar  # noqa: E402
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from torchspeed.data import DataLoader, TensorSource, WebDataset  # noqa: E402

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
