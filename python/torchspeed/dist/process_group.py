"""The process group AccumulatingDDP runs on: a c10d ProcessGroup as given, or one wrapped around a
bare Gloo/NCCL backend object."""

from __future__ import annotations

import torch
import torch.distributed as dist


def as_process_group(group, name: str):
    """A ProcessGroup as given, or one wrapping a bare backend (dist.ProcessGroupGloo(store, r, n)
    is a Backend, not a ProcessGroup): the same wrapping torch's init_process_group does."""
    if isinstance(group, dist.ProcessGroup):
        return group
    from torch._C._distributed_c10d import Backend as C10dBackend

    if isinstance(group, C10dBackend):
        pg = dist.ProcessGroup(dist.HashStore(), group.rank(), group.size())
        kind = {
            "gloo": dist.ProcessGroup.BackendType.GLOO,
            "nccl": dist.ProcessGroup.BackendType.NCCL,
        }.get(group.name().lower())
        if kind is None:
            raise TypeError(f"{name}: process_group backend {group.name()!r} is not gloo or nccl")
        pg._set_default_backend(kind)
        device = torch.device("cuda" if kind == dist.ProcessGroup.BackendType.NCCL else "cpu")
        pg._register_backend(device, kind, group)
        return pg
    raise TypeError(
        f"{name}: process_group must be a torch.distributed ProcessGroup (dist.new_group(), "
        f"the default group) or a Backend, got {type(group).__name__}"
    )
