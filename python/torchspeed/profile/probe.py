"""Measured facts for the doctor's estimates on a CPU: forward+backward of a copy of the run's
model at the run's own input shape, as it is and in each variant a fix would make (bf16 autocast,
channels_last), and torchspeed's fused optimizer step over tensors of the run's parameter shapes.
A fix's estimate is then the phase's median times the measured ratio, not a planning figure: a
CPU without native bf16 (no AVX512_BF16 / AMX) shows its bf16 autocast slower here, before anyone
applies it.

Run once per profiler, after the hooks are gone (so the probe's forwards are not the script's
steps), with torch's RNG state restored after (the script's random stream is its own). Small:
at most PROBE_MAX_S of forward+backward per call, models up to PROBE_MAX_PARAM_BYTES.

    p = probe_run(model, [(shape, dtype)], optimizers)   # {"bf16": 9.1, "channels_last": 0.6, ...}
"""

from __future__ import annotations

import contextlib
import copy
import statistics
import time
from typing import Any, Dict, List, Optional, Sequence, Tuple

import torch
from torch import nn

#: Skip the model probe when one forward+backward took longer than this (it would cost tens of
#: seconds: a variant is run up to 1 + REPEATS times).
PROBE_MAX_S = 4.0
#: A variant this many times slower than float32 in a run is settled: no more repeats of it (bf16
#: emulated on a CPU without native bf16 runs several times slower; its verdict is clear).
SETTLED_SLOWER = 2.0
#: Skip models (and optimizer probes) above this many bytes of parameters: the copy must be cheap.
PROBE_MAX_PARAM_BYTES = 256 << 20
#: The probes run on one intra-op thread and are timed in this thread's CPU time: a ratio of two
#: variants, unmoved by other processes taking the cores (wall time on a shared 2-core machine
#: varied 3x from one call to the next; thread CPU time does not count the time descheduled).
#: Timed repeats per variant, after one untimed warm-up each (oneDNN primitive creation), taken
#: interleaved and reduced by the median: as many as fit in PROBE_BUDGET_S, from REPEATS to
#: MAX_REPEATS. On the demo's model the minimum of 3 gave bf16 ratios of 0.64-0.76 from one call
#: to the next (the estimated gain, 1 - the ratio, moved 1.5x); the median of 9, 0.66-0.70.
REPEATS = 3
MAX_REPEATS = 9
PROBE_BUDGET_S = 2.0


def _first_float(out: Any) -> Optional[torch.Tensor]:
    stack = [out]
    while stack:
        x = stack.pop(0)
        if isinstance(x, torch.Tensor):
            if x.is_floating_point() and x.requires_grad:
                return x
        elif isinstance(x, dict):
            stack.extend(x.values())
        elif isinstance(x, (list, tuple)):
            stack.extend(x)
    return None


def _inputs(spec: Sequence[Tuple[tuple, torch.dtype]]) -> Optional[list]:
    xs = []
    for shape, dtype in spec:
        if not dtype.is_floating_point:
            return None  # token ids etc.: their valid range is unknown, no synthetic input
        xs.append(torch.randn(shape, dtype=dtype))
    return xs


def _fwd_bwd(model: nn.Module, xs: list, bf16: bool, channels_last: bool = False) -> float:
    """Seconds of one forward+backward on this thread. channels_last: the 4-D inputs are made
    channels_last inside the timed region, as the fix does to each batch (the loader gives NCHW)."""
    t0 = time.thread_time()
    if channels_last:
        xs = [x.contiguous(memory_format=torch.channels_last) if x.dim() == 4 else x for x in xs]
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
        out = _first_float(model(*xs))
    if out is None:
        raise ValueError("no floating-point output that requires grad")
    out.float().square().mean().backward()
    model.zero_grad(set_to_none=True)
    return time.thread_time() - t0


def _param_bytes(model: nn.Module) -> int:
    return sum(p.numel() * p.element_size() for p in model.parameters())


def probe_model(
    model: nn.Module, spec: Sequence[Tuple[tuple, torch.dtype]], variants: Sequence[str]
) -> Dict[str, float]:
    """{variant: forward+backward time / the fp32 time} for "bf16" and "channels_last" (only
    for a model with Conv2d layers), and "fp32_s": the float32 forward+backward's seconds on the
    calling thread, measured on deep copies; {} when the model cannot be probed
    (not on the CPU, too large, non-float inputs, a copy or forward that fails)."""
    params = list(model.parameters())
    if not params or any(p.device.type != "cpu" for p in params):
        return {}
    if _param_bytes(model) > PROBE_MAX_PARAM_BYTES:
        return {}
    has_conv = any(isinstance(m, nn.Conv2d) for m in model.modules())
    variants = [v for v in variants if v != "channels_last" or has_conv]
    try:
        base = copy.deepcopy(model).train()
        xs = _inputs(spec)
        if xs is None:
            return {}
        made = {"fp32": (base, xs, False)}
        for v in variants:
            if v == "bf16":
                made[v] = (base, xs, True)
            elif v == "channels_last":
                m = copy.deepcopy(model).train().to(memory_format=torch.channels_last)
                made[v] = (m, xs, False, True)
        first = _fwd_bwd(*made["fp32"])  # also the warm-up of float32
        if first > PROBE_MAX_S:
            return {}
        times: Dict[str, List[float]] = {k: [] for k in made}
        for k in made:
            if k != "fp32":
                _fwd_bwd(*made[k])  # warm-up: oneDNN primitives for this layout / dtype
        repeats = int(PROBE_BUDGET_S / max(first * len(made), 1e-9))
        for _ in range(max(REPEATS, min(MAX_REPEATS, repeats))):
            for k in made:  # float32 first in each round
                if (
                    k != "fp32"
                    and times[k]
                    and statistics.median(times[k])
                    > SETTLED_SLOWER * statistics.median(times["fp32"])
                ):
                    continue
                times[k].append(_fwd_bwd(*made[k]))
    except Exception:  # noqa: BLE001 (a probe that fails only leaves the estimate unmeasured)
        return {}
    ref = statistics.median(times["fp32"])
    out = {k: statistics.median(v) / ref for k, v in times.items() if k != "fp32" and ref > 0}
    out["fp32_s"] = ref
    return out


