"""ZeroOptimizer: ZeRO-1 for AccumulatingDDP: each rank keeps optimizer state for its shard only.

With ``AccumulatingDDP(module, ..., zero=1)`` the reducer reduce-scatters each gradient bucket on
the synchronising micro-step (instead of all-reducing it): rank r receives the averaged gradient
of elements ``[r * s, (r + 1) * s)`` of every bucket (buckets are padded to a multiple of the
world size). The shard layout and the step's collectives are C++ (``torchspeed._C.dist.ZeroShards``,
include/torchspeed/dist/zero.h, shared with the C++ ``torchspeed::dist::ZeroOptimizer``): each
rank's shard of a bucket is cut into one "piece" per param it overlaps (a 1-D leaf tensor whose
``.grad`` is the matching slice of the reduced gradient). This optimizer steps the pieces with one
``optimizer_class`` per bucket (torchspeed's fused AdamW/Adam/SGD/Lion or a ``torch.optim`` class)
and the C++ side all-gathers the updated shards back into the module's params, bucket by bucket:
the all-gather of bucket b runs while bucket b + 1 is stepped.

    model = AccumulatingDDP(net, accumulation_steps=8, zero=1)
    opt = model.zero_optimizer(torchspeed.optim.AdamW, lr=1e-3, weight_decay=0.1)
    ... loss.backward(); if model.sync_now: model.clip_grad_norm_(1.0); opt.step(); opt.zero_grad()

One param per piece gives single-process semantics per param: a param whose ``.grad`` is None in a
step (frozen, or unused on every rank with ``find_unused_parameters=True``) gets no state and no
update, and its step count does not advance, as ``torch.optim`` leaves it.

A step with a non-finite gradient on any rank is skipped on every rank: the reducer checks the
shards at the end of the synchronising backward (one small all-reduce) and, when any rank found
inf/NaN, puts an inf into every rank's shard, so a GradScaler skips everywhere and its scale
stays identical; without a GradScaler this optimizer skips by itself.
"""

from __future__ import annotations

import copy
from typing import Any

import torch

from .._native import native_module

_NAME = "torchspeed.dist.ZeroOptimizer"
_FORMAT = "torchspeed.dist.zero1/v2"


