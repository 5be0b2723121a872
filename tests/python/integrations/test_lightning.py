"""Lightning with torchspeed's parts and TorchspeedCallback: a fit reports its phases, a fit that
raises leaves nothing running, and a profiler step is an optimizer step under accumulation."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.nn.modules import module as mm
from torch.optim import optimizer as om

import torchspeed
from torchspeed.profile import hooks as hooks_mod
from torchspeed.profile import ranges as ranges_mod

lightning = pytest.importorskip("lightning")


def _data():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(64, 8, generator=g)
    return x, x @ torch.randn(8, 1, generator=g)


class _Module(lightning.LightningModule):
    def __init__(self, fail_at=None):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1))
        self.losses = []
        self.fail_at = fail_at
        self.x, self.y = _data()

    def training_step(self, batch, batch_idx):
        if batch_idx == self.fail_at:
            raise RuntimeError("training_step failed")
        xb, yb = batch
        loss = nn.functional.mse_loss(self.net(xb), yb)
        self.losses.append(loss.item())
        return loss

    def configure_optimizers(self):
        return torchspeed.optim.AdamW(self.parameters(), lr=1e-2)

    def train_dataloader(self):
        return torchspeed.data.DataLoader(
            torchspeed.data.TensorSource(self.x, self.y), batch_size=8, shuffle=True, seed=0
        )


def _trainer(cb, **kw):
    kw.setdefault("max_steps", 16)
    kw.setdefault("enable_checkpointing", False)
    kw.setdefault("callbacks", [cb])
    return lightning.Trainer(
        accelerator="cpu",
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        **kw,
    )


def _nothing_running():
    assert not mm._global_forward_pre_hooks and not mm._global_forward_hooks
    assert not om._global_optimizer_pre_hooks and not om._global_optimizer_post_hooks
    assert not hooks_mod._active_hooks
    assert ranges_mod._timeline() is None


def test_lightning_trains_with_torchspeed_parts_and_the_callback_reports(capsys):
    from torchspeed.integrations.lightning import TorchspeedCallback

    torch.manual_seed(0)
    module, cb = _Module(), TorchspeedCallback()
    _trainer(cb).fit(module)
    # It learns: the last epoch's mean loss (8 shuffled batches) is below the first's (one
    # batch against another depended on the random init and the shuffle order).
    losses = module.losses
    assert len(losses) == 16 and sum(losses[8:]) < sum(losses[:8])
    assert cb.summary is not None and cb.summary.steps >= 10
    for phase in ("forward", "backward", "optimizer"):
        assert phase in cb.report
    assert cb.report in capsys.readouterr().out
    _nothing_running()


def test_an_exception_in_training_step_stops_the_profiler_and_the_next_fit_runs():
    # Issue 23 item 17: the profiler and torch's hooks stayed on, and the next fit failed with
    # "another StepProfiler is running".
    from torchspeed.integrations.lightning import TorchspeedCallback

    cb = TorchspeedCallback(print_report=False)
    with pytest.raises(RuntimeError, match="training_step failed"):
        _trainer(cb).fit(_Module(fail_at=3))
    assert cb.profiler is None
    _nothing_running()
    for again in (cb, TorchspeedCallback(print_report=False)):  # the same callback, or a new one
        module = _Module()
        _trainer(again, max_steps=4).fit(module)
        assert len(module.losses) == 4 and again.summary is not None
        _nothing_running()


def test_steps_are_optimizer_steps_under_accumulate_grad_batches():
    # 16 micro-batches, 4 per optimizer step: 4 profiler steps (the callback counted 16).
    from torchspeed.integrations.lightning import TorchspeedCallback

    cb = TorchspeedCallback(print_report=False)
    module = _Module()
    _trainer(cb, max_steps=4, accumulate_grad_batches=4).fit(module)
    assert len(module.losses) == 16
    assert cb.profiler is None
    assert cb.summary is not None
    assert cb.summary.steps == 4 - 1  # the warmup step is left out of the summary


class _ClipModule(_Module):
    def __init__(self, opt_cls):
        super().__init__()
        self.opt_cls = opt_cls

    def configure_optimizers(self):
        return self.opt_cls(self.parameters(), lr=1e-2)

    def train_dataloader(self):  # torch's loader, in order: both runs see the same batches
        return torch.utils.data.DataLoader(
            torch.utils.data.TensorDataset(self.x, self.y * 50), batch_size=8
        )


@pytest.mark.parametrize("algorithm", ["norm", "value"])
def test_gradient_clip_val_with_torchspeeds_optimizer_under_bf16_mixed(algorithm):
    # Issue 25: Lightning raised "does not allow for gradient clipping because it performs
    # unscaling of gradients internally" for torchspeed's AdamW under any mixed precision. The
    # Trainer's arguments now work unchanged and clip as Lightning clips torch's AdamW.
    from torchspeed.integrations.lightning import TorchspeedCallback

    results = {}
    for name, opt_cls in (("torch", torch.optim.AdamW), ("torchspeed", torchspeed.optim.AdamW)):
        torch.manual_seed(0)
        module = _ClipModule(opt_cls)
        trainer = _trainer(
            TorchspeedCallback(hooks=False, print_report=False),
            max_steps=6,
            precision="bf16-mixed",
            gradient_clip_val=0.05,
            gradient_clip_algorithm=algorithm,
        )
        trainer.fit(module)
        assert trainer.gradient_clip_val == 0.05  # the user's value is back after the fit
        results[name] = (module.losses, [p.detach().clone() for p in module.parameters()])
    # The same clipped updates: torchspeed's AdamW against torch's (fp32 master math, bf16
    # autocast forward in both: max diff 3e-8 here); leaving the clip out moves them by 0.02.
    torch.testing.assert_close(results["torchspeed"][0], results["torch"][0], rtol=1e-5, atol=1e-6)
    for a, b in zip(results["torchspeed"][1], results["torch"][1]):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    _nothing_running()


def test_resume_through_ckpt_path_with_torchspeeds_loader_is_exact(tmp_path):
    # Issue 25: a resume through ckpt_path with torchspeed's loader must continue the same
    # batches and weights as the uninterrupted run, mid-epoch (step 4 of 8 per epoch) and at the
    # epoch boundary (step 8). Lightning saves and restores the loader's state_dict.
    from lightning.pytorch.callbacks import ModelCheckpoint

    from torchspeed.integrations.lightning import TorchspeedCallback

    def fit(ckpt_path=None, save=False):
        torch.manual_seed(0)
        module = _Module()
        callbacks = [TorchspeedCallback(hooks=False, print_report=False)]
        if save:
            callbacks.append(
                ModelCheckpoint(dirpath=tmp_path, every_n_train_steps=4, save_top_k=-1)
            )
        trainer = lightning.Trainer(
            max_steps=12,
            accelerator="cpu",
            logger=False,
            enable_checkpointing=save,
            enable_progress_bar=False,
            enable_model_summary=False,
            callbacks=callbacks,
        )
        trainer.fit(module, ckpt_path=ckpt_path)
        return module

    full = fit(save=True)
    for step in (4, 8):
        (ckpt,) = tmp_path.glob(f"*step={step}.ckpt")
        resumed = fit(ckpt_path=str(ckpt))
        assert resumed.losses == full.losses[step:], step  # the same batches, bit for bit
        for a, b in zip(resumed.parameters(), full.parameters()):
            assert torch.equal(a, b), step
    _nothing_running()


class _TwoGroupClipModule(_ClipModule):
    def configure_optimizers(self):  # the norm is over both groups together, as Lightning's
        first, second = self.net[0], self.net[2]
        groups = [{"params": first.parameters()}, {"params": second.parameters(), "lr": 3e-3}]
        return self.opt_cls(groups, lr=1e-2)


# "16-mixed+scaler": fp16 autocast and a GradScaler, as on CUDA (a CPU Trainer turns "16-mixed"
# into "bf16-mixed", so the plugin is passed explicitly).
@pytest.mark.parametrize(
    "precision,groups",
    [("bf16-mixed", 1), ("16-mixed+scaler", 1), ("32", 1), ("16-mixed+scaler", 2)],
)
@pytest.mark.parametrize("algorithm", ["norm", "value"])
def test_gradient_clip_val_with_torchspeed_adamw_equals_torch_adamw(precision, groups, algorithm):
    # Issue 25 item 5: under a mixed precision Lightning refused torchspeed's optimizers
    # ("does not allow for gradient clipping because it performs unscaling of gradients
    # internally"). The user's Trainer arguments stay as they are; the callback handles it.
    from torchspeed.integrations.lightning import TorchspeedCallback

    # Small enough that every step clips (the grads' norm is ~1-10, their largest entries ~1).
    clip = 0.05 if algorithm == "norm" else 0.02
    params = {}
    for name, cls in (("torch", torch.optim.AdamW), ("torchspeed", torchspeed.optim.AdamW)):
        torch.manual_seed(0)
        module = (_ClipModule if groups == 1 else _TwoGroupClipModule)(cls)
        cb = TorchspeedCallback(hooks=False, print_report=False)
        kw = dict(gradient_clip_val=clip, gradient_clip_algorithm=algorithm, precision=precision)
        if precision == "16-mixed+scaler":
            from lightning.pytorch.plugins.precision import MixedPrecision

            scaler = torch.amp.GradScaler("cpu", init_scale=2.0**10)
            kw.update(precision=None, plugins=[MixedPrecision("16-mixed", "cpu", scaler)])
        _trainer(cb, max_steps=8, **kw).fit(module)
        params[name] = [p.detach().clone() for p in module.parameters()]
    # The same clipped grads; torchspeed's fused AdamW rounds its fp32 update differently.
    torch.testing.assert_close(params["torchspeed"], params["torch"], rtol=1e-5, atol=1e-6)


class _RecordingModule(_Module):
    """Records the inputs of every training batch (64 samples, batch 8: 8 batches an epoch)."""

    def __init__(self):
        super().__init__()
        self.seen = []

    def training_step(self, batch, batch_idx):
        self.seen.append(batch[0].clone())
        return super().training_step(batch, batch_idx)


# A checkpoint every `every` steps (max_steps=16) or at the end of epoch 0 (max_epochs=3):
# mid-epoch 0, the end of epoch 0 (both ways), mid-epoch 1.
@pytest.mark.parametrize("every", ["steps=5", "steps=8", "steps=11", "epochs=1"])
def test_resume_with_ckpt_path_restores_torchspeed_loader_exactly(tmp_path, every):
    # Issue 25 item 5: the batches after Trainer.fit(ckpt_path=...) equal those of the run that
    # never stopped. At an epoch's end Lightning does not load the loader's state (it starts the
    # next epoch afresh), and its "is it iterable?" check's iter() advanced the loader's epoch.
    from lightning.pytorch.callbacks import ModelCheckpoint

    from torchspeed.integrations.lightning import TorchspeedCallback

    unit, n = every.split("=")
    stop_at, limits = (int(n), dict(max_steps=16)) if unit == "steps" else (8, dict(max_epochs=3))
    if unit == "epochs":
        limits["max_steps"] = -1
    full = _RecordingModule()
    every_n = {"every_n_train_steps" if unit == "steps" else "every_n_epochs": int(n)}
    saver = ModelCheckpoint(dirpath=tmp_path, save_top_k=-1, **every_n)
    cb = TorchspeedCallback(hooks=False, print_report=False)
    _trainer(cb, enable_checkpointing=True, callbacks=[cb, saver], **limits).fit(full)
    (ckpt,) = [p for p in tmp_path.iterdir() if f"step={stop_at}." in p.name]

    resumed = _RecordingModule()
    cb = TorchspeedCallback(hooks=False, print_report=False)
    _trainer(cb, **limits).fit(resumed, ckpt_path=str(ckpt))
    assert len(resumed.seen) == len(full.seen) - stop_at
    for i, (got, want) in enumerate(zip(resumed.seen, full.seen[stop_at:])):
        assert torch.equal(got, want), f"batch {stop_at + i} differs after the resume"
    for p, q in zip(resumed.parameters(), full.parameters()):
        torch.testing.assert_close(p, q, rtol=0, atol=0)  # the same batches: bitwise the same


def test_an_iter_never_advanced_does_not_start_an_epoch_of_torchspeed_loader():
    # Lightning checks that a loader which is not torch's is iterable with one iter(): that
    # started an epoch, and the next iter() abandoned it, so Lightning's epoch 0 ran the
    # loader's epoch 1 (its state_dict said epoch 1 from the first batch).
    x = torch.arange(64.0).reshape(64, 1)

    def loader():
        return torchspeed.data.DataLoader(
            torchspeed.data.TensorSource(x), batch_size=8, shuffle=True, seed=0
        )

    fresh, checked = loader(), loader()
    iter(checked)  # never advanced
    first = [b[0] for b in checked]
    assert checked.state_dict()["epoch"] == 1  # one epoch ran: epoch 0
    assert all(torch.equal(a, b[0]) for a, b in zip(first, fresh))


def test_the_loader_epoch_is_lightnings_epoch():
    import lightning as L

    seen = []

    class Probe(L.Callback):
        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
            state = trainer.train_dataloader.state_dict()
            seen.append((trainer.current_epoch, state["epoch"], state["batches_consumed"]))

    _trainer(None, max_steps=-1, max_epochs=2, callbacks=[Probe()]).fit(_RecordingModule())
    assert seen == [(e, e, i + 1) for e in range(2) for i in range(8)]
