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
    def __init__(self, optimizer_class):
        super().__init__()
        self.optimizer_class = optimizer_class

    def configure_optimizers(self):
        return self.optimizer_class(self.parameters(), lr=1e-2)


# "16-mixed+scaler": fp16 autocast and a GradScaler, as on CUDA (a CPU Trainer turns "16-mixed"
# into "bf16-mixed", so the plugin is passed explicitly).
@pytest.mark.parametrize("precision", ["bf16-mixed", "16-mixed+scaler", "32"])
@pytest.mark.parametrize("algorithm", ["norm", "value"])
def test_gradient_clip_val_with_torchspeed_adamw_equals_torch_adamw(precision, algorithm):
    # Issue 25 item 5: under a mixed precision Lightning refused torchspeed's optimizers
    # ("does not allow for gradient clipping because it performs unscaling of gradients
    # internally"). The user's Trainer arguments stay as they are; the callback handles it.
    from torchspeed.integrations.lightning import TorchspeedCallback

    # Small enough that every step clips (the grads' norm is ~1-10, their largest entries ~1).
    clip = 0.05 if algorithm == "norm" else 0.02
    params = {}
    for name, cls in (("torch", torch.optim.AdamW), ("torchspeed", torchspeed.optim.AdamW)):
        torch.manual_seed(0)
        module = _ClipModule(cls)
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