class ZeroOptimizer(torch.optim.Optimizer):
    """An ``optimizer_class`` per bucket over this rank's pieces of a ``zero=1`` AccumulatingDDP
    (see the module docstring). ``param_groups`` are the inner optimizers' groups (one per
    bucket), so LR schedulers and GradScaler work on it as on a plain optimizer; ``state_dict()``
    is this rank's shard plus the layout, and ``load_state_dict`` also takes the list of every
    rank's state dicts from a run on another world size (re-sharding on the CPU, nothing is
    gathered on one rank). :func:`consolidate_state_dict` turns that list into a plain
    ``optimizer_class`` state_dict for the unwrapped model."""

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
        self._ddp = ddp
        self._world = ddp.world_size
        self._rank = ddp.rank
        self._core = native_module("dist", _NAME).ZeroShards(ddp._impl)
        self._buckets = ddp._impl.buckets()
        slots = ddp._impl.param_slots()
        self._shapes = [list(p.shape) for p in ddp._slot_params]
        self._bucket_params = [[] for _ in self._buckets]  # per bucket: [(slot, offset, numel)]
        for i, (b, offset) in enumerate(slots):
            self._bucket_params[b].append([i, offset, self._shapes_numel(i)])
        self._pieces = [self._core.layout(b) for b in range(len(self._buckets))]
        # A bucket with no element on this rank (a tiny bucket, many ranks) steps a placeholder
        # that has no gradient when stepped: every rank has one optimizer per bucket. On a rank
        # that owns no element at all, the first placeholder's gradient between backward and
        # step is the C++ side's non-finite flag, so a GradScaler finds the inf every other rank
        # finds and keeps the same scale (step() hides it from the optimizer).
        flag = self._core.nonfinite_flag  # only where every bucket's pieces are empty
        self._flag_param = None
        if flag is not None:
            self._flag_param = torch.zeros(1, dtype=flag.dtype, requires_grad=True)
            self._flag_param.grad = flag
        self._inner = [
            optimizer_class(
                list(self._core.pieces(b))
                or [
                    self._flag_param
                    if b == 0 and flag is not None
                    else torch.zeros(0, requires_grad=True)
                ],
                **defaults,
            )
            for b in range(len(self._buckets))
        ]
        super().__init__(
            [{"params": list(o.param_groups[0]["params"])} for o in self._inner],
            self._inner[0].defaults,
        )
        self.param_groups = [opt.param_groups[0] for opt in self._inner]
        self._optimizer_class = optimizer_class
        # LAMB's trust ratio needs each whole param's norms: its step runs in two phases around
        # one small all-reduce of every piece's ||p||^2 and ||u||^2, summed per param.
        from ..optim import LAMB

        self._lamb = issubclass(optimizer_class, LAMB)
        # Per bucket: the slot of each inner param (the inner optimizer's param i is piece i).
        self._slot_of = [
            {id(t): piece[0] for t, piece in zip(o.param_groups[0]["params"], self._pieces[b])}
            for b, o in enumerate(self._inner)
        ]
        # The reducer's choice for this backend (Gloo: all-reduce; NCCL: the real collectives).
        self._collectives = self._core.collectives

    def _shapes_numel(self, i: int) -> int:
        n = 1
        for d in self._shapes[i]:
            n *= d
        return n

    # ---- the step ---------------------------------------------------------------------------------

    @torch.no_grad()
    def step(self, closure=None):
        """Steps every shard and all-gathers the updated params (skipped on every rank when any
        rank's gradient was non-finite)."""
        if closure is not None:
            raise ValueError(f"{_NAME}: closure is not supported (the step is sharded)")
        found_inf = getattr(self, "found_inf", None)  # GradScaler's, with amp scaling support
        grad_scale = getattr(self, "grad_scale", None)
        if not self._core.begin_step(grad_scale, found_inf):
            return None
        flag = self._flag_param.grad if self._flag_param is not None else None
        if flag is not None:
            self._flag_param.grad = None  # the flag is no gradient to step
        try:
            if self._lamb:
                self._lamb_step()
            else:
                for b, opt in enumerate(self._inner):
                    opt.step()
                    self._core.launch_gather(b)
            self._core.finish_step()
        finally:
            if flag is not None:
                self._flag_param.grad = flag
        return None

    def _lamb_step(self) -> None:
        """LAMB over pieces: phase 1 on every bucket (moments, each piece's squared norms), the
        norms summed per param over its pieces on every rank (one all-reduce of [params, 2]
        float64, on every rank, also where a rank owns nothing), then phase 2 (the update with the
        whole param's trust ratio) and the all-gather, bucket by bucket."""
        device = self._buckets[0].device
        total = torch.zeros(len(self._shapes), 2, dtype=torch.float64, device=device)
        phase1 = []
        for b, opt in enumerate(self._inner):
            params, norms = opt._sharded_step(1)
            slots = torch.tensor([self._slot_of[b][id(p)] for p in params], dtype=torch.long)
            total.index_add_(0, slots.to(device), norms.to(device))
            phase1.append((params, slots))
        if self._world > 1:
            torch.distributed.all_reduce(total, group=self._ddp.process_group)
        for b, (opt, (params, slots)) in enumerate(zip(self._inner, phase1)):
            if params:
                opt._sharded_step(2, params, total[slots.to(device)])
            self._core.launch_gather(b)

    def zero_grad(self, set_to_none: bool = True) -> None:
        """The module's gradients (the buckets), as AccumulatingDDP.zero_grad. The shards keep
        their buffers: the next synchronising backward overwrites them."""
        self._ddp.zero_grad(set_to_none=set_to_none)

    def stats(self) -> dict:
        """Steps, skipped steps, bytes all-gathered (in total and in the last step), and the bytes
        of optimizer state and shard params this rank holds."""
        return dict(
            self._core.stats(),
            zero_collectives=self._collectives,
            zero_gather=self._core.gather_method,
            optimizer_state_bytes=self.state_bytes(),
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
        """Per bucket: its padded size and dtype, where each param lies in it (the same on every
        rank) and this rank's pieces as [slot, offset into the param, numel] (the inner
        optimizer's param i is piece i)."""
        return [
            {
                "padded": flat.numel(),
                "dtype": str(flat.dtype),
                "params": self._bucket_params[b],
                "pieces": [[slot, p_off, n] for slot, _, p_off, n in self._pieces[b]],
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
            "param_shapes": self._shapes,
            "shards": [opt.state_dict() for opt in self._inner],
        }

    def load_state_dict(self, state_dict) -> None:
        """This rank's own state_dict (same world size), or the list of every rank's state dicts
        from a run on any world size: each param's state is cut for this rank's pieces here.

        Its own state_dict loads as stored (a low-bit optimizer's int8 codes and absmaxes, or
        bf16 moments: the run continues bit for bit). Re-sharding is per element: int8 moments
        (quantized in blocks of each old piece) are decoded to float32 first, then each new
        piece's optimizer quantizes its cut in its own blocks, as its load_state_dict converts
        any float32 state; bf16 and float32 moments are cut as they are. A state any bucket's
        optimizer refuses loads nothing (every bucket keeps its state)."""
        dicts = state_dict if isinstance(state_dict, (list, tuple)) else [state_dict]
        layout = self._layout_dict()
        _check_dicts(dicts, layout, self._shapes)
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
            full = _param_states(dicts)
            new = []
            for b, entry in enumerate(layout):
                state = {}
                for k, (slot, p_off, n) in enumerate(entry["pieces"]):
                    if slot in full:
                        state[k] = {
                            key: v[p_off : p_off + n].clone() if _elementwise(v) else _copy(v)
                            for key, v in full[slot].items()
                        }
                group = _group_of(dicts, b)
                group["params"] = list(range(max(1, len(entry["pieces"]))))
                new.append({"state": state, "param_groups": [group]})
        # Each optimizer checks its part as it loads it (a low-bit state's codes and absmaxes, its
        # options): one that refuses puts every bucket's old state back.
        backup = [copy.deepcopy(opt.state_dict()) for opt in self._inner]
        for b, (opt, sd) in enumerate(zip(self._inner, new)):
            try:
                opt.load_state_dict(sd)
            except (ValueError, TypeError, RuntimeError, KeyError) as e:
                for old, sd_old in zip(self._inner[: b + 1], backup):
                    old.load_state_dict(sd_old)
                raise ValueError(
                    f"{_NAME}.load_state_dict: every bucket's optimizer must accept its state and "
                    f"options (an optimizer of the kind that wrote them), got a refusal from "
                    f"bucket {b}: {e}; nothing was loaded"
                ) from e


def _elementwise(v) -> bool:
    # Pieces are 1-D, so their elementwise state is too; a step count is 0-dim.
    return isinstance(v, torch.Tensor) and v.dim() == 1


def _copy(v):
    return v.clone() if isinstance(v, torch.Tensor) else copy.deepcopy(v)


def _group_of(dicts, b) -> dict:
    """Bucket b's hyperparameters (the same on every rank), without its params. A C++ state dict
    has no group for a bucket it owns nothing of: the first rank that has one gives it."""
    group = next(g[0] for g in (d["shards"][b]["param_groups"] for d in dicts) if g)
    return {k: copy.deepcopy(v) for k, v in group.items() if k != "params"}


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


def _param_states(dicts) -> dict:
    """Per param (slot) with state: {key: its full flat elementwise tensor (the pieces of every
    rank concatenated on the CPU), or the scalar value (a step count: the same in every piece)}.
    A param that never had a gradient has no pieces with state, and no entry, as in torch.optim."""
    parts: dict[int, list] = {}
    for i, d in enumerate(dicts):
        for b, entry in enumerate(d["layout"]):
            st = d["shards"][b]["state"]
            for k, (slot, p_off, n) in enumerate(entry["pieces"]):
                if k in st:
                    where = f"state_dicts[{i}] bucket {b} piece {k}"
                    piece = _per_element(st[k], n, _group_of([d], b), where)
                    parts.setdefault(slot, []).append((p_off, n, piece))
    numel = {}
    for entry in dicts[0]["layout"]:
        for slot, _, n in entry["params"]:
            numel[slot] = n
    full = {}
    for slot, pieces in parts.items():
        pieces.sort(key=lambda x: x[0])
        if sum(n for _, n, _ in pieces) != numel[slot]:
            raise ValueError(
                f"{_NAME}: param {slot} has optimizer state for only part of its elements "
                "(the state dicts are not of one step)"
            )
        # Every piece's keys: a low-bit SGD keeps a step count beside its int8 / bf16 buffers
        # only, so a param cut into an int8 piece and a small float32 one has it in one of them.
        first = {}
        for _, _, st in pieces:
            for key, v in st.items():
                first.setdefault(key, v)
        full[slot] = {}
        for key, v0 in first.items():
            if not _elementwise(v0):
                full[slot][key] = _copy(v0)
                continue
            if not all(_elementwise(st.get(key)) for _, _, st in pieces):
                raise ValueError(
                    f"{_NAME}.load_state_dict: param {slot}'s state '{key}' must be per element "
                    "in every piece of it, got a piece without it"
                )
            full[slot][key] = torch.cat([st[key].cpu() for _, _, st in pieces])
    return full


def _per_element(state: dict, n: int, group: dict, where: str) -> dict:
    """A piece's state with every value per element: the int8 moments of a low-bit optimizer
    (torchspeed.optim's state_dtype="int8": codes plus ``<key>_absmax``, one absmax per block of
    the piece's ``state_block`` elements) decoded to float32 by the step's own decoder
    (lowbit_decode), since blocks cut at the piece's ends cannot be joined or cut per element.
    Everything else (float32 or bfloat16 moments, a step count) is per element already."""
    from ..optim import _lowbit  # the optimizers' state format (its decoder is an optim op)

    codes = [key for key in state if _lowbit.absmax_key(key) in state]
    if not codes:
        return state
    block = group.get("state_block", _lowbit.DEFAULT_STATE_BLOCK)
    if isinstance(block, bool) or not isinstance(block, int) or block < 1:
        raise ValueError(
            f"{_NAME}.load_state_dict: {where}'s group state_block must be the int block of its "
            f"int8 state, got {block!r}"
        )
    out = {k: v for k, v in state.items() if k not in codes}
    for key in codes:
        c, a = state[key], state[_lowbit.absmax_key(key)]
        blocks = -(-n // block)
        if not (
            isinstance(c, torch.Tensor)
            and c.dtype in (torch.int8, torch.uint8)
            and c.numel() == n
            and isinstance(a, torch.Tensor)
            and a.dtype == torch.float32
            and a.numel() == blocks
            and bool(torch.isfinite(a).all())
            and not bool((a < 0).any())
        ):
            got = (
                f"{c.dtype} with {c.numel()} codes" if isinstance(c, torch.Tensor) else repr(c),
                f"{a.dtype} with {a.numel()} absmaxes" if isinstance(a, torch.Tensor) else repr(a),
            )
            raise ValueError(
                f"{_NAME}.load_state_dict: {where}'s '{key}' must be {n} int8 / uint8 codes with "
                f"'{_lowbit.absmax_key(key)}' {blocks} finite float32 absmaxes >= 0 (state_block "
                f"{block}), got {got[0]} and {got[1]}"
            )
        del out[_lowbit.absmax_key(key)]
        out[key] = _lowbit.dequantize(c.cpu(), a.cpu(), block)
    return out


def consolidate_state_dict(state_dicts) -> dict:
    """Every rank's ZeroOptimizer state dicts (a list in rank order) as one plain
    ``optimizer_class`` state_dict for the unwrapped model's trainable params (in
    ``module.parameters()`` order): what ``torch.optim.AdamW(model.parameters(), ...)`` loads in a
    single process (a param that never had a gradient has no state, as there). Runs on the CPU.

    int8 moments of torchspeed's low-bit optimizers (state_dtype="int8") come out decoded to
    float32 (each piece with its own blocks: what each shard optimizer's torch_state_dict()
    gives), bf16 moments as they are; the group keeps its state_dtype options. torch.optim loads
    it, and a torchspeed optimizer of any state_dtype converts it to its own on load."""
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
    state = {
        slot: {k: v.reshape(shapes[slot]) if _elementwise(v) else v for k, v in st.items()}
        for slot, st in sorted(_param_states(dicts).items())
    }
    group = _group_of(dicts, 0) if dicts[0]["layout"] else {}
    group["params"] = list(range(len(shapes)))
    return {"state": state, "param_groups": [group]}
