"""Lightning integration: TorchspeedCallback runs torchspeed's step profiler during ``fit`` and
prints the doctor's report at its end. torchspeed's optimizers (returned by
``configure_optimizers``) and its DataLoader (returned by ``train_dataloader``) need no glue,
except ``Trainer(gradient_clip_val=...)`` under a mixed precision: Lightning refuses to clip for
an optimizer that unscales inside its step, and the callback lifts that refusal (see
TorchspeedCallback).

    trainer = lightning.Trainer(max_epochs=3, callbacks=[TorchspeedCallback()])
    trainer.fit(model)
    print(trainer.callbacks[0].report)   # also printed at the end of fit (rank 0)
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Optional

try:  # the unified package, or the standalone one
    from lightning.pytorch import Callback
    from lightning.pytorch.plugins.precision import Precision
    from lightning.pytorch.utilities import GradClipAlgorithmType
except ImportError:  # pragma: no cover (depends on what is installed)
    try:
        from pytorch_lightning import Callback
        from pytorch_lightning.plugins.precision import Precision
        from pytorch_lightning.utilities import GradClipAlgorithmType
    except ImportError as e:
        raise ImportError(
            "torchspeed.integrations.lightning needs Lightning: pip install lightning"
        ) from e

import torchspeed.profile as tsp
from torchspeed.data import DataLoader
from torchspeed.optim import FusedOptimizer

_NORM = GradClipAlgorithmType.NORM


class TorchspeedCallback(Callback):
    """Profiles every training step of ``fit`` (phases from torchspeed's parts and, with
    ``hooks=True``, from torch's hooks for plain torch code) and reports at the end.

    Args:
        hooks: cover plain torch code (module forwards, backward, optimizer steps) with torch's
            global hooks, as ``torchspeed doctor`` does.
        print_report: print the breakdown and the ranked advice when fit ends (rank 0 only).
        trace_path: also write a Chrome trace there.

    Gradient clipping: under ``precision="16-mixed"``/``"bf16-mixed"`` Lightning refuses
    ``gradient_clip_val`` for an optimizer that unscales inside its step (torchspeed's do, under
    a GradScaler). With the callback, ``gradient_clip_val`` and ``gradient_clip_algorithm``
    ("norm" or "value") work unchanged with torchspeed's optimizers and clip exactly as Lightning
    does for torch.optim's: with a GradScaler the grads are unscaled first (``scaler.unscale_``,
    the fused step then skips the unscale and still skips a step with inf/NaN grads), then
    clipped over all the optimizer's params by torch.nn.utils.clip_grad_norm_/clip_grad_value_.
    """

    def __init__(
        self, hooks: bool = True, print_report: bool = True, trace_path: Optional[str] = None
    ) -> None:
        super().__init__()
        self.hooks, self.print_report, self.trace_path = hooks, print_report, trace_path
        self.profiler: Optional[tsp.StepProfiler] = None
        self.report: str = ""
        self.summary = None
        self._stepped = False
        self._clipping_plugin = None  # the precision plugin whose clip_gradients we replaced
        self._loader_states: list = []  # the loaders' states from the checkpoint fit resumes

    def setup(self, trainer: Any, pl_module: Any, stage: str) -> None:
        self._allow_clipping(trainer)

    def on_fit_start(self, trainer: Any, pl_module: Any) -> None:
        self._stop()  # a profiler left by a fit that ended without any teardown hook
        self._stepped = False
        self.profiler = tsp.StepProfiler(hooks=self.hooks)
        self.profiler.start()

    def on_load_checkpoint(self, trainer: Any, pl_module: Any, checkpoint: dict) -> None:
        fit_loop = checkpoint.get("loops", {}).get("fit_loop", {})
        self._loader_states = list(fit_loop.get("state_dict", {}).get("combined_loader", []))

    def on_train_start(self, trainer: Any, pl_module: Any) -> None:
        # A checkpoint saved at the end of an epoch: Lightning does not restore the loaders
        # ("the last epoch completely finished, we are not actually restarting") and starts the
        # next epoch with a fresh loader, which would replay epoch 0's order. The saved state is
        # restored here, as the start of the next epoch. A loader Lightning restored (a mid-epoch
        # resume, or any resume under max_steps) already holds its saved state and is left alone.
        states, self._loader_states = self._loader_states, []
        loaders = _torchspeed_loaders(getattr(trainer, "train_dataloader", None))
        if not states or len(states) != len(loaders):
            return  # not a resume, or other stateful loaders too: Lightning's own handling
        for loader, state in zip(loaders, states):
            if loader.state_dict() == state:
                continue
            if state.get("batches_consumed") == len(loader):  # the whole epoch was consumed
                state = {**state, "epoch": state["epoch"] + 1, "batches_consumed": 0}
            loader.load_state_dict(state)

    def on_before_optimizer_step(self, trainer: Any, pl_module: Any, optimizer: Any) -> None:
        self._stepped = True

    def on_train_batch_end(
        self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        # A profiler step is an optimizer step: under accumulate_grad_batches the micro-batches
        # before it belong to the same step (their samples are counted together).
        if self.profiler is not None and self._stepped:
            self._stepped = False
            self.profiler.step()

    def on_fit_end(self, trainer: Any, pl_module: Any) -> None:
        prof = self._stop()
        if prof is None:
            return
        if prof.steps == 0:
            self.report = "torchspeed: no training step was profiled"
        else:
            self.summary = prof.summary()
            self.report = prof.report(self.summary)
            if self.trace_path:
                prof.export_chrome_trace(self.trace_path)
        if self.print_report and getattr(trainer, "is_global_zero", True):
            print(self.report, flush=True)

    # An exception in the fit (training_step, a callback, KeyboardInterrupt) skips on_fit_end:
    # the profiler and torch's process-wide hooks must go with it, or the next fit cannot start.
    def on_exception(self, trainer: Any, pl_module: Any, exception: BaseException) -> None:
        self._stop()
        self._restore_clipping()

    def teardown(self, trainer: Any, pl_module: Any, stage: str) -> None:
        self._stop()
        self._restore_clipping()

    def _allow_clipping(self, trainer: Any) -> None:
        """Replaces, on this trainer's precision plugin only, a clip_gradients that refuses
        torchspeed's optimizers (Lightning's MixedPrecision) by one that clips as Lightning
        does for torch.optim; every other optimizer goes to the plugin's own method."""
        plugin = getattr(trainer, "precision_plugin", None)
        if (
            plugin is None
            or "clip_gradients" in vars(plugin)  # already replaced (by us or someone else)
            or type(plugin).clip_gradients is Precision.clip_gradients  # nothing refused
        ):
            return
        own = plugin.clip_gradients

        def clip_gradients(optimizer, clip_val=0.0, gradient_clip_algorithm=_NORM):
            raw = getattr(optimizer, "_optimizer", optimizer)  # a LightningOptimizer's optimizer
            if not (isinstance(raw, FusedOptimizer) and clip_val > 0):
                return own(optimizer, clip_val, gradient_clip_algorithm)
            scaler = getattr(plugin, "scaler", None)
            if scaler is not None:
                # What Lightning's optimizer_step does for torch.optim before clipping; the
                # scaler's step then passes found_inf and no grad_scale to the fused step.
                scaler.unscale_(raw)
            return Precision.clip_gradients(plugin, raw, clip_val, gradient_clip_algorithm)

        plugin.clip_gradients = clip_gradients
        self._clipping_plugin = plugin

    def _restore_clipping(self) -> None:
        plugin, self._clipping_plugin = self._clipping_plugin, None
        if plugin is not None:
            vars(plugin).pop("clip_gradients", None)

    def _stop(self) -> Optional[tsp.StepProfiler]:
        """Stops the running profiler (if any) and returns it; safe to call from any hook."""
        prof, self.profiler = self.profiler, None
        if prof is not None:
            prof.stop()
        return prof


def _torchspeed_loaders(loaders: Any) -> list:
    """torchspeed's native DataLoaders in what train_dataloader holds (a loader, or a list,
    tuple or dict of them)."""
    if isinstance(loaders, Mapping):
        loaders = list(loaders.values())
    if isinstance(loaders, (list, tuple)):
        return [d for item in loaders for d in _torchspeed_loaders(item)]
    return [loaders] if isinstance(loaders, DataLoader) and loaders.native else []


__all__ = ["TorchspeedCallback"]
