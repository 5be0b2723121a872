"""ZeroOptimizer: ZeRO-1 for AccumulatingDDP: each rank keeps optimizer state for its shard only.

With ``AccumulatingDDP(module, ..., zero=1)`` the reducer reduce-scatters each gradient bucket on
the synchronising micro-step (instead of all-reducing it): rank r receives the averaged gradient
of elements ``[r * s, (r + 1) * s)`` of every bucket (buckets are padded to a multiple of the
world size). This optimizer owns one flat "shard parameter" per bucket, steps it with any
optimizer class (torchspeed's fused AdamW/Adam/SGD/Lion or a ``torch.optim`` class) and
all-gathers the updated shards back into the module's params, bucket by bucket: the all-gather of
bucket b runs while bucket b + 1 is stepped.

    model = AccumulatingDDP(net, accumulation_steps=8, zero=1)
    opt = model.zero_optimizer(torchspeed.optim.AdamW, lr=1e-3, weight_decay=0.1)
    ... loss.backward(); if model.sync_now: model.clip_grad_norm_(1.0); opt.step(); opt.zero_grad()

A step with a non-finite gradient on any rank is skipped on every rank: the reducer checks the
shards at the end of the synchronising backward (one small all-reduce) and, when any rank found
inf/NaN, puts an inf into every rank's shard, so a GradScaler skips everywhere and its scale
stays identical; without a GradScaler this optimizer skips by itself.
"""

from __future__ import annotations

import copy
import math
from typing import Any

import torch
import torch.distributed as dist

_NAME = "torchspeed.dist.ZeroOptimizer"
_FORMAT = "torchspeed.dist.zero1/v1"


def _all_gather(out: torch.Tensor, shard: torch.Tensor, group) -> Any:
    gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
    return gather(out, shard, group=group, async_op=True)


def _memory_order_view(p: torch.Tensor) -> torch.Tensor | None:
    """A flat view of `p` in its memory order (how its grad lies in the bucket: channels_last
    included), or None for a layout with gaps or overlap (the bucket then holds it in logical
    order, as the reducer does)."""
    order = sorted(range(p.dim()), key=lambda d: -p.stride(d))
    q = p.permute(order)
    return q.view(-1) if q.is_contiguous() else None


