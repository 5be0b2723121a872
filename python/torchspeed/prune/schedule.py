"""Gradual pruning during training: Zhu & Gupta's cubic sparsity schedule (arXiv 1710.01878).

    pruner = torchspeed.prune.GradualPruner(model, final_sparsity=0.9, start_step=100,
                                            end_step=1100, frequency=100, optimizer=opt)
    for batch in loader:
        loss(model(batch)).backward(); opt.step(); opt.zero_grad()
        pruner.step()                # prunes at steps 100, 200, ..., 1100 to the scheduled sparsity

    s_t = s_f + (s_i - s_f) * (1 - (t - t0) / (end - t0)) ** 3   for t0 <= t <= end

Between pruning steps the optimizer (``optimizer=``) keeps the pruned weights at zero.
"""

from __future__ import annotations

import math
import numbers
from typing import Any, Dict, Optional

from .api import _check_nm, global_unstructured, l1_unstructured, ln_structured, nm_sparse
from .mask import _param, _targets
from .optimizer_masks import _check_optimizer

_METHODS = ("unstructured", "global", "structured", "nm")


def cubic_sparsity(
    step: int, initial: float, final: float, start_step: int, end_step: int
) -> Optional[float]:
    """The scheduled sparsity at ``step`` (None before ``start_step``; ``final`` after the end)."""
    for label, v in (("step", step), ("start_step", start_step), ("end_step", end_step)):
        if isinstance(v, bool) or not isinstance(v, numbers.Integral):
            raise TypeError(f"torchspeed.prune.cubic_sparsity: {label} must be an int, got {v!r}")
    for label, v in (("initial", initial), ("final", final)):
        if isinstance(v, bool) or not isinstance(v, numbers.Real):
            raise TypeError(
                f"torchspeed.prune.cubic_sparsity: {label} must be a float in [0, 1], got {v!r}"
            )
        if not 0.0 <= float(v) <= 1.0:
            raise ValueError(
                f"torchspeed.prune.cubic_sparsity: {label} must be in [0, 1], got {v!r}"
            )
    if step < start_step:
        return None
    if end_step <= start_step or step >= end_step:
        return float(final)
    progress = (step - start_step) / (end_step - start_step)
    return float(final + (initial - final) * (1.0 - progress) ** 3)


