"""torchspeed.optim.LAMB: a fused optimizer torch.optim does not ship."""

from typing import Optional, Tuple, Union

import torch

from ._fused import FusedOptimizer, _arguments


class LAMB(FusedOptimizer):
    """LAMB (You et al., "Large Batch Optimization for Deep Learning", 2020) with bias
    correction: ``u = m_hat / (sqrt(v_hat) + eps) + wd * p``, per-tensor trust ratio
    ``||p|| / ||u||`` (1 when either is 0), ``p -= lr * trust * u``."""

    _state_keys = ("exp_avg", "exp_avg_sq")
    _hyperparameters = ("eps", "weight_decay")
    _has_betas = True

    def __init__(
        self,
        params,
        lr: Union[float, torch.Tensor] = 1e-3,
        betas: Tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-6,
        weight_decay: float = 0.0,
        *,
        maximize: bool = False,
        master_weights: Optional[bool] = None,
        max_grad_norm: Optional[float] = None,
        ema_decay: Optional[float] = None,
    ):
        super().__init__(params, _arguments(locals()))

    def _op_call(self, group, params, states, grads, masters, masks, emas, scalars):
        beta1, beta2 = group["betas"]
        args = (
            params,
            grads,
            [s["exp_avg"] for s in states],
            [s["exp_avg_sq"] for s in states],
            masters,
            [s["step"] for s in states],
            masks,
            emas,
        )
        kwargs = dict(
            beta1=float(beta1),
            beta2=float(beta2),
            eps=float(group["eps"]),
            weight_decay=float(group["weight_decay"]),
            maximize=group["maximize"],
            **scalars,
        )
        if self._phase is None:
            return torch.ops.torchspeed.lamb_step_, args, kwargs, self._no_after
        # One half of a sharded step (_sharded_step): phase 1 writes this call's norms, phase 2
        # reads its params' rows of the summed norms.
        phase, rows = self._phase
        if phase == 1:
            norms = torch.zeros(len(params), 2, dtype=torch.float64, device=params[0].device)
            self._phase_out.append((params, norms))
        else:
            norms = rows[[self._phase_index[id(p)] for p in params]].to(params[0].device)
        return (
            torch.ops.torchspeed.lamb_step_,
            args,
            dict(kwargs, norms=norms, phase=phase),
            (self._no_after),
        )

    _phase = None  # (1 or 2, the summed norms in phase 2) inside _sharded_step

    @torch.no_grad()
    def _sharded_step(self, phase: int, params=None, norms=None):
        """Half of a step over params that are pieces of larger ones (torchspeed.dist's ZeRO-1,
        where a param's trust ratio needs the norms of all of its pieces, on every rank).

        phase 1 counts the steps, updates the moments and returns (params, norms): the params that
        had a gradient and float64 [n, 2] rows of their ||p||^2 and ||u||^2. The caller sums the
        rows of each whole param's pieces, then calls phase 2 with those params and the summed rows
        (aligned with them): the update. Between the two, nothing may change the params, grads or
        state. step_stats count the pair as one step."""
        if phase == 2:
            if norms is None or len(params) != norms.shape[0]:
                raise ValueError(
                    f"torchspeed.optim.LAMB: phase 2 needs the rows of phase 1's params, got "
                    f"{len(params)} params and {None if norms is None else tuple(norms.shape)}"
                )
            self._phase_index = {id(p): i for i, p in enumerate(params)}
        stats = dict(self.step_stats)
        self._phase, self._phase_out = (phase, norms), []
        try:
            self.step()
        finally:
            self._phase = None
            self._phase_index = None
        if phase == 2:
            self.step_stats["steps"] = stats["steps"]
            self.step_stats["skipped"] = stats["skipped"]
            return None
        out, self._phase_out = self._phase_out, []
        if not out:
            return [], torch.zeros(0, 2, dtype=torch.float64)
        return [p for ps, _ in out for p in ps], torch.cat([n for _, n in out])