class ZeroOptimizer(torch.optim.Optimizer):
    """An ``optimizer_class`` per bucket shard of a ``zero=1`` AccumulatingDDP (see the module
    docstring). ``param_groups`` are the inner optimizers' groups (one per bucket), so LR
    schedulers and GradScaler work on it as on a plain optimizer; ``state_dict()`` is this rank's
    shard plus the layout, and ``load_state_dict`` also takes the list of every rank's state
    dicts from a run on another world size (re-sharding on the CPU, nothing is gathered on one
    rank). :func:`consolidate_state_dict` turns that list into a plain ``optimizer_class``
    state_dict for the unwrapped model."""

    _step_supports_amp_scaling = True

    def __init__(self, ddp, optimizer_class: type, **defaults: Any) -> None:
        if not (
            isinstance(optimizer_class, type) and issubclass(optimizer_class, torch.optim.Optimizer)
        ):
            raise TypeError(
                f"{_NAME}: optimizer_class must be a torch.optim.Optimizer subclass, "
                f"got {optimizer_class!r}"
            )
        if getattr(ddp, "zero", 0) != 1:
            raise ValueError(f"{_NAME}: the AccumulatingDDP must be built with zero=1")
        if optimizer_class.__name__ == "LAMB":
            raise ValueError(
                f"{_NAME}: optimizer_class LAMB needs per-parameter norms, which a flat shard "
                "does not have; use AdamW, Adam, SGD or Lion"
            )
        impl = ddp._impl
        self._ddp = ddp
        self._group = ddp.process_group
        self._world = ddp.world_size
        self._rank = ddp.rank
        self._buckets = impl.buckets()
        self._grad_shards = impl.grad_shards()
        self._slot_params = ddp._slot_params
        slots = impl.param_slots()
        self._layout = []  # per bucket: [(slot index, offset, numel)]
        for _ in self._buckets:
            self._layout.append([])
        for i, (b, offset) in enumerate(slots):
            self._layout[b].append((i, offset, self._slot_params[i].numel()))
        self._shards = []
        for flat in self._buckets:
            s = flat.numel() // self._world
            shard = torch.zeros(s, dtype=flat.dtype, device=flat.device, requires_grad=True)
            self._shards.append(shard)
        self._gathered = [torch.empty_like(flat) for flat in self._buckets]
        self._inner = [optimizer_class([shard], **defaults) for shard in self._shards]
        super().__init__([{"params": [s]} for s in self._shards], self._inner[0].defaults)
        self.param_groups = [opt.param_groups[0] for opt in self._inner]
        self._optimizer_class = optimizer_class
        # The reducer's choice for this backend (Gloo: all-reduce; NCCL: the real collectives).
        self._collectives = impl.zero_collectives
        self._gather_by_all_reduce = self._collectives == "all_reduce"
        self._stats = {
            "zero_steps": 0,
            "zero_skipped_steps": 0,
            "bytes_all_gathered": 0,
            "last_bytes_all_gathered": 0,
        }
        for shard, grad in zip(self._shards, self._grad_shards):
            shard.grad = grad  # what GradScaler.unscale_ and clipping see

    # ---- the step ---------------------------------------------------------------------------------

    def _range(self, b: int) -> tuple[int, int]:
        s = self._shards[b].numel()
        return self._rank * s, (self._rank + 1) * s

    @torch.no_grad()
    def _load_shard(self, b: int) -> None:
        """The shard's values from the params (the params are the truth: a checkpoint loaded into
        the module, or any other change, is picked up)."""
        lo, hi = self._range(b)
        shard = self._shards[b]
        for i, offset, numel in self._layout[b]:
            a, z = max(lo, offset), min(hi, offset + numel)
            if a < z:
                p = self._slot_params[i].detach()
                flat = _memory_order_view(p)
                flat = p.reshape(-1) if flat is None else flat
                shard[a - lo : z - lo].copy_(flat[a - offset : z - offset])

    @torch.no_grad()
    def _store_params(self, b: int) -> None:
        full = self._gathered[b]
        for i, offset, numel in self._layout[b]:
            p = self._slot_params[i]
            # A param frozen after wrapping, or one no rank used in the window (find_unused:
            # .grad None on every rank), keeps its value as a single-process optimizer would
            # leave it (its state elements still see a zero gradient: see docs/DIST.md).
            if p.requires_grad and p.grad is not None:
                flat = _memory_order_view(p.detach())
                if flat is not None:
                    flat.copy_(full[offset : offset + numel])
                else:
                    p.copy_(full[offset : offset + numel].view(p.shape))

    @torch.no_grad()
    def step(self, closure=None):
        """Steps every shard and all-gathers the updated params (skipped on every rank when any
        rank's gradient was non-finite)."""
        if closure is not None:
            raise ValueError(f"{_NAME}: closure is not supported (the step is sharded)")
        found_inf = getattr(self, "found_inf", None)
        grad_scale = getattr(self, "grad_scale", None)
        skip = self._ddp._impl.last_nonfinite
        if found_inf is not None and float(found_inf) != 0:
            skip = True  # GradScaler: the reducer made every rank see the inf, so all skip
        self._stats["last_bytes_all_gathered"] = 0
        if skip:
            self._stats["zero_skipped_steps"] += 1
            return None
        for b, shard in enumerate(self._shards):
            shard.grad = self._grad_shards[b]
            if grad_scale is not None:
                shard.grad.mul_(1.0 / grad_scale.to(shard.grad.dtype))
        works = []
        for b, opt in enumerate(self._inner):
            self._load_shard(b)
            opt.step()
            shard = self._shards[b].detach()
            if self._gather_by_all_reduce:  # Gloo: an all-reduce of zeros but this rank's shard
                lo, hi = self._range(b)
                self._gathered[b].zero_()
                self._gathered[b][lo:hi].copy_(shard)
                works.append(dist.all_reduce(self._gathered[b], group=self._group, async_op=True))
            else:
                works.append(_all_gather(self._gathered[b], shard, self._group))
            nbytes = self._gathered[b].numel() * self._gathered[b].element_size()
            self._stats["bytes_all_gathered"] += nbytes
            self._stats["last_bytes_all_gathered"] += nbytes
        for b, work in enumerate(works):
            work.wait()
            self._store_params(b)
        self._stats["zero_steps"] += 1
        return None

    def zero_grad(self, set_to_none: bool = True) -> None:
        """The module's gradients (the buckets), as AccumulatingDDP.zero_grad. The shards keep
        their buffers: the next synchronising backward overwrites them."""
        self._ddp.zero_grad(set_to_none=set_to_none)

    def stats(self) -> dict:
        """Steps, skipped steps, bytes all-gathered (in total and in the last step), and the bytes
        of optimizer state and shard params this rank holds."""
        return dict(
            self._stats,
            zero_collectives=self._collectives,
            optimizer_state_bytes=self.state_bytes(),
            shard_param_bytes=sum(s.numel() * s.element_size() for s in self._shards),
        )

    def state_bytes(self) -> int:
        """Bytes of optimizer state tensors this rank holds (its shard's)."""
        total = 0
        for opt in self._inner:
            for st in opt.state.values():
                for v in st.values():
                    if isinstance(v, torch.Tensor):
                        total += v.numel() * v.element_size()
        return total

    # ---- checkpoints ------------------------------------------------------------------------------

    def _layout_dict(self) -> list[dict]:
        return [
            {
                "padded": flat.numel(),
                "dtype": str(flat.dtype),
                "params": [[i, offset, numel] for i, offset, numel in self._layout[b]],
            }
            for b, flat in enumerate(self._buckets)
        ]

    def state_dict(self) -> dict:
        """This rank's shard: every bucket's inner state_dict, and the layout to re-shard it."""
        return {
            "format": _FORMAT,
            "world_size": self._world,
            "rank": self._rank,
            "optimizer_class": self._optimizer_class.__name__,
            "layout": self._layout_dict(),
            "param_shapes": [list(p.shape) for p in self._slot_params],
            "shards": [opt.state_dict() for opt in self._inner],
        }

    def load_state_dict(self, state_dict) -> None:
        """This rank's own state_dict (same world size), or the list of every rank's state dicts
        from a run on any world size: the elementwise state is cut for this rank here."""
        dicts = state_dict if isinstance(state_dict, (list, tuple)) else [state_dict]
        _check_dicts(dicts, self._layout_dict(), [list(p.shape) for p in self._slot_params])
        own = len(dicts) == 1 and dicts[0]["world_size"] == self._world
        if not own and len(dicts) != dicts[0]["world_size"]:
            raise ValueError(
                f"{_NAME}: re-sharding a world size {dicts[0]['world_size']} checkpoint needs "
                f"every rank's state dict, got {len(dicts)}"
            )
        if own:
            if dicts[0]["rank"] != self._rank:
                raise ValueError(
                    f"{_NAME}: state_dict is rank {dicts[0]['rank']}'s shard, this is rank "
                    f"{self._rank}; pass the list of every rank's state dicts to re-shard"
                )
            # A copy: the optimizers update their state in place, the caller's dict stays as is.
            new = copy.deepcopy(dicts[0]["shards"])
        else:
            new = [
                _reshard_bucket(
                    [d["shards"][b] for d in dicts], _unpadded(layout), self._world, self._rank
                )
                for b, layout in enumerate(self._layout_dict())
            ]
        for opt, sd in zip(self._inner, new):  # validated above: each load is a plain one
            opt.load_state_dict(sd)


