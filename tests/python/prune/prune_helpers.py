"""Shared by the prune tests: float64 / stable-sort references for the mask ops and the small
models, state snapshots and optimizers the tests prune."""

from __future__ import annotations

import torch
from torch import nn

import torchspeed

DTYPES = [torch.float32, torch.float64, torch.bfloat16, torch.float16]


def nm_reference(w: torch.Tensor, n: int, m: int) -> torch.Tensor:
    """Keep the n largest |w| of each group of m along the last dim; ties: lower index first
    (a stable descending sort keeps the original order among equals)."""
    g = w.detach().float().abs().reshape(-1, m)
    order = torch.sort(g, dim=1, descending=True, stable=True).indices
    keep = torch.zeros_like(g, dtype=torch.bool)
    keep.scatter_(1, order[:, :n], True)
    return keep.reshape(w.shape)


def magnitude_reference(w: torch.Tensor, amount: int) -> torch.Tensor:
    """Prune the `amount` smallest |w|; ties: the higher index first (stable ascending sort of
    (|w|, -index))."""
    flat = w.detach().double().abs().reshape(-1)
    idx = torch.arange(flat.numel(), dtype=torch.float64)
    # Sort by |w| ascending, then by index descending: lexsort via two stable sorts.
    order = torch.sort(-idx, stable=True).indices
    order = order[torch.sort(flat[order], stable=True).indices]
    keep = torch.ones(flat.numel(), dtype=torch.bool)
    keep[order[:amount]] = False
    return keep.reshape(w.shape)


def _mlp(seed=0):
    torch.manual_seed(seed)
    return nn.Sequential(
        nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 16), nn.ReLU(), nn.Linear(16, 4)
    )


def _state(model: nn.Module):
    return {k: v.clone() for k, v in model.state_dict().items()}


def _assert_unchanged(model: nn.Module, before) -> None:
    after = model.state_dict()
    assert after.keys() == before.keys()
    for k, v in before.items():
        assert torch.equal(after[k], v), k


def _tied(seed=0):
    torch.manual_seed(seed)
    a, b = nn.Linear(8, 8, bias=False), nn.Linear(8, 8, bias=False)
    b.weight = a.weight
    return nn.Sequential(a, nn.Tanh(), b), a, b


def _make_opt(kind, params, lr=0.1):
    if kind == "fused":
        return torchspeed.optim.SGD(params, lr=lr)
    return torch.optim.SGD(params, lr=lr)


def _train_step(model, opt):
    opt.zero_grad()
    model(torch.randn(4, 8)).square().sum().backward()
    opt.step()
