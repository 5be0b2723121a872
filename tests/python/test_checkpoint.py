"""torchspeed.checkpoint: atomic, verified files (a crash keeps the old one, threads saving one
path all succeed), loading without running code from the file (weights_only), every object
checked before any is restored, bitwise kill-and-resume, CheckpointManager's folder, steps and
stale temporaries, and EarlyStopping (its state and a failed save of the best)."""

from __future__ import annotations

import errno
import hashlib
import io
import os
import random
import signal
import struct
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

import torchspeed
from torchspeed import checkpoint as ckpt
from torchspeed.optim.lr_scheduler import WarmupLR

HERE = Path(__file__).resolve().parent


def _train_objects():
    torch.manual_seed(3)
    model = nn.Linear(6, 3)
    opt = torchspeed.optim.AdamW(model.parameters(), lr=1e-2)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**6)
    for _ in range(3):
        scaler.scale(model(torch.randn(4, 6)).sum()).backward()
        scaler.step(opt)
        scaler.update()
        opt.zero_grad()
    return model, opt, scaler


def test_checkpoint_round_trip_restores_everything_and_the_rng(tmp_path):
    model, opt, scaler = _train_objects()
    path = ckpt.save(
        tmp_path / "a.pt", model=model, optimizer=opt, scaler=scaler, extra={"step": 3}
    )
    m2 = nn.Linear(6, 3)
    o2 = torchspeed.optim.AdamW(m2.parameters(), lr=1e-2)
    s2 = torch.amp.GradScaler("cpu")
    extra = ckpt.load(path, model=m2, optimizer=o2, scaler=s2)
    assert extra == {"step": 3}
    for a, b in zip(model.parameters(), m2.parameters()):
        assert torch.equal(a, b)
    assert str(o2.state_dict()) == str(opt.state_dict()) and s2.get_scale() == scaler.get_scale()


def test_rng_state_is_restored_bitwise(tmp_path):
    path = ckpt.save(tmp_path / "r.pt")
    a = (torch.rand(5), random.random(), np.random.rand(3), np.random.randn())
    ckpt.load(path)
    b = (torch.rand(5), random.random(), np.random.rand(3), np.random.randn())
    assert torch.equal(a[0], b[0]) and a[1] == b[1]
    assert np.array_equal(a[2], b[2]) and a[3] == b[3]


