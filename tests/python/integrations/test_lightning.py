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
    return lightning.Trainer(
        accelerator="cpu",
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[cb],
        **kw,
    )


def _nothing_running():
    assert not mm._global_forward_pre_hooks and not mm._global_forward_hooks
    assert not om._global_optimizer_pre_hooks and not om._global_optimizer_post_hooks
    assert not hooks_mod._active_hooks
    assert ranges_mod._timeline() is None


def test_lightning_trains_with_torchspeed_parts_and_the_callback_reports(capsys):
    from torchspeed.integrations.lightning import TorchspeedCallback

    module, cb = _Module(), TorchspeedCallback()
    _trainer(cb).fit(module)
    assert len(module.losses) == 16 and module.losses[-1] < module.losses[0]
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
