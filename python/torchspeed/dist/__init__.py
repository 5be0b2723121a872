"""Data-parallel training with gradient accumulation over torch.distributed (Gloo, NCCL).

    torch.distributed.init_process_group("gloo")   # torchrun --nproc-per-node 2 train.py
    model = torchspeed.dist.AccumulatingDDP(model, accumulation_steps=8)
    for x, y in loader:
        loss = loss_fn(model(x), y) / model.accumulation_steps
        loss.backward()                   # all-reduces on every 8th micro-step only
        if model.sync_now:
            opt.step()
            opt.zero_grad()

See docs/DIST.md for the launch commands (one machine, several), uneven inputs (join), loss
normalisation over variable-length batches, compression and the stats.
"""

from .ddp import AccumulatingDDP
from .errors import RanksOutOfData
from .zero import ZeroOptimizer, consolidate_state_dict

__all__ = ["AccumulatingDDP", "RanksOutOfData", "ZeroOptimizer", "consolidate_state_dict"]