def test_truncated_and_corrupted_files_are_refused_before_restoring(tmp_path):
    model, opt, _ = _train_objects()
    path = ckpt.save(tmp_path / "c.pt", model=model)
    raw = path.read_bytes()
    fresh = nn.Linear(6, 3)
    before = [p.detach().clone() for p in fresh.parameters()]
    (tmp_path / "t.pt").write_bytes(raw[: len(raw) // 2])
    with pytest.raises(ckpt.CheckpointError, match="truncated"):
        ckpt.load(tmp_path / "t.pt", model=fresh)
    bad = bytearray(raw)
    bad[-10] ^= 0xFF
    (tmp_path / "x.pt").write_bytes(bytes(bad))
    with pytest.raises(ckpt.CheckpointError, match="corrupted"):
        ckpt.load(tmp_path / "x.pt", model=fresh)
    (tmp_path / "n.pt").write_bytes(b"hello world, not a checkpoint at all" * 3)
    with pytest.raises(ckpt.CheckpointError, match="not a torchspeed checkpoint"):
        ckpt.load(tmp_path / "n.pt", model=fresh)
    with pytest.raises(KeyError, match="holds no state for optimizer"):
        ckpt.load(path, model=fresh, optimizer=opt)
    assert all(torch.equal(a, b) for a, b in zip(before, fresh.parameters()))


def test_a_crash_during_save_keeps_the_previous_file(tmp_path, monkeypatch):
    model, _, _ = _train_objects()
    path = ckpt.save(tmp_path / "k.pt", model=model, extra={"v": 1})
    old = path.read_bytes()

    def crash(*a, **k):
        raise OSError("power cut")

    monkeypatch.setattr(os, "replace", crash)
    with pytest.raises(OSError, match="power cut"):
        ckpt.save(path, model=model, extra={"v": 2})
    assert path.read_bytes() == old and ckpt.read(path)["extra"] == {"v": 1}
    assert [p.name for p in tmp_path.iterdir()] == ["k.pt"]  # no temporary left behind


def test_manager_keeps_the_newest_and_falls_back_past_a_torn_one(tmp_path):
    model, opt, _ = _train_objects()
    m = ckpt.CheckpointManager(tmp_path / "run", keep=2)
    for step in (1, 2, 3):
        m.save(step, model=model, optimizer=opt)
    assert [p.name for p in m.checkpoints()] == ["ckpt-000000002.pt", "ckpt-000000003.pt"]
    newest = m.checkpoints()[-1]
    newest.write_bytes(newest.read_bytes()[:100])  # torn by a crash
    with pytest.warns(RuntimeWarning, match="truncated"):
        assert m.load_latest(model=model, optimizer=opt) == 2
    with pytest.raises(ValueError, match="keep must be an int >= 1"):
        ckpt.CheckpointManager(tmp_path, keep=0)


def test_kill_and_resume_is_bitwise_identical(tmp_path):
    """SIGKILL at a random step, resume from the last checkpoint: the final params equal an
    uninterrupted run's bit for bit (model with dropout, fused AdamW, native shuffled loader with
    2 workers, GradScaler, WarmupLR)."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path), OMP_NUM_THREADS="1")
    worker = [sys.executable, str(HERE / "resume_worker.py")]
    full = tmp_path / "full"
    subprocess.run(worker + [str(full)], check=True, env=env, timeout=300, capture_output=True)
    cut = tmp_path / "cut"
    kill_at = random.Random().randint(2, 33)
    p = subprocess.Popen(
        worker + [str(cut)], env=env, stdout=subprocess.PIPE, text=True, start_new_session=True
    )
    try:
        for line in p.stdout:
            if line.strip() == f"step {kill_at}":
                os.killpg(p.pid, signal.SIGKILL)
                break
        p.wait(timeout=300)
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()
    assert p.returncode == -signal.SIGKILL, f"the run ended before step {kill_at}"
    assert not (cut / "final.pt").exists()
    r = subprocess.run(
        worker + [str(cut), "--resume"], env=env, timeout=300, capture_output=True, text=True
    )
    assert r.returncode == 0, r.stderr[-3000:]
    first = int(r.stdout.split()[1])
    assert first > kill_at - 2, f"resumed at step {first}, killed at {kill_at}"
    a, b = torch.load(full / "final.pt"), torch.load(cut / "final.pt")
    for name in a:
        assert torch.equal(a[name], b[name]), f"{name} differs after a kill at step {kill_at}"


# ---- early stopping -------------------------------------------------------------------------------


def test_early_stopping_stops_after_patience_and_keeps_the_best(tmp_path):
    model = nn.Linear(2, 1)
    stop = ckpt.EarlyStopping("val_loss", patience=2, min_delta=0.01, best_path=tmp_path / "b.pt")
    values = [1.0, 0.8, 0.795, 0.9, 0.85, 0.7]
    stopped_at = None
    for i, v in enumerate(values):
        with torch.no_grad():
            model.weight.fill_(v)
        if stop.step(v, model=model):
            stopped_at = i
            break
    assert stopped_at == 4 and stop.best == 0.8 and stop.best_check == 1
    assert (
        "did not improve by more than 0.01" in stop.reason and "best 0.8 at check 1" in stop.reason
    )
    fresh = nn.Linear(2, 1)
    assert ckpt.load(tmp_path / "b.pt", model=fresh)["best"] == 0.8
    assert torch.equal(fresh.weight, torch.full_like(fresh.weight, 0.8))
    mx = ckpt.EarlyStopping("acc", patience=0, mode="max")
    assert not mx.step(0.5) and mx.step(0.5)
    with pytest.raises(ValueError, match="mode must be 'min' or 'max'"):
        ckpt.EarlyStopping(mode="up")


def test_early_stopping_load_state_dict_accepts_only_its_keys():
    """Issue 23 item 16: any key used to become an attribute ({"step": 3} replaced the method)."""
    stop = ckpt.EarlyStopping(patience=1)
    stop.step(1.0)
    stop.step(0.5)
    saved = stop.state_dict()
    with pytest.raises(ValueError, match=r"unknown \['step'\]"):
        stop.load_state_dict({**saved, "step": 3})
    assert callable(stop.step) and stop.state_dict() == saved
    with pytest.raises(ValueError, match=r"missing \['reason'\]"):
        stop.load_state_dict({k: v for k, v in saved.items() if k != "reason"})
    with pytest.raises(TypeError, match=r"state\['checks'\] must be an int, got '2'"):
        stop.load_state_dict({**saved, "checks": "2"})
    with pytest.raises(TypeError, match=r"state\['stopped'\] must be a bool"):
        stop.load_state_dict({**saved, "stopped": 0})
    with pytest.raises(TypeError, match=r"state\['best'\] must be a real number"):
        stop.load_state_dict({**saved, "best": "0.5"})
    with pytest.raises(ValueError, match="inconsistent"):
        stop.load_state_dict({**saved, "best_check": 7})
    with pytest.raises(TypeError, match="state must be a dict"):
        stop.load_state_dict([("best", 1.0)])
    assert stop.state_dict() == saved
    other = ckpt.EarlyStopping(patience=1)
    other.load_state_dict(saved)
    assert other.state_dict() == saved
    assert other.step(0.6) is False and other.step(0.7) is True  # continues where it was
    assert other.bad_checks == 2 and other.best == 0.5


def test_a_failed_save_of_the_best_leaves_early_stopping_unchanged(tmp_path):
    """Issue 23 item 16: best used to be updated although its checkpoint was never written."""
    model = nn.Linear(2, 1)
    best_path = tmp_path / "best.pt"
    stop = ckpt.EarlyStopping(patience=2, best_path=best_path)
    stop.step(1.0, model=model)
    before = stop.state_dict()
    best_path.unlink()
    best_path.mkdir()  # the save of the next best now fails
    with pytest.raises(ckpt.CheckpointError, match="is a directory"):
        stop.step(0.5, model=model)
    assert stop.state_dict() == before and stop.best == 1.0


def test_early_stopping_rejects_bad_arguments():
    E = ckpt.EarlyStopping
    with pytest.raises(TypeError, match="patience must be an int"):
        E(patience=1.5)
    with pytest.raises(ValueError, match="patience must be an int >= 0"):
        E(patience=-1)
    with pytest.raises(ValueError, match="min_delta must be finite and >= 0"):
        E(min_delta=float("nan"))
    with pytest.raises(ValueError, match="min_delta must be finite and >= 0"):
        E(min_delta=float("inf"))
    with pytest.raises(TypeError, match="min_delta must be a real number"):
        E(min_delta="0.1")
    with pytest.raises(TypeError, match="monitor must be a str"):
        E(monitor=3)
    with pytest.raises(TypeError, match="mode must be 'min' or 'max'"):
        E(mode=None)
    with pytest.raises(TypeError, match="path must be a str or os.PathLike"):
        E(best_path=3)
    stop = E()
    with pytest.raises(TypeError, match="value must be a real number, got '0.5'"):
        stop.step("0.5")
    with pytest.raises(TypeError, match="one-element tensor"):
        stop.step(torch.ones(2))
    assert stop.checks == 0
    assert stop.step(torch.tensor(0.5)) is False and stop.best == 0.5
    assert stop.step(float("nan")) is False and stop.bad_checks == 1  # NaN never improves


# ---- loading runs no code from the file (issue 23 item 29) -------------------------------------


class _Evil:
    """Pickles as a call that creates a file: what a malicious checkpoint would carry."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return (open, (self.marker, "w"))


def _write_crafted(path, payload):
    """A checkpoint file with a valid header (anyone can compute the SHA-256)."""
    buf = io.BytesIO()
    torch.save(payload, buf)
    data = buf.getvalue()
    header = struct.pack("<8sQ32s", b"TSCKPT\x00\x01", len(data), hashlib.sha256(data).digest())
    Path(path).write_bytes(header + data)


def test_loading_a_crafted_checkpoint_runs_no_code(tmp_path):
    marker = tmp_path / "pwned"
    payload = {"format": 1, "states": {}, "extra": {"x": _Evil(marker)}}
    _write_crafted(tmp_path / "evil.pt", payload)
    folder = tmp_path / "run"
    folder.mkdir()
    _write_crafted(folder / "ckpt-000000007.pt", payload)
    with pytest.raises(ckpt.CheckpointError, match="trusted=True runs code"):
        ckpt.load(tmp_path / "evil.pt")
    with pytest.raises(ckpt.CheckpointError, match="Unsupported global"):
        ckpt.read(tmp_path / "evil.pt")
    with pytest.raises(ckpt.CheckpointError, match="refuses by default"):
        ckpt.CheckpointManager(folder).load_latest()  # no silent fallback to an older file
    assert not marker.exists()
    ckpt.read(tmp_path / "evil.pt", trusted=True)  # the opt-in really runs what the file says
    assert marker.exists()


def test_every_state_saves_and_loads_with_weights_only(tmp_path):
    """Model, torchspeed optimizer, GradScaler, WarmupLR, the native loader, EarlyStopping and
    the RNG states (torch, numpy, python) all load with torch.load(weights_only=True)."""
    model, opt, scaler = _train_objects()
    sched = WarmupLR(opt, 2, 10)
    sched.step()
    loader = torchspeed.data.DataLoader(
        torchspeed.data.TensorSource(torch.randn(20, 3)), batch_size=4, shuffle=True, seed=1
    )
    it = iter(loader)
    next(it)
    stop = ckpt.EarlyStopping()
    stop.step(0.3)
    objs = dict(model=model, optimizer=opt, scaler=scaler, scheduler=sched, loader=loader, es=stop)
    path = ckpt.save(tmp_path / "all.pt", extra={"step": 1, "acc": [0.5, 0.7]}, **objs)
    body = path.read_bytes()[ckpt._HEADER.size :]
    payload = torch.load(io.BytesIO(body), weights_only=True)
    assert set(payload["states"]) == set(objs) and set(payload["rng"]) >= {
        "torch",
        "python",
        "numpy",
    }
    assert ckpt.load(path, **objs) == {"step": 1, "acc": [0.5, 0.7]}


def test_save_refuses_what_a_weights_only_load_would_refuse(tmp_path):
    path = tmp_path / "x.pt"
    with pytest.raises(TypeError, match=r"extra\['acc'\] is a numpy.float64"):
        ckpt.save(path, extra={"acc": np.float64(0.5)})
    assert not path.exists()
    ckpt.save(path, extra={"acc": np.float64(0.5)}, trusted=True)
    with pytest.raises(ckpt.CheckpointError, match="trusted=True"):
        ckpt.load(path)
    assert ckpt.load(path, trusted=True) == {"acc": 0.5}
    with pytest.raises(TypeError, match="extra must be a dict or None"):
        ckpt.save(path, extra=[1])
    with pytest.raises(TypeError, match="trusted must be a bool"):
        ckpt.load(path, trusted="yes")
    with pytest.raises(TypeError, match="must have a load_state_dict"):
        ckpt.load(path, trusted=True, model=3)


# ---- nothing restored when anything does not match (issue 23 item 12) ---------------------------


def _fresh():
    torch.manual_seed(11)
    model = nn.Linear(6, 3)
    opt = torchspeed.optim.AdamW(model.parameters(), lr=1e-2)
    model(torch.randn(2, 6)).sum().backward()
    opt.step()
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**3)
    return model, opt, scaler


def _snapshot(model, opt, scaler):
    return (
        [p.detach().clone() for p in model.parameters()],
        {k: v.clone() for k, v in opt.state[next(iter(model.parameters()))].items()},
        scaler.get_scale(),
    )


def _same(a, b):
    return (
        all(torch.equal(x, y) for x, y in zip(a[0], b[0]))
        and all(torch.equal(a[1][k], b[1][k]) for k in a[1])
        and a[2] == b[2]
    )


def test_load_into_a_model_of_another_shape_changes_nothing(tmp_path):
    big = nn.Sequential(nn.Linear(6, 3), nn.Linear(3, 2))
    path = ckpt.save(tmp_path / "a.pt", model=big, scaler=torch.amp.GradScaler("cpu"))
    target = nn.Sequential(nn.Linear(6, 3), nn.Linear(3, 5))  # layer 0 matches, layer 1 not
    before = [p.detach().clone() for p in target.parameters()]
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**3)
    with pytest.raises(
        ckpt.CheckpointError, match=r"size mismatch for 1.weight: the file has \[2, 3\]"
    ):
        ckpt.load(path, scaler=scaler, model=target)
    assert all(torch.equal(a, b) for a, b in zip(before, target.parameters()))
    assert scaler.get_scale() == 2.0**3