def _unpadded(layout_entry) -> int:
    return max((offset + numel for _, offset, numel in layout_entry["params"]), default=0)


def _check_dicts(dicts, layout, shapes) -> None:
    if not dicts:
        raise ValueError(f"{_NAME}: load_state_dict needs at least one state dict")
    world = None
    for k, d in enumerate(dicts):
        if not isinstance(d, dict):
            raise TypeError(
                f"{_NAME}: state_dict must be a dict or a list of every rank's dicts, got "
                f"{type(d).__name__} at index {k}"
            )
        if d.get("format") != _FORMAT:
            raise ValueError(
                f"{_NAME}: state_dict[{k}] is not a ZeroOptimizer state_dict (format {_FORMAT})"
            )
        world = d["world_size"] if world is None else world
        if d["world_size"] != world or (len(dicts) > 1 and d["rank"] != k):
            raise ValueError(
                f"{_NAME}: the list must hold every rank's state dict in rank order, got rank "
                f"{d['rank']} of {d['world_size']} at index {k}"
            )
        if [(x["dtype"], x["params"]) for x in d["layout"]] != [
            (x["dtype"], x["params"]) for x in layout
        ] or d["param_shapes"] != shapes:
            raise ValueError(
                f"{_NAME}: state_dict[{k}] was written for another model or bucket layout"
            )
    if len(dicts) != 1 and len(dicts) != world:
        raise ValueError(f"{_NAME}: got {len(dicts)} state dicts for world size {world}")


