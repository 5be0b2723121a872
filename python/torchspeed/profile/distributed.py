"""Per-rank step summaries gathered on rank 0 (torch.distributed, any backend): the doctor then
names the slowest rank and the phase it loses time in."""

from __future__ import annotations

import dataclasses

from .summary import PhaseStat, StepSummary

# The fields sent per rank: a few hundred bytes pickled (the phases' statistics, no history).
_FIELDS = (
    "steps",
    "step_median_s",
    "step_p90_s",
    "step_mean_s",
    "total_s",
    "clock",
    "samples_per_s",
    "dropped_events",
)


def _to_wire(s: StepSummary) -> dict:
    d = {k: getattr(s, k) for k in _FIELDS}
    d["phases"] = {p: dataclasses.astuple(st) for p, st in s.phases.items()}
    return d


def _from_wire(d: dict, rank: int, world: int) -> StepSummary:
    phases = {p: PhaseStat(*v) for p, v in d["phases"].items()}
    return StepSummary(phases=phases, rank=rank, world_size=world, **{k: d[k] for k in _FIELDS})


def gather_summaries(s: StepSummary) -> StepSummary:
    """Fills ``rank``/``world_size`` and, on rank 0, ``ranks`` (every rank's summary, by rank).
    A collective: every rank calls it. Without an initialized process group it only returns s."""
    try:
        import torch.distributed as dist
    except ImportError:  # torch built without distributed
        return s
    if not (dist.is_available() and dist.is_initialized()):
        return s
    s.rank, s.world_size = dist.get_rank(), dist.get_world_size()
    gathered = [None] * s.world_size
    dist.all_gather_object(gathered, _to_wire(s))
    if s.rank == 0:
        s.ranks = [_from_wire(d, r, s.world_size) for r, d in enumerate(gathered)]
    return s


def wire_size(s: StepSummary) -> int:
    """Bytes one rank sends (pickled), for the aggregation-traffic check."""
    import pickle

    return len(pickle.dumps(_to_wire(s)))