def test_load_with_a_mismatched_optimizer_changes_nothing(tmp_path):
    model, opt, scaler = _train_objects()
    path = ckpt.save(tmp_path / "a.pt", model=model, optimizer=opt, scaler=scaler)
    m2, o2, s2 = _fresh()
    wrong = torchspeed.optim.AdamW([nn.Parameter(torch.zeros(2)), *m2.parameters()], lr=1e-2)
    before = _snapshot(m2, o2, s2)
    rng_before = torch.get_rng_state()
    with pytest.raises(ValueError, match="doesn't match the size"):
        ckpt.load(path, model=m2, scaler=s2, optimizer=wrong)  # the scaler is restored first
    assert _same(before, _snapshot(m2, o2, s2)) and torch.equal(rng_before, torch.get_rng_state())


# ---- where files go: directories, FIFOs, symlinks, threads (issue 23 items 2, 18, 23) -----------


def test_save_and_load_on_a_directory_raise_checkpoint_error(tmp_path):
    model = nn.Linear(2, 2)
    with pytest.raises(ckpt.CheckpointError, match="is a directory, not a regular file"):
        ckpt.save(tmp_path, model=model)
    with pytest.raises(ckpt.CheckpointError, match="is a directory, not a checkpoint file"):
        ckpt.load(tmp_path, model=model)
    with pytest.raises(ckpt.CheckpointError, match="is a directory"):
        ckpt.read(tmp_path)
    assert list(tmp_path.iterdir()) == []  # no temporary left
    (tmp_path / "file").write_text("x")
    with pytest.raises(ckpt.CheckpointError, match="a part of it is a file"):
        ckpt.save(tmp_path / "file" / "a.pt", model=model)
    with pytest.raises(ckpt.CheckpointError, match="does not exist"):
        ckpt.load(tmp_path / "file" / "a.pt", model=model)


