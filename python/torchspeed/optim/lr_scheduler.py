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

import numbers
from typing import List, Mapping

import torch
from torch.optim.lr_scheduler import LRScheduler

from .. import _C

_NAME = "torchspeed.optim.lr_scheduler"


def _real(value, name: str, who: str) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{_NAME}.{who}: {name} must be a real number, got {value!r}")
    return float(value)


def _int(value, name: str, who: str) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{_NAME}.{who}: {name} must be an int, got {value!r}")
    value = int(value)
    if not -(2**62) <= value <= 2**62:
        raise ValueError(f"{_NAME}.{who}: {name} must be within +-2**62, got {value}")
    return value


def _str(value, name: str, who: str) -> str:
    if not isinstance(value, str):
        raise TypeError(f"{_NAME}.{who}: {name} must be a str, got {value!r}")
    return value


def scaled_lr(
    reference_lr: float, reference_batch_size: int, batch_size: int, rule: str = "linear"
) -> float:
    """The linear-scaling rule (Goyal et al., 2017): the lr for ``batch_size`` given
    ``reference_lr`` tuned at ``reference_batch_size``; ``rule="sqrt"`` scales by the square
    root (often used with Adam). Pair a large scaled lr with a warmup."""
    who = "scaled_lr"
    return _C.optim.scaled_lr(
        _real(reference_lr, "reference_lr", who),
        _int(reference_batch_size, "reference_batch_size", who),
        _int(batch_size, "batch_size", who),
        _str(rule, "rule", who),
    )


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
    step for step up to ``total_steps``, in closed form (no drift from a recurrence). After
    ``total_steps`` they differ on purpose: WarmupLR holds ``eta_min``, while torch's cosine is
    periodic and rises back towards the base lr (a warm restart nobody asked for). The linear
    and constant decays hold their last value, as torch's LinearLR and ConstantLR do.
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
        who = "WarmupLR"
        self._args = (
            _int(warmup_steps, "warmup_steps", who),
            _int(total_steps, "total_steps", who),
            _str(warmup, "warmup", who),
            _str(decay, "decay", who),
            _real(start_factor, "start_factor", who),
            _real(eta_min, "eta_min", who),
        )
        last_epoch = _int(last_epoch, "last_epoch", who)
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

    # What torch's LRScheduler keeps in its state besides ours, over torch versions.
    _TORCH_KEYS = frozenset(
        {"verbose", "_step_count", "_get_lr_called_within_step", "_is_initial", "_last_lr"}
    )

    def state_dict(self) -> dict:
        return {k: v for k, v in self.__dict__.items() if k not in ("optimizer", "_device_steps")}

    def load_state_dict(self, state_dict: dict) -> None:
        """Restores :meth:`state_dict`. Every key is checked before any is set: TypeError naming
        the key for a value of the wrong type, ValueError for an unknown key (one that is not
        scheduler state, e.g. a method's name) or bad settings."""
        who = "WarmupLR.load_state_dict"
        if not isinstance(state_dict, Mapping):
            raise TypeError(
                f"{_NAME}.{who}: state_dict must be a dict, got {type(state_dict).__name__}"
            )
        own = set(self.state_dict())
        unknown = sorted(str(k) for k in state_dict if k not in own and k not in self._TORCH_KEYS)
        if unknown:
            raise ValueError(f"{_NAME}.{who}: unknown keys {unknown} (known: {sorted(own)})")
        if "last_epoch" not in state_dict:
            raise ValueError(f"{_NAME}.{who}: state_dict has no 'last_epoch'")
        new = dict(state_dict)
        new["last_epoch"] = _int(state_dict["last_epoch"], "state_dict['last_epoch']", who)
        if new["last_epoch"] < -1:
            raise ValueError(
                f"{_NAME}.{who}: state_dict['last_epoch'] must be >= -1, got {new['last_epoch']}"
            )
        if "base_lrs" in new:
            base = new["base_lrs"]
            if not isinstance(base, (list, tuple)) or len(base) != len(self.optimizer.param_groups):
                raise ValueError(
                    f"{_NAME}.{who}: state_dict['base_lrs'] must be a list of one lr per param "
                    f"group ({len(self.optimizer.param_groups)}), got {base!r}"
                )
            new["base_lrs"] = [
                _real(v, f"state_dict['base_lrs'][{i}]", who) if not torch.is_tensor(v) else v
                for i, v in enumerate(base)
            ]
        for k, kind in (("warmup_steps", _int), ("total_steps", _int), ("warmup", _str),
                        ("decay", _str), ("start_factor", _real), ("eta_min", _real)):  # fmt: skip
            if k in new:
                new[k] = kind(new[k], f"state_dict[{k!r}]", who)
        if "_args" in new:
            args = new["_args"]
            if not isinstance(args, (list, tuple)) or len(args) != 6:
                raise TypeError(
                    f"{_NAME}.{who}: state_dict['_args'] must be the 6 schedule settings, got "
                    f"{args!r}"
                )
            names = ("warmup_steps", "total_steps", "warmup", "decay", "start_factor", "eta_min")
            kinds = (_int, _int, _str, _str, _real, _real)
            new["_args"] = tuple(
                kind(v, f"state_dict['_args'] ({n})", who) for kind, v, n in zip(kinds, args, names)
            )
            _C.optim.warmup_lr(0, 1.0, *new["_args"])  # the shared validator
            for n, v in zip(names, new["_args"]):
                if n in new and new[n] != v:
                    raise ValueError(
                        f"{_NAME}.{who}: state_dict[{n!r}] = {new[n]!r} disagrees with its "
                        f"'_args' ({v!r})"
                    )
        self.__dict__.update(new)
        for t in self._device_steps.values():
            t.fill_(float(self.last_epoch))
        self._write()  # the restored step's lrs, into the optimizer's groups


__all__ = ["WarmupLR", "scaled_lr"]