class GradualPruner:
    """Prunes ``model_or_params`` (a model: every Linear/Conv weight; or (module, name) pairs) to
    the cubic schedule's sparsity every ``frequency`` steps from ``start_step`` to ``end_step``.

    method: "unstructured" (l1 per tensor), "global" (one threshold across the tensors),
    "structured" (output channels by L2 norm, the fraction of channels), or "nm": n:m along the
    input, reached gradually (``m - n`` pruned per group at the end; ``round((m - n) * s_t /
    s_f)`` on the way, with ``final_sparsity`` = (m - n) / m implied when left None).
    Call ``step()`` once per training step (after ``optimizer.step()``); ``state_dict()`` holds
    the step count (the masks live in the model's state_dict).
    """

    def __init__(
        self,
        model_or_params,
        final_sparsity: Optional[float] = None,
        start_step: int = 0,
        end_step: int = 1000,
        frequency: int = 100,
        initial_sparsity: float = 0.0,
        method: str = "unstructured",
        n: int = 2,
        m: int = 4,
        optimizer=None,
    ):
        where = "GradualPruner"
        if not isinstance(method, str):
            raise TypeError(f"torchspeed.prune.{where}: method must be a str, got {method!r}")
        if method not in _METHODS:
            raise ValueError(
                f"torchspeed.prune.{where}: method must be one of {_METHODS}, got {method!r}"
            )
        for label, v in (
            ("final_sparsity", final_sparsity),
            ("initial_sparsity", initial_sparsity),
        ):
            if v is None and label == "final_sparsity":
                continue
            if isinstance(v, bool) or not isinstance(v, numbers.Real):
                raise TypeError(
                    f"torchspeed.prune.{where}: {label} must be a float in [0, 1], got {v!r}"
                )
            if not (0.0 <= float(v) <= 1.0):
                raise ValueError(f"torchspeed.prune.{where}: {label} must be in [0, 1], got {v!r}")
        for label, v in (
            ("start_step", start_step),
            ("end_step", end_step),
            ("frequency", frequency),
        ):
            if isinstance(v, bool) or not isinstance(v, numbers.Integral):
                raise TypeError(f"torchspeed.prune.{where}: {label} must be an int, got {v!r}")
        if frequency < 1:
            raise ValueError(f"torchspeed.prune.{where}: frequency must be >= 1, got {frequency}")
        if start_step < 0:
            raise ValueError(f"torchspeed.prune.{where}: start_step must be >= 0, got {start_step}")
        if end_step < start_step:
            raise ValueError(
                f"torchspeed.prune.{where}: end_step must be >= start_step ({start_step}), got "
                f"{end_step}"
            )
        if method == "nm":
            _check_nm(n, m, where)
            implied = (m - n) / m
            if final_sparsity is None:
                final_sparsity = implied
            elif abs(float(final_sparsity) - implied) > 1e-9:
                raise ValueError(
                    f"torchspeed.prune.{where}: with method='nm', final_sparsity must be "
                    f"(m - n) / m = {implied} (or None), got {final_sparsity!r}"
                )
        if final_sparsity is None:
            raise ValueError(f"torchspeed.prune.{where}: final_sparsity is required")
        if initial_sparsity > final_sparsity:
            raise ValueError(
                f"torchspeed.prune.{where}: initial_sparsity ({initial_sparsity}) must be <= "
                f"final_sparsity ({final_sparsity})"
            )
        self.targets = _targets(model_or_params, where)
        if not self.targets:
            raise ValueError(f"torchspeed.prune.{where}: nothing to prune")
        # Every target is checked now, so that no step() fails part-way through the targets.
        weights = [_param(mod, name) for mod, name in self.targets]
        if method == "nm":
            for (mod, name), w in zip(self.targets, weights):
                row = math.prod(w.shape[1:]) if w.dim() > 1 else w.numel()
                if row % m:
                    raise ValueError(
                        f"torchspeed.prune.{where}: the rows of {type(mod).__name__}.{name} "
                        f"(shape {list(w.shape)}) have {row} elements, not a multiple of m = {m}"
                    )
        _check_optimizer(optimizer, weights)
        self.final_sparsity = float(final_sparsity)
        self.initial_sparsity = float(initial_sparsity)
        self.start_step, self.end_step = int(start_step), int(end_step)
        self.frequency = int(frequency)
        self.method, self.n, self.m = method, int(n), int(m)
        self.optimizer = optimizer
        self.step_count = 0  # steps taken; the next step() is step number step_count
        self.last_sparsity: Optional[float] = None

    def sparsity_at(self, step: int) -> Optional[float]:
        return cubic_sparsity(
            step, self.initial_sparsity, self.final_sparsity, self.start_step, self.end_step
        )

    def _due(self, t: int) -> bool:
        if t < self.start_step or t > self.end_step:
            return False
        return (t - self.start_step) % self.frequency == 0 or t == self.end_step

    def step(self) -> Optional[float]:
        """Advance one training step; prune when due. Returns the sparsity applied, or None."""
        t = self.step_count
        s = self.sparsity_at(t) if self._due(t) else None
        if s is not None:
            self.prune_to(s)  # an error leaves step_count as it was
        self.step_count = t + 1
        return s

    def prune_to(self, s: float) -> None:
        opt = self.optimizer
        if self.method == "unstructured":
            for mod, name in self.targets:
                l1_unstructured(mod, name, float(s), optimizer=opt)
        elif self.method == "global":
            global_unstructured(self.targets, float(s), optimizer=opt)
        elif self.method == "structured":
            for mod, name in self.targets:
                ln_structured(mod, name, float(s), n=2, dim=0, optimizer=opt)
        else:
            frac = s / self.final_sparsity if self.final_sparsity > 0 else 1.0
            pruned = int(round((self.m - self.n) * frac))
            for mod, name in self.targets:
                nm_sparse(mod, name, n=self.m - pruned, m=self.m, optimizer=opt)
        self.last_sparsity = float(s)

    def state_dict(self) -> Dict[str, Any]:
        return {
            "step_count": self.step_count,
            "last_sparsity": self.last_sparsity,
            "final_sparsity": self.final_sparsity,
            "initial_sparsity": self.initial_sparsity,
            "start_step": self.start_step,
            "end_step": self.end_step,
            "frequency": self.frequency,
            "method": self.method,
            "n": self.n,
            "m": self.m,
        }

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        if not isinstance(state, dict):
            raise TypeError(
                f"torchspeed.prune.GradualPruner.load_state_dict: state must be a dict, got "
                f"{type(state)}"
            )
        for key in (
            "final_sparsity",
            "initial_sparsity",
            "start_step",
            "end_step",
            "frequency",
            "method",
            "n",
            "m",
        ):
            if key in state and state[key] != getattr(self, key):
                raise ValueError(
                    f"torchspeed.prune.GradualPruner.load_state_dict: {key} is {state[key]!r} in "
                    f"the state_dict, {getattr(self, key)!r} here"
                )
        count = state.get("step_count")
        if isinstance(count, bool) or not isinstance(count, numbers.Integral) or count < 0:
            raise ValueError(
                "torchspeed.prune.GradualPruner.load_state_dict: step_count must be an int >= 0, "
                f"got {count!r}" + ("" if "step_count" in state else " (missing)")
            )
        last = state.get("last_sparsity")
        if last is not None and (
            isinstance(last, bool)
            or not isinstance(last, numbers.Real)
            or not 0.0 <= float(last) <= 1.0
        ):
            raise ValueError(
                "torchspeed.prune.GradualPruner.load_state_dict: last_sparsity must be None or a "
                f"float in [0, 1], got {last!r}"
            )
        self.step_count = int(count)
        self.last_sparsity = None if last is None else float(last)

    def __repr__(self) -> str:
        return (
            f"GradualPruner(method={self.method!r}, {self.initial_sparsity} -> "
            f"{self.final_sparsity} over steps [{self.start_step}, {self.end_step}] every "
            f"{self.frequency}, step_count={self.step_count}, tensors={len(self.targets)})"
        )