def test_save_refuses_a_fifo_or_a_symlink_to_one_and_load_never_blocks_on_it(tmp_path):
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    link = tmp_path / "link.pt"
    link.symlink_to(fifo)
    model = nn.Linear(2, 2)
    with pytest.raises(ckpt.CheckpointError, match="is a FIFO, not a regular file"):
        ckpt.save(fifo, model=model)
    with pytest.raises(ckpt.CheckpointError, match="is a symlink to a FIFO"):
        ckpt.save(link, model=model)
    errors = []
    t = threading.Thread(
        target=lambda: errors.append(pytest.raises(ckpt.CheckpointError, ckpt.load, link)),
        daemon=True,
    )
    t.start()
    t.join(timeout=20)
    assert not t.is_alive(), "load() blocked reading a FIFO"
    assert "is a FIFO" in str(errors[0].value)
    assert (
        fifo.is_fifo()
        and link.is_symlink()
        and sorted(p.name for p in tmp_path.iterdir())
        == [
            "link.pt",
            "pipe",
        ]
    )


def test_save_through_a_symlink_to_a_regular_file_writes_that_file(tmp_path):
    real = ckpt.save(tmp_path / "real.pt", extra={"v": 1})
    (tmp_path / "link.pt").symlink_to(real)
    ckpt.save(tmp_path / "link.pt", extra={"v": 2})
    assert (tmp_path / "link.pt").is_symlink() and ckpt.read(real)["extra"] == {"v": 2}


