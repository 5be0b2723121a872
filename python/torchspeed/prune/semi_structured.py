"""Export of 2:4-pruned Linear weights to torch's semi-structured sparse format (CUTLASS or
cuSPARSELt through ``torch.sparse.to_sparse_semi_structured``), where torch supports it: CUDA,
compute capability 8.0+, float16/bfloat16 weights, shapes within torch's limits. Anything else is
left dense, with the reason in the returned report."""

from __future__ import annotations

from typing import Dict

import torch
from torch import nn


def _is_2_4(w: torch.Tensor) -> bool:
    """Every 4 consecutive elements along the input dim hold at most 2 nonzeros."""
    if w.dim() != 2 or w.shape[1] % 4:
        return False
    return bool(((w.detach() != 0).reshape(w.shape[0], -1, 4).sum(-1) <= 2).all())


def why_not_semi_structured(w: torch.Tensor) -> str:
    """ "" when ``w`` (a Linear weight) can be converted, else the reason."""
    if not hasattr(torch.sparse, "to_sparse_semi_structured"):
        return f"torch {torch.__version__} has no torch.sparse.to_sparse_semi_structured"
    if w.device.type != "cuda":
        return f"semi-structured sparsity runs on CUDA only, the weight is on {w.device}"
    major, _ = torch.cuda.get_device_capability(w.device)
    if major < 8:
        return f"needs compute capability 8.0+ (sm80), got {torch.cuda.get_device_capability(w.device)}"
    if w.dtype not in (torch.float16, torch.bfloat16):
        return f"needs a float16 or bfloat16 weight, got {w.dtype}"
    if not _is_2_4(w):
        return "the weight is not 2:4 sparse along its input dim (prune it with nm_sparse first)"
    return ""


def to_semi_structured(module: nn.Module) -> Dict[str, str]:
    """Replace the weight of every 2:4-sparse Linear in ``module`` by its semi-structured sparse
    form (an inference-only Parameter). Returns {qualified name: "converted" or the reason it
    was left dense}; nothing is changed for a module that cannot be converted."""
    if not isinstance(module, nn.Module):
        raise TypeError(
            "torchspeed.prune.to_semi_structured: module must be an nn.Module, got "
            f"{type(module).__name__}"
        )
    report: Dict[str, str] = {}
    for qual, mod in module.named_modules():
        if not isinstance(mod, nn.Linear):
            continue
        w = mod.weight
        reason = why_not_semi_structured(w)
        if not reason:
            try:
                sparse = torch.sparse.to_sparse_semi_structured(w.detach())
            except (RuntimeError, ValueError) as e:  # shape limits of the chosen backend
                reason = f"torch refused: {e}".splitlines()[0]
            else:
                mod.weight = nn.Parameter(sparse, requires_grad=False)
                # The mask buffer no longer matches a dense weight: drop it.
                for buf in [b for b in mod._buffers if b.startswith("weight_mask")]:
                    del mod._buffers[buf]
                reason = "converted"
        report[qual or "<root>"] = reason
    return report
