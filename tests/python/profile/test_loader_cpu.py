"""The loader's CPU time per step (torchspeed.profile.loader_cpu): the /proc arithmetic on a fake
/proc with known tick counts, torchspeed's C++ loader threads found by their name, and a real
profiled loop whose DataLoader workers burn a known amount of CPU per sample."""

import io
import os
import time

import pytest
import torch

import torchspeed
from torchspeed.profile import _doctor
from torchspeed.profile import loader_cpu as lc

linux = pytest.mark.skipif(not os.path.isdir("/proc/self/task"), reason="needs Linux /proc")


def _stat(path, name, utime, stime):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    # stat(5): pid (comm) state ppid pgrp session tty tpgid flags minflt cminflt majflt cmajflt
    # utime stime ...; a name with a space and a ')' must not shift the fields.
    rest = ["S", "1", "1", "1", "0", "-1", "0", "0", "0", "0", "0", str(utime), str(stime), "0"]
    with open(path, "w") as f:
        f.write(f"42 ({name}) " + " ".join(rest) + "\n")


def _fake_proc(tmp_path, worker_ticks, thread_ticks, other_ticks):
    proc = tmp_path / "proc"
    _stat(str(proc / "7001" / "stat"), "pt_data_worker", *worker_ticks)
    for tid, name, ticks in (
        ("9001", lc.LOADER_THREAD_NAME, thread_ticks),
        ("9002", "python) x", other_ticks),  # torch's thread: not the loader's
    ):
        _stat(str(proc / "self" / "task" / tid / "stat"), name, *ticks)
        (proc / "self" / "task" / tid / "comm").write_text(name.split(")")[0] + "\n")
    return str(proc)


def test_cpu_per_step_sums_worker_processes_and_named_threads_over_counted_steps(tmp_path):
    tick = lc._TICK
    proc = _fake_proc(tmp_path, (100, 50), (10, 0), (1000, 0))
    cpu = lc.LoaderCpu(proc=proc)
    cpu.add_workers([7001, None, -1])
    assert cpu.per_step_s() is None  # nothing counted yet
    cpu.sample(counting=False)  # warmup
    cpu.sample(counting=True)  # the window starts: baseline
    _fake_proc(tmp_path, (130, 60), (25, 5), (5000, 0))  # +40 and +20 ticks, torch's +4000
    cpu.sample(counting=True)
    _fake_proc(tmp_path, (150, 60), (25, 5), (9000, 0))  # +20, +0
    cpu.sample(counting=True)
    assert cpu.steps == 2
    assert cpu.per_step_s() == pytest.approx((40 + 20 + 20) / tick / 2)
    # A worker process started inside the window: all its CPU is the window's.
    _stat(os.path.join(proc, "7002", "stat"), "w2", 8, 2)
    cpu.add_workers([7002])
    cpu.sample(counting=True)
    assert cpu.steps == 3
    assert cpu.total_s == pytest.approx((40 + 20 + 20 + 10) / tick)
    # A process that is gone reads as nothing (its last interval is lost), never raises.
    os.remove(os.path.join(proc, "7001", "stat"))
    cpu.sample(counting=True)
    assert cpu.total_s == pytest.approx(90 / tick)


def test_unknown_without_proc_or_without_any_loader_process(tmp_path):
    assert lc.LoaderCpu(proc=str(tmp_path / "none")).per_step_s() is None
    proc = tmp_path / "proc"
    (proc / "self" / "task").mkdir(parents=True)
    cpu = lc.LoaderCpu(proc=str(proc))
    for _ in range(3):
        cpu.sample(counting=True)
    assert cpu.steps == 2 and cpu.per_step_s() is None  # no loader seen: not 0


@linux
def test_torchspeed_loader_threads_carry_the_name_the_doctor_reads():
    dl = torchspeed.data.DataLoader(
        torchspeed.data.TensorSource(torch.randn(64, 3)), batch_size=4, num_workers=3
    )
    it = iter(dl)
    next(it)
    # The first batch can come before every worker has started (and named itself).
    deadline = time.monotonic() + 30
    found = lc.LoaderCpu()._loader_threads()
    while len(found) < 3 and time.monotonic() < deadline:
        time.sleep(0.01)
        found = lc.LoaderCpu()._loader_threads()
    del it
    dl.shutdown()
    assert len(found) == 3


class _Burn(torch.utils.data.Dataset):
    """Each sample burns BURN_S of its worker's CPU time (process_time: unmoved by load)."""

    BURN_S = 0.004

    def __len__(self):
        return 4 * 40

    def __getitem__(self, i):
        t0 = time.process_time()
        while time.process_time() - t0 < self.BURN_S:
            pass
        return torch.full((8,), float(i))


@linux
def test_a_profiled_loop_measures_its_workers_cpu_per_step():
    """2 worker processes each burn 4 ms of CPU per sample, 4 samples a batch: 16 ms of loader
    CPU per step. The measurement counts the workers' CPU between the steps after the warmup;
    the batches prefetched before that window (2 workers x prefetch_factor 2) are not in it and
    the workers' own overhead (collate, pickling) is, hence the tolerance."""
    model = torch.nn.Linear(8, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    loader = torch.utils.data.DataLoader(_Burn(), batch_size=4, num_workers=2)
    with _doctor.doctor(out=None, progress=False, file=io.StringIO(), probe=False) as prof:
        for x in loader:
            model(x).sum().backward()
            opt.step()
            opt.zero_grad()
        facts = prof.facts()
    want = 4 * _Burn.BURN_S
    assert facts.loader_cpu_s is not None
    assert 0.6 * want <= facts.loader_cpu_s <= 1.6 * want, (facts.loader_cpu_s, want)
