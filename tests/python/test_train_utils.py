"""Training-loop utilities: WarmupLR against torch's schedulers step for step (host lr and a device
lr tensor), the linear-scaling rule, checkpoints (atomic, verified, bitwise kill-and-resume),
EarlyStopping, the batch-size finder on a synthetic memory model, and Lightning with torchspeed's
parts and TorchspeedCallback."""

from __future__ import annotations

import math
import os
import random
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch import nn
from torch.optim import lr_scheduler as L

import torchspeed
from torchspeed import checkpoint as ckpt
from torchspeed.optim.lr_scheduler import WarmupLR, scaled_lr
from torchspeed.tune import max_batch_size

HERE = Path(__file__).resolve().parent


def _opt(lr=0.1, opt_cls=torch.optim.SGD):
    return opt_cls([nn.Parameter(torch.zeros(3))], lr=lr)


def _lrs(opt, sched, steps):
    out = [float(opt.param_groups[0]["lr"])]
    for _ in range(steps):
        opt.step()
        sched.step()
        out.append(float(opt.param_groups[0]["lr"]))
    return out


# ---- schedules ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "warmup,total,start,eta_min",
    [(5, 20, 0.1, 1e-4), (0, 12, 1 / 3, 0.0), (3, 3, 0.5, 0.0), (10, 40, 1 / 3, 0.01)],
)
def test_linear_warmup_cosine_matches_torch_sequential_lr(warmup, total, start, eta_min):
    ref_opt, opt = _opt(), _opt()
    parts = [L.CosineAnnealingLR(ref_opt, T_max=max(total - warmup, 1), eta_min=eta_min)]
    if warmup:
        parts.insert(0, L.LinearLR(ref_opt, start_factor=start, total_iters=warmup))
    ref = L.SequentialLR(ref_opt, parts, milestones=[warmup]) if warmup else parts[0]
    ours = WarmupLR(
        opt, warmup_steps=warmup, total_steps=total, start_factor=start, eta_min=eta_min
    )
    n = total if total > warmup else warmup  # torch's cosine restarts after T_max; ours holds
    torch.testing.assert_close(_lrs(opt, ours, n), _lrs(ref_opt, ref, n), rtol=1e-9, atol=1e-12)


def test_linear_decay_and_constant_match_torch():
    for decay, make in [
        (
            "linear",
            lambda o: L.LinearLR(o, start_factor=1.0, end_factor=0.02 / 0.1, total_iters=15),
        ),
        ("constant", lambda o: L.ConstantLR(o, factor=1.0, total_iters=1)),
    ]:
        ref_opt, opt = _opt(), _opt()
        ref = L.SequentialLR(
            ref_opt,
            [L.LinearLR(ref_opt, start_factor=0.25, total_iters=5), make(ref_opt)],
            milestones=[5],
        )
        ours = WarmupLR(opt, 5, 20, decay=decay, start_factor=0.25, eta_min=0.02)
        torch.testing.assert_close(
            _lrs(opt, ours, 20), _lrs(ref_opt, ref, 20), rtol=1e-9, atol=1e-12, msg=decay
        )


def test_exponential_warmup_against_its_formula():
    opt = _opt(0.2)
    got = _lrs(opt, WarmupLR(opt, 8, 8, warmup="exponential", start_factor=0.01), 10)
    want = [0.2 * 0.01 ** (1 - min(t, 8) / 8) for t in range(11)]
    torch.testing.assert_close(got, want, rtol=1e-12, atol=0)


def test_a_tensor_lr_follows_the_schedule_on_the_device_with_torchspeed_adamw():
    lr = torch.tensor(0.1)
    p = nn.Parameter(torch.ones(4))
    opt = torchspeed.optim.AdamW([p], lr=lr)
    ref_opt = _opt(0.1)
    sched, ref = WarmupLR(opt, 4, 12), WarmupLR(ref_opt, 4, 12)
    for _ in range(14):
        assert torch.is_tensor(opt.param_groups[0]["lr"])
        torch.testing.assert_close(
            opt.param_groups[0]["lr"].item(),
            float(ref_opt.param_groups[0]["lr"]),
            rtol=1e-7,
            atol=0,
        )
        p.grad = torch.ones(4)
        opt.step()
        sched.step()
        ref.step()
    assert opt.param_groups[0]["lr"] is lr  # written in place, never replaced


def test_a_captured_cuda_graph_replay_follows_the_schedule():
    """GPU check script: opt.step() and sched.step() captured once in a CUDA graph; every replay
    advances the device step counter and writes the scheduled lr, with no host update."""
    if not torch.cuda.is_available() or not getattr(torchspeed._C, "with_cuda", False):
        pytest.skip("needs a CUDA device and torchspeed built with CUDA")
    lr = torch.tensor(0.1, device="cuda")
    p = nn.Parameter(torch.ones(1024, device="cuda"))
    p.grad = torch.full_like(p, 0.01)
    opt = torchspeed.optim.AdamW([p], lr=lr)
    sched = WarmupLR(opt, 5, 20)
    ref_opt = _opt(0.1)
    ref = WarmupLR(ref_opt, 5, 20)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):  # warm up outside the graph (state allocation)
        opt.step()
        sched.step()
        ref.step()
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        opt.step()
        sched.step()
    ref.step()  # the capture ran step() once
    for _ in range(12):
        graph.replay()
        ref.step()
        torch.cuda.synchronize()
        torch.testing.assert_close(
            lr.item(), float(ref_opt.param_groups[0]["lr"]), rtol=1e-6, atol=0
        )


