"""`torchspeed doctor --verify`: advice that checks itself. The script is run a few steps as it is,
then once more per applicable fix with the fix applied from outside (no edit), and each fix's
measured gain is printed beside the estimate, with the loss drift over those steps so a numerics
change shows. The headspace run serves the first batch again and again: the step time with the
data already in memory, which proves or refutes a data bottleneck.

Each run executes the script again from its start in this process (its files are written again).
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import os
from typing import Callable, Dict, Iterator, List, Optional

import torch

from .summary import Finding


@dataclasses.dataclass
class VerifyRow:
    fix: str
    rule: str
    estimated_gain_s: Optional[float]
    step_median_s: float
    measured_gain_s: float
    loss_drift: Optional[float]  # max |loss - baseline loss| / |baseline loss| over the steps


@contextlib.contextmanager
def _patched(owner, name: str, value) -> Iterator[None]:
    own = name in vars(owner)
    orig = vars(owner)[name] if own else None
    setattr(owner, name, value)
    try:
        yield
    finally:
        if own:
            setattr(owner, name, orig)
        else:
            delattr(owner, name)


@contextlib.contextmanager
def losses_recorded(out: List[float]) -> Iterator[None]:
    """Records the value of each scalar a backward starts from (the loss)."""
    orig = torch.autograd.backward

    def backward(tensors, *args, **kwargs):
        t = tensors[0] if isinstance(tensors, (list, tuple)) and tensors else tensors
        if isinstance(t, torch.Tensor) and t.numel() == 1:
            out.append(float(t.detach().float()))
        return orig(tensors, *args, **kwargs)

    with _patched(torch.autograd, "backward", backward):
        yield


@contextlib.contextmanager
def autocast_bf16() -> Iterator[None]:
    """torch.autocast(bfloat16) around every outermost module forward."""
    from torch.nn.modules import module as mm

    state = {"depth": 0, "ctx": None}

    def pre(module, args):
        if state["depth"] == 0:
            p = next(module.parameters(), None)
            dev = p.device.type if p is not None else "cpu"
            state["ctx"] = torch.autocast(dev, dtype=torch.bfloat16)
            state["ctx"].__enter__()
        state["depth"] += 1

    def post(module, args, output):
        state["depth"] -= 1
        if state["depth"] == 0 and state["ctx"] is not None:
            state["ctx"].__exit__(None, None, None)
            state["ctx"] = None

    h1 = mm.register_module_forward_pre_hook(pre)
    h2 = mm.register_module_forward_hook(post, always_call=True)
    try:
        yield
    finally:
        h1.remove()
        h2.remove()


_TORCH_TO_TORCHSPEED = ("SGD", "Adam", "AdamW")


@contextlib.contextmanager
def torchspeed_optimizer(fold_clip: bool = False) -> Iterator[None]:
    """torch.optim.SGD/Adam/AdamW made as torchspeed's (same hyperparameters); with fold_clip,
    clip_grad_norm_ becomes the optimizer's max_grad_norm (the first max_norm seen)."""
    from .. import optim as ts_optim

    made: List[torch.optim.Optimizer] = []
    with contextlib.ExitStack() as stack:
        for name in _TORCH_TO_TORCHSPEED:
            cls = getattr(ts_optim, name)

            def make(*args, _cls=cls, **kwargs):
                for k in ("foreach", "fused", "capturable", "differentiable"):
                    kwargs.pop(k, None)
                opt = _cls(*args, **kwargs)
                made.append(opt)
                return opt

            stack.enter_context(_patched(torch.optim, name, make))
        if fold_clip:
            orig = torch.nn.utils.clip_grad_norm_

            def clip(parameters, max_norm, *args, **kwargs):
                if not made:
                    return orig(parameters, max_norm, *args, **kwargs)
                for opt in made:
                    for g in opt.param_groups:
                        if g.get("max_grad_norm") is None:
                            g["max_grad_norm"] = float(max_norm)
                return torch.zeros(())

            stack.enter_context(_patched(torch.nn.utils, "clip_grad_norm_", clip))
        yield