def test_concurrent_saves_to_one_path_all_succeed(tmp_path):
    """Issue 23 item 18: the temporary name depended only on the pid, so 3 threads of 4 raised."""
    model = nn.Linear(64, 64)
    path = tmp_path / "same.pt"
    errors, barrier = [], threading.Barrier(6)

    def worker(i):
        barrier.wait()
        for j in range(5):
            try:
                ckpt.save(path, model=model, extra={"writer": i, "j": j})
            except Exception as e:  # noqa: BLE001 (the test counts every failure)
                errors.append(e)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert ckpt.read(path)["extra"]["j"] in range(5)
    assert [p.name for p in tmp_path.iterdir()] == ["same.pt"]


def test_a_write_error_is_raised_and_keeps_the_old_file(tmp_path, monkeypatch):
    path = ckpt.save(tmp_path / "k.pt", extra={"v": 1})

    def full(fd):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "fsync", full)
    with pytest.raises(OSError, match="No space left"):
        ckpt.save(path, extra={"v": 2})
    monkeypatch.undo()
    assert ckpt.read(path)["extra"] == {"v": 1} and [p.name for p in tmp_path.iterdir()] == ["k.pt"]


_KILLED_SAVE = r"""
import sys, time
from torchspeed import _atomic
def writer(f):
    f.write(b"x" * 4096)
    f.flush()
    print("writing", flush=True)
    time.sleep(120)
_atomic.atomic_write(sys.argv[1], writer)
"""