def _full_tensors(shard_dicts, unpadded):
    """Per state key: the full (unpadded) elementwise tensor, concatenated from every rank's
    shard on the CPU, or the scalar value (the same on every rank)."""
    states = [sd["state"].get(0, {}) for sd in shard_dicts]
    out = {}
    for key, v0 in states[0].items():
        if isinstance(v0, torch.Tensor) and v0.dim() == 1:
            out[key] = torch.cat([st[key].cpu() for st in states])[:unpadded]
        else:
            out[key] = v0.clone() if isinstance(v0, torch.Tensor) else copy.deepcopy(v0)
    return out


def _reshard_bucket(shard_dicts, unpadded, world, rank):
    """One bucket's inner state_dict for (world, rank), from every old rank's shard state."""
    full = _full_tensors(shard_dicts, unpadded)
    s = math.ceil(unpadded / world) if unpadded else 0
    state = {}
    for key, v in full.items():
        if isinstance(v, torch.Tensor) and v.dim() == 1:
            padded = torch.zeros(s * world, dtype=v.dtype)
            padded[: v.numel()] = v
            state[key] = padded[rank * s : (rank + 1) * s].clone()
        else:
            state[key] = v
    sd = copy.deepcopy({k: v for k, v in shard_dicts[0].items() if k != "state"})
    sd["state"] = {0: state} if state else {}
    return sd


def consolidate_state_dict(state_dicts) -> dict:
    """Every rank's ZeroOptimizer state dicts (a list in rank order) as one plain
    ``optimizer_class`` state_dict for the unwrapped model's trainable params (in
    ``module.parameters()`` order): what ``torch.optim.AdamW(model.parameters(), ...)`` loads in a
    single process. Runs on the CPU."""
    dicts = list(state_dicts)
    if not dicts:
        raise ValueError(f"{_NAME}: consolidate_state_dict needs every rank's state dict")
    _check_dicts(dicts, dicts[0]["layout"], dicts[0]["param_shapes"])
    if len(dicts) != dicts[0]["world_size"]:
        raise ValueError(
            f"{_NAME}: consolidate_state_dict needs all {dicts[0]['world_size']} ranks' state "
            f"dicts, got {len(dicts)}"
        )
    shapes = dicts[0]["param_shapes"]
    state, group = {}, None
    for b, layout in enumerate(dicts[0]["layout"]):
        shard_dicts = [d["shards"][b] for d in dicts]
        full = _full_tensors(shard_dicts, _unpadded(layout))
        if group is None:
            group = {k: v for k, v in shard_dicts[0]["param_groups"][0].items() if k != "params"}
        for i, offset, numel in layout["params"]:
            if full:
                state[i] = {
                    k: v[offset : offset + numel].reshape(shapes[i]).clone()
                    if isinstance(v, torch.Tensor) and v.dim() == 1
                    else (v.clone() if isinstance(v, torch.Tensor) else v)
                    for k, v in full.items()
                }
    group = dict(group or {})
    group["params"] = list(range(len(shapes)))
    return {"state": state, "param_groups": [group]}