@contextlib.contextmanager
def more_workers(n: int) -> Iterator[None]:
    """torch DataLoaders made with num_workers=0 get n workers."""
    from torch.utils.data import dataloader as dl

    orig = dl.DataLoader.__init__

    def __init__(self, *args, **kwargs):
        if kwargs.get("num_workers", 0) == 0 and len(args) < 6:
            kwargs["num_workers"] = n
        orig(self, *args, **kwargs)

    with _patched(dl.DataLoader, "__init__", __init__):
        yield


@contextlib.contextmanager
def headspace() -> Iterator[None]:
    """Each DataLoader iterator serves its first batch again and again: no data cost."""
    from torch.utils.data import dataloader as dl

    orig = dl._BaseDataLoaderIter.__next__
    first: Dict[int, object] = {}

    def __next__(it):
        key = id(it)
        if key not in first:
            first[key] = orig(it)
        return first[key]

    with _patched(dl._BaseDataLoaderIter, "__next__", __next__):
        yield


def _fixes(findings: List[Finding]) -> List[tuple]:
    """(name, rule, context factory) for each fix the findings call for."""
    rules = {f.rule for f in findings}
    out = []
    if "amp" in rules:
        out.append(("bf16 autocast", "amp", autocast_bf16))
    if "optimizer" in rules or "clip_into_optimizer" in rules:
        fold = "clip_into_optimizer" in rules
        name = "torchspeed optimizer" + (" + max_grad_norm" if fold else "")
        out.append((name, "optimizer", lambda: torchspeed_optimizer(fold_clip=fold)))
    if "data_wait" in rules or "num_workers_zero" in rules:
        n = max(1, min(4, (os.cpu_count() or 2) - 1))
        out.append((f"{n} loader workers", "data_wait", lambda: more_workers(n)))
        out.append(("headspace (data in memory)", "headspace", headspace))
    return out


def verify(run_steps: Callable[[contextlib.AbstractContextManager], tuple]) -> list:
    """run_steps(context) runs the script's first steps under the context and returns (step
    median s, losses, findings, data wait median s). Returns the rows: the baseline, then one
    per fix its findings call for. The headspace run's estimate is the whole data wait."""
    base_s, base_losses, findings, data_wait_s = run_steps(contextlib.nullcontext())
    estimates = {f.rule: f.est_gain_s for f in findings if f.est_gain_s > 0}
    estimates["headspace"] = data_wait_s
    rows = [VerifyRow("as the script is", "", None, base_s, 0.0, 0.0)]
    for name, rule, make in _fixes(findings):
        s, losses, _, _ = run_steps(make())
        drift = None
        n = min(len(losses), len(base_losses))
        if n:
            drift = max(
                abs(a - b) / max(abs(b), 1e-12) for a, b in zip(losses[:n], base_losses[:n])
            )
            drift = drift if math.isfinite(drift) else float("inf")
        rows.append(VerifyRow(name, rule, estimates.get(rule), s, base_s - s, drift))
    return rows


def format_rows(rows: List[VerifyRow], steps: int) -> str:
    def ms(x):
        return "-" if x is None else f"{1e3 * x:.1f} ms"

    lines = [
        f"verified ({steps} steps per run, the step median; gain = the baseline's minus the fix's):",
        f"  {'fix':<36} {'step':>10} {'measured gain':>14} {'estimated':>10} {'loss drift':>11}",
    ]
    for r in rows:
        drift = "-" if r.loss_drift is None else f"{100 * r.loss_drift:.2f} %"
        gain = "" if not r.rule else ms(r.measured_gain_s)
        lines.append(
            f"  {r.fix:<36} {ms(r.step_median_s):>10} {gain:>14} "
            f"{ms(r.estimated_gain_s) if r.rule else '':>10} {drift if r.rule else '':>11}"
        )
    return "\n".join(lines)


__all__ = ["VerifyRow", "format_rows", "verify"]