def test_scheduler_state_dict_resumes_exactly():
    opt, opt2 = _opt(), _opt()
    a = WarmupLR(opt, 5, 30, eta_min=0.001)
    for _ in range(9):
        a.step()
    b = WarmupLR(opt2, 5, 30, eta_min=0.001)
    b.load_state_dict(a.state_dict())
    assert opt2.param_groups[0]["lr"] == opt.param_groups[0]["lr"]
    assert _lrs(opt, a, 10) == _lrs(opt2, b, 10)


def test_scheduler_and_scaling_rule_reject_bad_arguments():
    with pytest.raises(RuntimeError, match="total_steps must be >= warmup_steps"):
        WarmupLR(_opt(), 10, 5)
    with pytest.raises(RuntimeError, match="warmup must be 'linear' or 'exponential', got 'cos'"):
        WarmupLR(_opt(), 1, 5, warmup="cos")
    with pytest.raises(RuntimeError, match=r"start_factor must be in \(0, 1\]"):
        WarmupLR(_opt(), 1, 5, warmup="exponential", start_factor=0.0)
    with pytest.raises(TypeError, match="warmup_steps must be an int"):
        WarmupLR(_opt(), 1.5, 5)
    assert scaled_lr(0.1, 256, 1024) == pytest.approx(0.4)
    assert scaled_lr(0.1, 256, 1024, rule="sqrt") == pytest.approx(0.2)
    with pytest.raises(RuntimeError, match="rule must be 'linear' or 'sqrt'"):
        scaled_lr(0.1, 256, 1024, rule="cube")
    with pytest.raises(RuntimeError, match="batch sizes must be > 0"):
        scaled_lr(0.1, 0, 1024)


# ---- checkpoints ----------------------------------------------------------------------------------


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
    a = (torch.rand(5), random.random())
    ckpt.load(path)
    b = (torch.rand(5), random.random())
    assert torch.equal(a[0], b[0]) and a[1] == b[1]


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


# ---- the batch finder -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "true_limit,start,limit",
    [(37, 1, None), (1, 1, None), (64, 4, None), (1000, 3, 200), (500, 8, 4096)],
)
def test_batch_finder_returns_the_true_limit_of_a_synthetic_memory_model(true_limit, start, limit):
    tries = []

    def step(bs):
        tries.append(bs)
        if bs > true_limit:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")

    got = max_batch_size(step, start=start, limit=limit)
    want = min(true_limit, limit) if limit else true_limit
    assert got == want, tries
    assert len(tries) <= 2 * math.ceil(math.log2(max(want, 2))) + 3, tries


def test_batch_finder_errors():
    with pytest.raises(RuntimeError, match="even start=4 does not fit"):
        max_batch_size(lambda bs: (_ for _ in ()).throw(MemoryError()), start=4)
    with pytest.raises(ValueError, match="boom"):
        max_batch_size(lambda bs: (_ for _ in ()).throw(ValueError("boom")))
    with pytest.raises(ValueError, match="limit must be an int >= start"):
        max_batch_size(lambda bs: None, start=8, limit=4)


def test_batch_finder_against_an_rss_limit_on_the_cpu():
    from torchspeed.tune import peak_rss_bytes

    base = peak_rss_bytes()
    mib = 1 << 20

    def step(bs):  # bs MiB, touched
        x = torch.ones(bs * mib // 4)
        del x

    got = max_batch_size(step, start=8, limit=1024, rss_limit_bytes=base + 200 * mib)
    assert 120 <= got <= 200, got


# ---- Lightning ------------------------------------------------------------------------------------


def test_lightning_trains_with_torchspeed_parts_and_the_callback_reports(capsys):
    lightning = pytest.importorskip("lightning")
    from torchspeed.integrations.lightning import TorchspeedCallback

    g = torch.Generator().manual_seed(0)
    x = torch.randn(64, 8, generator=g)
    y = x @ torch.randn(8, 1, generator=g)

    class Module(lightning.LightningModule):
        def __init__(self):
            super().__init__()
            self.net = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1))
            self.losses = []

        def training_step(self, batch, batch_idx):
            xb, yb = batch
            loss = nn.functional.mse_loss(self.net(xb), yb)
            self.losses.append(loss.item())
            return loss

        def configure_optimizers(self):
            return torchspeed.optim.AdamW(self.parameters(), lr=1e-2)

        def train_dataloader(self):
            return torchspeed.data.DataLoader(
                torchspeed.data.TensorSource(x, y), batch_size=8, shuffle=True, seed=0
            )

    module, cb = Module(), TorchspeedCallback()
    trainer = lightning.Trainer(
        max_steps=16,
        accelerator="cpu",
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[cb],
    )
    trainer.fit(module)
    assert len(module.losses) == 16 and module.losses[-1] < module.losses[0]
    assert cb.summary is not None and cb.summary.steps >= 10
    for phase in ("forward", "backward", "optimizer"):
        assert phase in cb.report
    assert cb.report in capsys.readouterr().out
