"""Magnitude pruning with bit-packed masks applied in place (re-exports only: the verbs are in
api.py, the mask buffer in mask.py, the optimizers' masks in optimizer_masks.py, loading in
state_dict.py, gradual pruning in schedule.py, the 2:4 export in semi_structured.py).

    import torchspeed.prune as prune
    prune.l1_unstructured(model.fc1, "weight", amount=0.5)       # exactly half of fc1.weight zeroed
    prune.nm_sparse(model.fc2, "weight", n=2, m=4)               # 2:4 along the input dim
    prune.global_unstructured([(model.fc1, "weight"), (model.fc2, "weight")], amount=0.8)
    prune.apply(model, method="l1_unstructured", amount=0.5, optimizer=opt)   # every Linear/Conv
    prune.sparsity(model)                                        # {"fc1.weight": 0.5, ..., "total": ...}
    prune.remove(model)                                          # drop the masks, keep the zeros

Unlike torch.nn.utils.prune, the weight stays a plain Parameter holding zeros (no ``weight_orig``
and no forward pre-hook: forward costs nothing and deepcopy works), and the mask is a buffer
``<name>_mask_packed`` (uint8, 1 bit per element, 1/32 of an fp32 weight's bytes) saved in the
state_dict; ``load_state_dict(model, sd)`` loads it into a fresh model. With ``optimizer=`` a
torchspeed fused optimizer keeps the pruned elements at exactly zero inside its update pass (it
reads the packed bits); a torch.optim optimizer gets a step post-hook that re-applies the mask.

``amount``: an int is a count of elements (of channels for ln_structured), a float in [0, 1] a
fraction of them (rounded, as torch does). It is the sparsity of the whole tensor after the call
(torch's iterative PruningContainer instead prunes a fraction of what is left); elements pruned
earlier stay pruned. Masks are in the tensor's logical (row-major) order.
"""

from ._ops import apply_mask_, magnitude_mask, nm_mask, pack_mask, unpack_mask
from .api import apply, global_unstructured, l1_unstructured, ln_structured, nm_sparse, remove
from .mask import get_mask, is_pruned, prunable_parameters, sparsity
from .schedule import GradualPruner, cubic_sparsity
from .semi_structured import to_semi_structured
from .state_dict import load_state_dict

__all__ = [
    "GradualPruner",
    "apply",
    "apply_mask_",
    "cubic_sparsity",
    "get_mask",
    "global_unstructured",
    "is_pruned",
    "l1_unstructured",
    "ln_structured",
    "load_state_dict",
    "magnitude_mask",
    "nm_mask",
    "nm_sparse",
    "pack_mask",
    "prunable_parameters",
    "remove",
    "sparsity",
    "to_semi_structured",
    "unpack_mask",
]