def probe_fused_optimizer(optimizer: Any) -> Optional[Tuple[float, Optional[float]]]:
    """(torchspeed's step, the script's own step) in seconds: one step of torchspeed's fused
    optimizer of the same algorithm and one of the script's optimizer class, each over zero tensors
    of the optimizer's parameter shapes with its hyperparameters, timed interleaved on the CPU on
    one thread. The rule applies their ratio to the phase the run measured (as the model probes'
    ratios): on one thread both steps are slower than in a run with more, and the absolute
    one-thread time under-estimated the gain. The second is None when a copy of the script's
    optimizer cannot be made here (say capturable=True off CUDA); None when there is no
    torchspeed counterpart or its probe fails."""
    from .. import optim as ts_optim

    name = type(optimizer).__name__
    cls = getattr(ts_optim, name, None) if name in ("SGD", "Adam", "AdamW") else None
    if cls is None:
        return None
    try:
        total = 0
        ours, theirs = [], []
        for g in optimizer.param_groups:
            ps = []
            for p in g["params"]:
                if p.device.type != "cpu" or not p.is_floating_point():
                    return None
                total += p.numel() * p.element_size()
                ps.append(torch.zeros_like(p, requires_grad=True))
            hyper = {k: v for k, v in g.items() if k != "params"}
            keep = {
                k: v
                for k, v in hyper.items()
                if k not in ("foreach", "fused", "capturable", "differentiable")
            }
            ours.append(dict(keep, params=ps))
            # The same tensors: both optimizers step them (their values do not matter to the
            # timing), so the probe holds one copy of the params and grads, not two.
            theirs.append(dict(hyper, params=list(ps)))
        if total > PROBE_MAX_PARAM_BYTES:
            return None
        for g in ours:
            for p in g["params"]:
                p.grad = torch.full_like(p, 1e-3)
        opts = [cls(ours)]
        opts[0].step()  # warm-up: state allocation
        try:
            own = type(optimizer)(theirs)
            own.step()
            opts.append(own)
        except Exception:  # noqa: BLE001 (then the fused step's own seconds stand in)
            pass
        best = [float("inf")] * len(opts)
        for _ in range(2 * REPEATS):  # the min of a few short steps of each, interleaved
            for k, o in enumerate(opts):
                t0 = time.thread_time()
                o.step()
                best[k] = min(best[k], time.thread_time() - t0)
        return best[0], (best[1] if len(best) > 1 else None)
    except Exception:  # noqa: BLE001
        return None


def probe_run(model: Optional[nn.Module], spec, optimizers: Sequence[Any]) -> Dict[str, float]:
    """The doctor's probes for one run: "bf16" and "channels_last" ratios of forward+backward
    (model probe), "nchw_convs" (the model's Conv2d layers with NCHW weights), "fused_optimizer_s" and
    "own_optimizer_s" (torchspeed's step and the first torch optimizer's own, over the same
    shapes), on one thread; torch's thread count and global RNG state are restored after."""
    out: Dict[str, float] = {}
    threads = torch.get_num_threads()
    with torch.random.fork_rng(devices=[]), contextlib.ExitStack() as stack:
        stack.callback(torch.set_num_threads, threads)
        torch.set_num_threads(1)
        if model is not None and spec:
            out.update(probe_model(model, spec, ("bf16", "channels_last")))
            # Kept as a number: the rules may read the facts after the model is gone.
            out["nchw_convs"] = float(
                sum(
                    1
                    for m in model.modules()
                    if isinstance(m, nn.Conv2d)
                    and m.weight.dim() == 4
                    and not m.weight.is_contiguous(memory_format=torch.channels_last)
                )
            )
        for opt in optimizers:
            if type(opt).__module__.startswith("torchspeed."):
                continue
            t = probe_fused_optimizer(opt)
            if t is not None:
                out["fused_optimizer_s"] = t[0]
                if t[1] is not None:
                    out["own_optimizer_s"] = t[1]
            break
    return out