def test_manager_removes_the_temporary_of_a_killed_save(tmp_path):
    """Issue 23 item 18: a save killed part-way left a full-size temporary that nothing removed."""
    folder = tmp_path / "run"
    manager = ckpt.CheckpointManager(folder, keep=2)
    manager.save(1, extra={})
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    p = subprocess.Popen(
        [sys.executable, "-c", _KILLED_SAVE, str(manager.path(2))],
        env=env,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert p.stdout.readline().strip() == "writing"
    finally:
        p.send_signal(signal.SIGKILL)
        p.wait()
    (other := folder / "notes.txt").write_text("not ours")
    leftover = [q for q in folder.iterdir() if ".tmp-" in q.name]
    assert len(leftover) == 1
    assert manager.load_latest() == 1
    assert not leftover[0].exists() and other.exists()
    manager.save(3, extra={})
    assert [q.name for q in manager.checkpoints()] == ["ckpt-000000001.pt", "ckpt-000000003.pt"]


# ---- CheckpointManager's arguments (issue 23 item 9) ----------------------------------------------


def test_manager_refuses_a_file_as_its_folder(tmp_path):
    f = tmp_path / "not_a_folder"
    f.write_text("x")
    with pytest.raises(ValueError, match="directory must be a folder"):
        ckpt.CheckpointManager(f)
    folder = tmp_path / "run"
    manager = ckpt.CheckpointManager(folder)
    folder.write_text("a file took its place")
    with pytest.raises(ckpt.CheckpointError, match="is not a folder"):
        manager.load_latest(model=nn.Linear(2, 2))  # never a silent fresh start (None)


@pytest.mark.parametrize(
    "step,error,match",
    [
        (-5, ValueError, "step must be >= 0, got -5"),
        (1.7, TypeError, "step must be an int, got 1.7"),
        (2.0, TypeError, "step must be an int, got 2.0"),
        (True, TypeError, "step must be an int, got True"),
        ("3", TypeError, "step must be an int, got '3'"),
    ],
)
def test_manager_refuses_a_bad_step(tmp_path, step, error, match):
    manager = ckpt.CheckpointManager(tmp_path / "run")
    with pytest.raises(error, match=match):
        manager.save(step, model=nn.Linear(2, 2))
    assert not (tmp_path / "run").exists() or list((tmp_path / "run").iterdir()) == []


def test_manager_steps_and_arguments(tmp_path):
    manager = ckpt.CheckpointManager(tmp_path / "run", keep=2)
    assert manager.save(np.int64(4), extra={}).name == "ckpt-000000004.pt"  # integer types
    manager.save(5, extra={})
    with pytest.warns(RuntimeWarning, match="ckpt-000000005.pt is newer than step 1"):
        written = manager.save(1, extra={})
    assert written.exists()  # the file just written is never the one rotated away
    assert [p.name for p in manager.checkpoints()] == ["ckpt-000000001.pt", "ckpt-000000005.pt"]
    with pytest.raises(TypeError, match="prefix must be a str"):
        ckpt.CheckpointManager(tmp_path, prefix=3)
    with pytest.raises(ValueError, match="prefix must be a plain file name part"):
        ckpt.CheckpointManager(tmp_path, prefix="../x")
    with pytest.raises(TypeError, match="path must be a str or os.PathLike"):
        ckpt.CheckpointManager(None)


def test_a_format_1_file_with_numpy_rng_loads_only_when_trusted(tmp_path):
    """Files written before weights_only loading hold numpy's state as a pickled array."""
    np.random.seed(5)
    legacy = {"torch": torch.get_rng_state(), "python": random.getstate()}
    legacy["numpy"] = np.random.get_state()
    want = np.random.rand(4)
    _write_crafted(tmp_path / "old.pt", {"format": 1, "states": {}, "extra": {}, "rng": legacy})
    with pytest.raises(ckpt.CheckpointError, match="trusted=True"):
        ckpt.load(tmp_path / "old.pt")
    np.random.seed(6)
    ckpt.load(tmp_path / "old.pt", trusted=True)
    assert np.array_equal(np.random.rand(4), want)
    _write_crafted(tmp_path / "new.pt", {"format": 3, "states": {}, "extra": {}})
    with pytest.raises(ckpt.CheckpointError, match="has format 3, newer than"):
        ckpt.load(tmp_path / "new.pt")
    with pytest.raises(ckpt.CheckpointError, match="not hold a torchspeed checkpoint payload"):
        _write_crafted(tmp_path / "bad.pt", [1, 2])
        ckpt.load(tmp_path / "bad.pt")
    bad_rng = {"format": 2, "states": {}, "extra": {}, "rng": {"torch": torch.zeros(3)}}
    _write_crafted(tmp_path / "rng.pt", bad_rng)
    before = torch.get_rng_state()
    with pytest.raises(ValueError, match="rng must be a dict with 'torch' and 'python'"):
        ckpt.load(tmp_path / "rng.pt")
    assert torch.equal(before, torch.get_rng_state())


def test_objects_restored_before_a_failing_one_are_rolled_back(tmp_path):
    """An object whose own load_state_dict raises (nothing can check it up front): the optimizer,
    scaler and scheduler restored before it get their previous state back."""

    class Picky:
        def state_dict(self):
            return {"v": 1}

        def load_state_dict(self, state):
            raise ValueError("picky refuses")

    model, opt, scaler = _train_objects()
    sched = WarmupLR(opt, 2, 10)
    path = ckpt.save(
        tmp_path / "a.pt", optimizer=opt, scaler=scaler, scheduler=sched, picky=Picky()
    )
    m2, o2, s2 = _fresh()
    sch2 = WarmupLR(o2, 3, 30)
    before = _snapshot(m2, o2, s2)
    sched_before, lr_before = sch2.state_dict(), o2.param_groups[0]["lr"]
    with pytest.raises(ValueError, match="picky refuses"):
        ckpt.load(path, optimizer=o2, scaler=s2, scheduler=sch2, picky=Picky())
    assert _same(before, _snapshot(m2, o2, s2))
    assert sch2.state_dict() == sched_before and o2.param_groups[0]["lr"] == lr_before
    o2.step()  # still a working optimizer
