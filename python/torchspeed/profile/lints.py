"""The doctor's lints: findings read off the run's modules, optimizers, loaders and the hooks'
counters (conv bias before batch norm, channels_last, loader workers, batch size, ...), without a
time estimate.

    findings = lint(facts)
"""

from __future__ import annotations

import os
import warnings
from typing import Any, List, Optional, Tuple

import torch
import torch.fx
from torch import nn

from .facts import (
    _counter,
    _cuda,
    _list,
    _loaders,
    _models,
    _modules_of,
    _num,
    _optimizer_kind,
    _pct,
    _per_step,
)
from .rules import BATCH_MEMORY_FRACTION
from .summary import Finding, RunFacts


def _lint(rule: str, severity: str, title: str, fix: str, detail: str = "") -> Finding:
    return Finding(rule, severity, title, fix, detail, None, 0.0, "lint")


# ---- lints -----------------------------------------------------------------------------------
def _is_conv(m: Any) -> bool:
    return isinstance(m, nn.modules.conv._ConvNd) and getattr(m, "bias", None) is not None


def _is_bn(m: Any) -> bool:
    return isinstance(m, nn.modules.batchnorm._BatchNorm)


def _conv_bn_fx(model: nn.Module) -> Optional[List[Tuple[str, str]]]:
    """(conv, bn) module paths where the traced graph feeds a biased conv only into a BN; None
    when the model cannot be traced (data-dependent control flow, unsupported ops)."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            graph = torch.fx.symbolic_trace(model).graph
    except Exception:
        return None
    pairs = []
    for node in graph.nodes:
        if node.op != "call_module" or not node.args:
            continue
        src = node.args[0]
        if not isinstance(src, torch.fx.Node) or src.op != "call_module" or len(src.users) != 1:
            continue  # a conv output used elsewhere too (a residual) needs its bias
        try:
            bn, conv = model.get_submodule(node.target), model.get_submodule(src.target)
        except (AttributeError, TypeError):
            continue
        if _is_bn(bn) and _is_conv(conv):
            pairs.append((str(src.target), str(node.target)))
    return pairs


def _conv_bn_sequential(model: nn.Module) -> List[Tuple[str, str]]:
    """The same, from the order of children of nn.Sequential containers (the untraceable case)."""
    pairs = []
    for name, m in model.named_modules():
        if not isinstance(m, nn.Sequential):
            continue
        children = list(m.named_children())
        for (a, ma), (b, mb) in zip(children, children[1:]):
            if _is_conv(ma) and _is_bn(mb):
                prefix = f"{name}." if name else ""
                pairs.append((prefix + a, prefix + b))
    return pairs


def _lint_conv_bias(facts: Any) -> List[Finding]:
    found = []
    for model in _models(facts):
        pairs = _conv_bn_fx(model)
        how = "traced with torch.fx"
        if pairs is None:
            try:
                pairs, how = (
                    _conv_bn_sequential(model),
                    "from the nn.Sequential order: fx could not trace it",
                )
            except Exception:
                pairs = []
        found += [(type(model).__name__, c, b, how) for c, b in pairs]
    if not found:
        return []
    shown = "; ".join(f"{m}: {c} -> {b} ({how})" for m, c, b, how in found[:10])
    more = f"; and {len(found) - 10} more" if len(found) > 10 else ""
    return [
        _lint(
            "conv_bias_before_bn",
            "info",
            f"{len(found)} convolution(s) with bias=True feed straight into a BatchNorm",
            "nn.Conv2d(..., bias=False) before a BatchNorm: its mean subtraction cancels the bias "
            "(a wasted add, gradient and optimizer state)",
            shown + more,
        )
    ]


def _lint_counters(facts: Any) -> List[Finding]:
    out = []
    n = _counter(facts, "zero_grad_keep")
    if n:
        out.append(
            _lint(
                "zero_grad_keep",
                "info",
                f"zero_grad(set_to_none=False) calls: {_per_step(facts, n)}",
                "optimizer.zero_grad(set_to_none=True) (the default): frees the grads instead of "
                "writing zeros into them every step",
            )
        )
    if _cuda(facts):
        n = _counter(facts, "h2d_pageable")
        if n:
            out.append(
                _lint(
                    "h2d_pageable",
                    "warning",
                    f"host-to-device copies from pageable memory: {_per_step(facts, n)}",
                    "pin_memory=True in the DataLoader (or tensor.pin_memory()): pageable copies "
                    "are staged through a driver buffer and cannot overlap compute",
                )
            )
        n = _counter(facts, "h2d_blocking")
        if n:
            out.append(
                _lint(
                    "h2d_blocking",
                    "warning",
                    f"blocking host-to-device copies: {_per_step(facts, n)}",
                    ".to(device, non_blocking=True) from pinned memory: the host stops waiting "
                    "for each copy",
                )
            )
    n = _counter(facts, "eval_forward_with_grad")
    if n:
        out.append(
            _lint(
                "eval_without_no_grad",
                "warning",
                f"forwards of eval() modules with grad enabled: {_per_step(facts, n)}",
                "wrap evaluation in torch.inference_mode() (or torch.no_grad()): no autograd "
                "graph, no saved activations",
            )
        )
    n = _counter(facts, "clip_grad_norm")
    if n and not any(_optimizer_kind(o) == "torchspeed" for o in _list(facts, "optimizers")):
        out.append(
            _lint(
                "clip_into_optimizer",
                "info",
                f"torch.nn.utils.clip_grad_norm_ calls: {_per_step(facts, n)}",
                "torchspeed.optim.<SGD|Adam|AdamW|...>(params, ..., max_grad_norm=<max_norm>) "
                "folds the clip into the fused step: the norm is taken in the step's own pass "
                "over the gradients (after AMP unscaling) instead of a separate one",
                "One param group: the same clip as clip_grad_norm_ over its parameters; with "
                "several groups max_grad_norm clips each group's norm.",
            )
        )
    n = _counter(facts, "tensor_from_ndarray")
    if n:
        out.append(
            _lint(
                "tensor_from_ndarray",
                "info",
                f"torch.tensor(numpy array) copies: {_per_step(facts, n)}",
                "torch.from_numpy(array): shares the array's memory, torch.tensor copies it",
            )
        )
    return out


def _lint_channels_last(facts: Any) -> List[Finding]:
    if not _cuda(facts):
        return []
    convs = [(n, m) for n, m in _modules_of(facts, (nn.Conv2d,))]
    if not convs:
        return []
    nchw = []
    for name, m in convs:
        w = getattr(m, "weight", None)
        if isinstance(w, torch.Tensor) and w.dim() == 4:
            if not w.is_contiguous(memory_format=torch.channels_last):
                nchw.append(name or "(root)")
    inputs = _counter(facts, "conv_input_not_channels_last")
    if not nchw and not inputs:
        return []
    if inputs:
        title = f"Conv2d inputs not in channels_last: {_per_step(facts, inputs)}"
    else:
        title = f"{len(nchw)} of {len(convs)} Conv2d weights are NCHW, not channels_last"
    detail = (
        f"NCHW weights e.g. {', '.join(nchw[:3])}." if nchw else "The weights are channels_last."
    )
    return [
        _lint(
            "channels_last",
            "info",
            title,
            "model.to(memory_format=torch.channels_last) and inputs .to(memory_format="
            "torch.channels_last): the layout tensor-core convolutions run in without transposes",
            detail,
        )
    ]


def _lint_num_workers(facts: Any) -> List[Finding]:
    zero = [x for x in _loaders(facts) if x.torch_backed and x.num_workers == 0]
    if not zero:
        return []
    return [
        _lint(
            "num_workers_zero",
            "warning",
            f"{len(zero)} DataLoader(s) load batches in the training process (num_workers=0)",
            "torchspeed.data.DataLoader(..., num_workers=N) (or torch's num_workers=N): batches "
            f"are prepared while the model trains; N up to the free cores ({os.cpu_count()} here)",
            "; ".join(x.describe() for x in zero),
        )
    ]


def _lint_batch(facts: Any) -> List[Finding]:
    if not _cuda(facts):
        return []
    peak = _num(getattr(facts, "peak_memory_bytes", None))
    total = _num(getattr(facts, "total_memory_bytes", None))
    if peak <= 0 or total <= 0:
        return []
    frac = peak / total
    if frac >= BATCH_MEMORY_FRACTION:
        return []
    return [
        _lint(
            "batch_too_small",
            "info",
            f"peak memory is {_pct(frac)} of the GPU "
            f"({peak / 2**30:.1f} of {total / 2**30:.1f} GiB)",
            f"a larger batch_size (up to ~{max(int(0.8 / frac), 2)}x before 80 % of memory, less "
            "as weights and optimizer state do not grow; scale the learning rate with it): "
            "fewer, fuller kernels per sample",
        )
    ]


def lint(facts: RunFacts) -> List[Finding]:
    """Findings read off the run's objects and hook counters (kind "lint", no time estimate)."""
    if facts is None:
        return []
    out: List[Finding] = []
    for rule in (
        _lint_conv_bias,
        _lint_counters,
        _lint_channels_last,
        _lint_num_workers,
        _lint_batch,
    ):
        out += rule(facts)
    return out
