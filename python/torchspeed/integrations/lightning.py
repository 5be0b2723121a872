"""Lightning integration: TorchspeedCallback runs torchspeed's step profiler during ``fit`` and
prints the doctor's report at its end. torchspeed's optimizers (returned by
``configure_optimizers``) and its DataLoader (returned by ``train_dataloader``) need no glue.

    trainer = lightning.Trainer(max_epochs=3, callbacks=[TorchspeedCallback()])
    trainer.fit(model)
    print(trainer.callbacks[0].report)   # also printed at the end of fit (rank 0)
"""

from __future__ import annotations

from typing import Any, Optional

try:  # the unified package, or the standalone one
    from lightning.pytorch import Callback
except ImportError:  # pragma: no cover (depends on what is installed)
    try:
        from pytorch_lightning import Callback
    except ImportError as e:
        raise ImportError(
            "torchspeed.integrations.lightning needs Lightning: pip install lightning"
        ) from e

import torchspeed.profile as tsp


class TorchspeedCallback(Callback):
    """Profiles every training step of ``fit`` (phases from torchspeed's parts and, with
    ``hooks=True``, from torch's hooks for plain torch code) and reports at the end.

    With ``gradient_clip_val`` and a mixed precision, the callback clips for Lightning when the
    optimizer is torchspeed's (Lightning refuses to clip for optimizers that unscale inside
    their step): the Trainer's arguments work unchanged.

    Args:
        hooks: cover plain torch code (module forwards, backward, optimizer steps) with torch's
            global hooks, as ``torchspeed doctor`` does.
        print_report: print the breakdown and the ranked advice when fit ends (rank 0 only).
        trace_path: also write a Chrome trace there.
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
        self._hidden_clip = None
        self._saved_max_norm: dict = {}

    def on_fit_start(self, trainer: Any, pl_module: Any) -> None:
        self._stop()  # a profiler left by a fit that ended without any teardown hook
        self._stepped = False
        self.profiler = tsp.StepProfiler(hooks=self.hooks)
        self.profiler.start()

    def on_before_optimizer_step(self, trainer: Any, pl_module: Any, optimizer: Any) -> None:
        self._stepped = True
        self._clip_for_lightning(trainer, optimizer)

    # ---- gradient_clip_val with torchspeed's optimizers under mixed precision ----------------
    # Lightning's MixedPrecision plugin refuses to clip for an optimizer that unscales inside its
    # step (torchspeed's fused optimizers, torch's fused=True) whatever the precision. The
    # callback clips instead, with the Trainer's own gradient_clip_val and algorithm, right
    # before Lightning would, and hides the value from Lightning for that one call: without a
    # GradScaler (bf16-mixed) with torch's clip_grad_norm_/clip_grad_value_ on the optimizer's
    # parameters, as Lightning does; with one (16-mixed), the norm through the optimizer's own
    # max_grad_norm (applied after its internal unscaling) and the value scaled by the current
    # loss scale.
    def _clip_for_lightning(self, trainer: Any, optimizer: Any) -> None:
        clip_val = getattr(trainer, "gradient_clip_val", None)
        if not clip_val or clip_val <= 0:
            return
        opt = getattr(optimizer, "optimizer", optimizer)  # LightningOptimizer wraps it
        plugin = getattr(trainer, "precision_plugin", None)
        if not getattr(opt, "_step_supports_amp_scaling", False) or not hasattr(plugin, "scaler"):
            return  # Lightning clips this one itself
        import torch

        algorithm = str(getattr(trainer, "gradient_clip_algorithm", "norm") or "norm").lower()
        algorithm = algorithm.split(".")[-1]
        params = [p for g in opt.param_groups for p in g["params"] if p.grad is not None]
        scaler = plugin.scaler
        if algorithm == "value":
            scale = float(scaler.get_scale()) if scaler is not None else 1.0
            torch.nn.utils.clip_grad_value_(params, clip_val * scale)
        elif scaler is None:
            torch.nn.utils.clip_grad_norm_(params, clip_val)
        else:
            if len(opt.param_groups) > 1:
                raise ValueError(
                    "torchspeed.integrations.lightning: gradient_clip_val with 16-mixed and "
                    "torchspeed's optimizer clips each param group's norm (max_grad_norm); "
                    f"this optimizer has {len(opt.param_groups)} groups: use one group, or "
                    "bf16-mixed"
                )
            for g in opt.param_groups:
                self._saved_max_norm.setdefault(id(g), (g, g.get("max_grad_norm")))
                g["max_grad_norm"] = float(clip_val)
        self._hidden_clip = clip_val
        trainer.gradient_clip_val = None  # Lightning's check reads it next: nothing left to do

    def _restore_clip(self, trainer: Any) -> None:
        if self._hidden_clip is not None:
            trainer.gradient_clip_val, self._hidden_clip = self._hidden_clip, None

    def on_train_batch_end(
        self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        # A profiler step is an optimizer step: under accumulate_grad_batches the micro-batches
        # before it belong to the same step (their samples are counted together).
        self._restore_clip(trainer)
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
        self._restore_clip(trainer)
        self._stop()

    def teardown(self, trainer: Any, pl_module: Any, stage: str) -> None:
        self._restore_clip(trainer)
        for g, value in self._saved_max_norm.values():
            g["max_grad_norm"] = value
        self._saved_max_norm = {}
        self._stop()

    def _stop(self) -> Optional[tsp.StepProfiler]:
        """Stops the running profiler (if any) and returns it; safe to call from any hook."""
        prof, self.profiler = self.profiler, None
        if prof is not None:
            prof.stop()
        return prof


__all__ = ["TorchspeedCallback"]
