"""Typed wrappers of the optimizer area's ops (csrc/ops/optim.cpp): grad_stats and its AMP unscale."""

from typing import NamedTuple, Optional, Sequence

import torch


class GradStats(NamedTuple):
    """float32 tensors on the inputs' device."""

    total_norm: torch.Tensor  #: 0-dim: L2 norm over all elements of all tensors
    per_tensor_norms: torch.Tensor  #: [len(tensors)] when per_tensor=True, else [0]
    found_inf: torch.Tensor  #: 0-dim: 1.0 if any element was inf or NaN, else 0.0


def grad_stats(
    tensors: Sequence[torch.Tensor],
    inv_scale: Optional[torch.Tensor] = None,
    per_tensor: bool = False,
) -> GradStats:
    """Global L2 norm, optional per-tensor norms and a found-non-finite flag, in one pass.

    Args:
        tensors: dense float32/float64/bfloat16/float16 tensors on one device, any sizes. An
            empty list gives norm 0 and found_inf 0 (on CPU, or on inv_scale's device).
        inv_scale: optional one-element float32 tensor. When given, every tensor is multiplied by
            it in place (AMP unscale) in the same pass, the norms are of the unscaled values, and
            the non-finite check looks at the values before unscaling (as GradScaler does).
        per_tensor: also return each tensor's norm.

    On CUDA nothing synchronises with the host. Accumulation is in fp32 per lane and float64
    across chunks. On CPU the result is deterministic for a given input and thread count; on
    CUDA the per-block partial sums are added with float64 atomics, so the last bits of a norm
    may differ between runs (the non-finite flag never does).
    """
    tensors = list(tensors)
    if not tensors:
        # No tensor for the dispatcher to choose a kernel by: answer as
        # torch.nn.utils.clip_grad_norm_([]) does (norm 0, nothing non-finite).
        device = torch.device("cpu")
        if inv_scale is not None:
            if inv_scale.numel() != 1 or inv_scale.dtype != torch.float32:
                raise RuntimeError(
                    "torchspeed.grad_stats_unscale_: inv_scale must be a one-element float32 "
                    f"tensor, got {inv_scale.dtype} of shape {list(inv_scale.shape)}"
                )
            device = inv_scale.device
        zero = torch.zeros((), dtype=torch.float32, device=device)
        return GradStats(zero, torch.zeros(0, dtype=torch.float32, device=device), zero.clone())
    if inv_scale is None:
        out = torch.ops.torchspeed.grad_stats(tensors, per_tensor)
    else:
        out = torch.ops.torchspeed.grad_stats_unscale_(tensors, inv_scale, per_tensor)
    return GradStats(*out)


__all__ = ["GradStats", "grad_stats"]
