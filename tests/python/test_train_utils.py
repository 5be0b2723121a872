"""Lightning with torchspeed's parts and TorchspeedCallback. (The schedules, checkpoints and batch
finder that lived here are in optim/test_lr_scheduler.py, test_checkpoint.py and test_tune.py.)"""

from __future__ import annotations

import pytest
import torch
from torch import nn

import torchspeed

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
