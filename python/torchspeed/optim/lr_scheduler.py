"""Learning-rate schedules: warmup (linear or exponential) then cosine, linear decay or constant,
and the linear-scaling rule. The formula is C++ (include/torchspeed/optim/lr_scheduler.h), shared
with the C++ ``torchspeed::optim::WarmupLR``.

    sched = torchspeed.optim.lr_scheduler.WarmupLR(opt, warmup_steps=500, total_steps=10_000)
    for x, y in loader:
        ...; opt.step(); sched.step()

It drives any torch.optim optimizer. When a group's ``lr`` is a tensor (torchspeed's fused
optimizers read it on the device), the scheduler keeps its step counter on that device too and
writes the lr with tensor ops only: a CUDA graph that captured ``opt.step(); sched.step()`` follows
the schedule on replay with no host update.
"""

from __future__ import annotations

from typing import List

import torch
from torch.optim.lr_scheduler import LRScheduler

from .. import _C


def scaled_lr(
    reference_lr: float, reference_batch_size: int, batch_size: int, rule: str = "linear"
) -> float:
    """The linear-scaling rule (Goyal et al., 2017): the lr for ``batch_size`` given
    ``reference_lr`` tuned at ``reference_batch_size``; ``rule="sqrt"`` scales by the square
    root (often used with Adam). Pair a large scaled lr with a warmup."""
    return _C.optim.scaled_lr(float(reference_lr), int(reference_batch_size), int(batch_size), rule)


class WarmupLR(LRScheduler):
    """Warmup for ``warmup_steps`` steps, then ``decay`` until ``total_steps``.

    Args:
        optimizer: any torch.optim optimizer (torchspeed's included).
        warmup_steps: steps of warmup (0: none).
        total_steps: the step at which the decay ends (the lr then stays at its last value).
        warmup: "linear" (torch's LinearLR: the factor from ``start_factor`` to 1) or
            "exponential" (geometrically from ``start_factor`` to 1).
        decay: "cosine" (CosineAnnealingLR from the base lr to ``eta_min``), "linear" or
            "constant".
        start_factor: the warmup's first factor (torch's LinearLR default, 1/3).
        eta_min: the lr at the end of the decay (CosineAnnealingLR's default, 0).
        last_epoch: as torch's schedulers (resume with ``load_state_dict`` instead).

    With ``warmup="linear", decay="cosine"`` it equals
    ``SequentialLR([LinearLR(start_factor, total_iters=warmup_steps),
    CosineAnnealingLR(T_max=total_steps - warmup_steps, eta_min)], milestones=[warmup_steps])``
    step for step, in closed form (no drift from a recurrence).
    """

    def __init__(
        self,
        optimizer,
        warmup_steps: int,
        total_steps: int,
        warmup: str = "linear",
        decay: str = "cosine",
        start_factor: float = 1.0 / 3,
        eta_min: float = 0.0,
        last_epoch: int = -1,
    ) -> None:
        for name, v in (("warmup_steps", warmup_steps), ("total_steps", total_steps)):
            if isinstance(v, bool) or not isinstance(v, int):
                raise TypeError(
                    f"torchspeed.optim.lr_scheduler.WarmupLR: {name} must be an int, got {v!r}"
                )
        self._args = (
            int(warmup_steps),
            int(total_steps),
            str(warmup),
            str(decay),
            float(start_factor),
            float(eta_min),
        )
        _C.optim.warmup_lr(0, 1.0, *self._args)  # the shared validator (ValueError-like)
        self.warmup_steps, self.total_steps = int(warmup_steps), int(total_steps)
        self.warmup, self.decay = warmup, decay
        self.start_factor, self.eta_min = float(start_factor), float(eta_min)
        self._device_steps = {}  # device -> the step counter tensor, for tensor lrs
        super().__init__(optimizer, last_epoch)

    def get_lr(self) -> List[float]:
        return [
            _C.optim.warmup_lr(self.last_epoch, float(base), *self._args) for base in self.base_lrs
        ]

    def step(self, epoch=None) -> None:  # noqa: D401 (torch's signature)
        if epoch is not None:
            raise TypeError(
                "torchspeed.optim.lr_scheduler.WarmupLR.step: epoch is not supported (torch "
                "deprecated it); call step() once per optimizer step"
            )
        self.last_epoch += 1
        for t in self._device_steps.values():
            t.add_(1.0)  # on the device: a captured graph's replay advances it too
        self._write()

    def _write(self) -> None:
        lrs = []
        for group, base in zip(self.optimizer.param_groups, self.base_lrs):
            lr = group["lr"]
            if torch.is_tensor(lr):
                t = self._device_steps.get(lr.device)
                if t is None:
                    t = self._device_steps[lr.device] = torch.full(
                        (1,), float(self.last_epoch), dtype=torch.float64, device=lr.device
                    )
                value = _C.optim.warmup_lr(t, float(base), *self._args)
                with torch.no_grad():
                    lr.copy_(value.reshape(lr.shape))
                lrs.append(lr.clone())
            else:
                group["lr"] = _C.optim.warmup_lr(self.last_epoch, float(base), *self._args)
                lrs.append(group["lr"])
        self._last_lr = lrs

    def state_dict(self) -> dict:
        return {k: v for k, v in self.__dict__.items() if k not in ("optimizer", "_device_steps")}

    def load_state_dict(self, state_dict: dict) -> None:
        self.__dict__.update(state_dict)
        for t in self._device_steps.values():
            t.fill_(float(self.last_epoch))
        self._write()  # the restored step's lrs, into the optimizer's groups


__all__ = ["WarmupLR", "scaled_lr"]
