"""AccumulatingDDP: torch DDP's role, with gradient accumulation as the normal shape of the loop.

The reducer is C++ (``torchspeed._C.dist.AccumulatingDDP``, include/torchspeed/dist/ddp.h): flat
gradient buckets from construction (each ``param.grad`` is a view into its bucket), hooks on the
params' AccumulateGrad nodes, in-order asynchronous all-reduces on torch's own c10d process group,
and the last wait before ``backward()`` returns.
"""

from __future__ import annotations

import contextlib
import numbers
import warnings
import weakref
from collections.abc import Iterator
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from .._native import native_module
from .errors import RanksOutOfData
from .process_group import as_process_group
from .zero import ZeroOptimizer

_COMPRESSION = {
    None: "none",
    "none": "none",
    "bf16": "bf16",
    "bfloat16": "bf16",
    torch.bfloat16: "bf16",
    "fp16": "fp16",
    "float16": "fp16",
    torch.float16: "fp16",
}
_PREFIX = "module."
_NAME = "torchspeed.dist.AccumulatingDDP"
_INT64_MAX = 2**63 - 1


def _check_int(value, arg, what=_NAME):
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{what}: {arg} must be an int, got {type(value).__name__} {value!r}")
    if value > _INT64_MAX:
        raise ValueError(f"{what}: {arg} must be < 2**63, got {value}")


def _check_real(value, arg, what=_NAME):
    """A Python number (int or float, not bool); its range is checked where it is used."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{what}: {arg} must be a number, got {type(value).__name__} {value!r}")


def _check_bool(value, arg, what=_NAME):
    if not isinstance(value, bool):
        raise TypeError(f"{what}: {arg} must be a bool, got {type(value).__name__} {value!r}")


class AccumulatingDDP(nn.Module):
    """Data parallelism with gradient accumulation over a torch.distributed process group.

    Wraps ``module`` like ``torch.nn.parallel.DistributedDataParallel``: params and buffers are
    broadcast from rank 0 here, ``.module`` is the wrapped module, and calling the wrapper runs
    ``module``. Every ``accumulation_steps``-th backward all-reduces the gradients (averaged over
    ranks); the others only accumulate, with zero communication::

        model = AccumulatingDDP(model, accumulation_steps=8)   # after init_process_group
        for x, y in loader:
            loss = loss_fn(model(x), y) / model.accumulation_steps
            loss.backward()
            if model.sync_now:            # the 8th micro-step: grads are reduced
                opt.step()
                opt.zero_grad()

    Code written for torch's DDP runs unchanged: with the default ``accumulation_steps=1`` every
    backward reduces, and forwards under ``no_sync()`` do not (they still count toward the window).

    Args:
        module: the model, on its device (CPU for Gloo, the rank's GPU for NCCL).
        accumulation_steps: micro-steps per optimizer step (>= 1).
        process_group: a c10d process group; None is the default group.
        bucket_cap_mb: gradient bucket size in MiB (torch's default, 25); the first bucket is
            ``first_bucket_cap_mb`` (1) so its all-reduce starts early in backward.
        compression: None, "bf16" or "fp16" (or the torch dtypes): float32 buckets travel in that
            dtype, half the bytes; the 1/world division and the cast are one fused pass.
        find_unused_parameters: agree across ranks which params got no gradient in the whole
            window and leave their ``.grad`` None, as single-process training would (one extra
            small all-reduce per optimizer step). Params unused in *some* micro-steps are always
            handled correctly. Off: a param no rank used gets a zero gradient.
        broadcast_buffers: broadcast buffers from rank 0 at every synchronising forward.
        zero: 1 for ZeRO-1: each bucket is reduce-scattered instead of all-reduced, and the
            optimizer made by :meth:`zero_optimizer` keeps state for this rank's shard only
            (docs/DIST.md). After the synchronising backward the params' ``.grad`` are not the
            reduced gradient: it lives in the shards (clip with :meth:`clip_grad_norm_`).
        device_ids, output_device, gradient_as_bucket_view, static_graph: accepted for drop-in
            compatibility with torch's DDP. Gradients are always bucket views; static_graph is
            not needed (readiness is tracked per window); device_ids must name the module's device.

    Every rank must wrap the same model with the same options: construction checks the params
    and buffers (count, dtype, shape, requires_grad) and the options that shape the collectives
    (accumulation_steps, the bucket caps, compression, find_unused_parameters,
    broadcast_buffers) in one small all-reduce, and every rank raises ValueError naming the first
    difference. A param frozen after wrapping (``requires_grad_(False)`` on every rank) keeps
    ``.grad`` None through the reduction, as in a single process, so the optimizer leaves it
    alone. Bad types raise TypeError and bad values ValueError, before anything is changed.

    ``state_dict()`` has the wrapped module's plain keys (no ``module.`` prefix), so a checkpoint
    loads into the bare model; ``load_state_dict`` accepts both plain keys and torch DDP's
    ``module.``-prefixed ones.
    """

    def __init__(
        self,
        module: nn.Module,
        accumulation_steps: int = 1,
        process_group: Any = None,
        bucket_cap_mb: float | None = 25.0,
        compression: str | torch.dtype | None = None,
        find_unused_parameters: bool = False,
        broadcast_buffers: bool = True,
        first_bucket_cap_mb: float = 1.0,
        device_ids: list | None = None,
        output_device: Any = None,
        gradient_as_bucket_view: bool = True,
        static_graph: bool = False,
        zero: int = 0,
    ) -> None:
        super().__init__()
        name = _NAME
        if not isinstance(module, nn.Module):
            raise TypeError(
                f"{name}: module must be a torch.nn.Module, got {type(module).__name__}"
            )
        _check_int(accumulation_steps, "accumulation_steps")
        _check_int(zero, "zero")
        bucket_cap_mb = 25.0 if bucket_cap_mb is None else bucket_cap_mb
        _check_real(bucket_cap_mb, "bucket_cap_mb")
        _check_real(first_bucket_cap_mb, "first_bucket_cap_mb")
        for flag, value in (
            ("find_unused_parameters", find_unused_parameters),
            ("broadcast_buffers", broadcast_buffers),
            ("gradient_as_bucket_view", gradient_as_bucket_view),
            ("static_graph", static_graph),
        ):
            _check_bool(value, flag)
        if not (compression is None or isinstance(compression, (str, torch.dtype))):
            raise TypeError(
                f"{name}: compression must be None, a str or a torch.dtype, "
                f"got {type(compression).__name__}"
            )
        key = compression if not isinstance(compression, str) else compression.lower()
        if key not in _COMPRESSION:
            raise ValueError(
                f"{name}: compression must be None, 'bf16' or 'fp16', got {compression!r}"
            )
        if process_group is None:
            if not dist.is_available() or not dist.is_initialized():
                raise RuntimeError(
                    f"{name}: no process group: call torch.distributed.init_process_group() first "
                    "(torchrun sets RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT), or pass "
                    "process_group="
                )
            process_group = dist.distributed_c10d._get_default_group()
        process_group = as_process_group(process_group, name)
        named_params = list(module.named_parameters())
        params = [p for _, p in named_params]
        if device_ids is not None:
            if not isinstance(device_ids, (list, tuple)) or not all(
                isinstance(d, (int, str, torch.device)) and not isinstance(d, bool)
                for d in device_ids
            ):
                raise TypeError(
                    f"{name}: device_ids must be a list of ints, strs or torch.devices, "
                    f"got {device_ids!r}"
                )
            devices = {p.device for p in params}
            try:
                wanted = {
                    torch.device(d) if not isinstance(d, int) else torch.device("cuda", d)
                    for d in device_ids
                }
            except RuntimeError as e:  # torch.device("bogus"), torch.device("cuda", -1)
                raise ValueError(f"{name}: device_ids must name devices, got {device_ids!r}") from e
            if not devices <= wanted:
                raise ValueError(
                    f"{name}: device_ids {device_ids} do not hold the module's params (on "
                    f"{sorted(map(str, devices))}); move the module to its device first"
                )
        del output_device, gradient_as_bucket_view, static_graph  # accepted, see the docstring
        self.module = module
        self.process_group = process_group
        self.accumulation_steps = int(accumulation_steps)
        self.compression = _COMPRESSION[key]
        self.zero = int(zero)
        # The trainable params in the reducer's slot order (distinct, requires_grad at wrapping).
        seen: set[int] = set()
        self._slot_params = []
        for p in params:
            if id(p) not in seen and p.requires_grad:
                seen.add(id(p))
                self._slot_params.append(p)
        self._zero_optimizer = None
        self._no_sync_depth = 0
        self._in_micro_batch = False
        # The values are validated once, in C++ (ValueError), before any collective; then one
        # small all-reduce checks that every rank has the same model and options.
        named_buffers = list(module.named_buffers())
        self._impl = native_module("dist", name).AccumulatingDDP(
            params,
            [b for _, b in named_buffers],
            process_group,
            accumulation_steps=int(accumulation_steps),
            bucket_cap_mb=float(bucket_cap_mb),
            first_bucket_cap_mb=float(first_bucket_cap_mb),
            compression=self.compression,
            find_unused_parameters=find_unused_parameters,
            broadcast_buffers=broadcast_buffers,
            param_names=[n for n, _ in named_params],
            buffer_names=[n for n, _ in named_buffers],
            zero=int(zero),
        )
        self.register_state_dict_post_hook(_strip_module_prefix)
        self.register_load_state_dict_pre_hook(_add_module_prefix)

    # ---- the training loop ---------------------------------------------------------------------

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        if torch.is_grad_enabled() and not self._in_micro_batch:
            self._impl.begin_micro_step(self._no_sync_depth == 0)
        return self.module(*args, **kwargs)

    @property
    def sync_now(self) -> bool:
        """Whether the current micro-step (the last forward) all-reduces: True from the forward
        of the window's last micro-step until the next forward, so ``if model.sync_now:
        opt.step()`` after ``backward()`` steps at the boundary."""
        return self._impl.sync_now

    @property
    def micro_step(self) -> int:
        """Backward passes since the last reduction (0 .. accumulation_steps - 1)."""
        return self._impl.micro_step

    @property
    def rank(self) -> int:
        return self._impl.rank

    @property
    def world_size(self) -> int:
        return self._impl.world_size

    @contextlib.contextmanager
    def no_sync(self) -> Iterator[None]:
        """torch DDP's no_sync(): forwards (and their backwards) inside do not all-reduce."""
        self._no_sync_depth += 1
        try:
            yield
        finally:
            self._no_sync_depth -= 1

    @contextlib.contextmanager
    def micro_batch(self, sync: bool | None = None) -> Iterator[bool]:
        """One micro-step, explicitly: the forwards inside count once (for models called several
        times per step). Yields whether its backward reduces; ``sync=False`` forbids it, like
        no_sync(). Use one backward per micro-step."""
        if sync is not None:
            _check_bool(sync, "sync", f"{_NAME}.micro_batch")
        allow = self._no_sync_depth == 0 and sync is not False
        reduces = self._impl.begin_micro_step(allow)
        self._in_micro_batch = True
        try:
            yield reduces
        finally:
            self._in_micro_batch = False

    @contextlib.contextmanager
    def join(self, throw_on_early_termination: bool = False) -> Iterator[None]:
        """Uneven inputs: put the training loop inside ``with model.join():``.

        Each optimizer step then starts with one tiny all-reduce that says which ranks are still
        training. When a rank runs out of data and leaves the loop, every other rank stops at the
        same optimizer step instead of waiting for it forever: with
        ``throw_on_early_termination=True`` they raise :class:`RanksOutOfData` naming the ranks
        that ran out; by default the block ends quietly on every rank (a warning names them).
        """
        _check_bool(throw_on_early_termination, "throw_on_early_termination", f"{_NAME}.join")
        self._impl.join_begin()
        try:
            yield
        except RanksOutOfData as e:
            if throw_on_early_termination:
                raise
            warnings.warn(str(e), RuntimeWarning, stacklevel=3)
            return
        self._impl.join()

    def global_mean_factor(self, count: float) -> float:
        """Loss normalisation for variable-length batches.

        ``count`` is this rank's number of tokens (or samples) in the whole accumulation window.
        Returns ``world_size / (count summed over every rank)``: multiply each micro-step's
        *summed* loss by it, and the reduced gradient is the large-batch mean over every token of
        the window on every rank (DDP's average over ranks included). One small all-reduce.
        """
        what = f"{_NAME}.global_mean_factor"
        if isinstance(count, torch.Tensor) and count.numel() == 1 and not count.is_complex():
            count = count.item()
        _check_real(count, "count", what)
        if not (count >= 0 and count != float("inf")):
            raise ValueError(f"{what}: count must be finite and >= 0, got {count}")
        total = self._impl.all_reduce_count(float(count))
        if total <= 0:
            raise ValueError(
                f"torchspeed.dist.AccumulatingDDP.global_mean_factor: the count summed over the "
                f"ranks must be > 0, got {total}"
            )
        return self.world_size / total

    def clip_grad_norm_(self, max_norm: float) -> torch.Tensor:
        """Clips the reduced gradients to a global L2 norm of ``max_norm`` (after
        ``scaler.unscale_(opt)`` when using a GradScaler): one read of each bucket, the same norm
        on every rank. Returns the total norm before clipping, like
        ``torch.nn.utils.clip_grad_norm_``, and like it, ``max_norm=0`` zeroes the gradients and
        ``inf`` only measures them. A negative or NaN ``max_norm`` raises ValueError (torch would
        flip the gradients' sign)."""
        if isinstance(max_norm, torch.Tensor) and max_norm.numel() == 1:
            max_norm = max_norm.item()
        _check_real(max_norm, "max_norm", f"{_NAME}.clip_grad_norm_")
        return self._impl.clip_grad_norm_(float(max_norm))

    def zero_optimizer(self, optimizer_class: type, **defaults: Any) -> ZeroOptimizer:
        """ZeRO-1 (``zero=1``): an ``optimizer_class`` (torchspeed's fused AdamW, Adam, SGD, Lion,
        or a ``torch.optim`` class) over this rank's shard of every bucket, with ``defaults`` as
        its hyperparameters; ``step()`` all-gathers the updated params. See
        :class:`torchspeed.dist.ZeroOptimizer`."""
        opt = ZeroOptimizer(self, optimizer_class, **defaults)
        self._zero_optimizer = weakref.ref(opt)
        return opt

    def zero_grad(self, set_to_none: bool = True) -> None:
        """``set_to_none=False`` zeroes the buckets in place (one memset each), so the next backward
        accumulates straight into them; the default, like torch, sets grads to None (the reducer
        then copies each new gradient into its bucket once per window)."""
        _check_bool(set_to_none, "set_to_none", f"{_NAME}.zero_grad")
        if set_to_none:
            super().zero_grad(set_to_none=True)
        else:
            self._impl.zero_grad()

    def broadcast_from_rank0(self) -> None:
        """Re-broadcasts params and buffers from rank 0 (construction does it once)."""
        self._impl.broadcast_from_rank0()

    def stats(self) -> dict:
        """What the reducer did: buckets, collectives (gradient and control), bytes reduced, and
        the communication time, the part of it exposed after backward and the overlap fraction
        of the last optimizer step (nanoseconds on torchspeed's profiler clock)."""
        s = self._impl.stats()
        out = {k: getattr(s, k) for k in dir(s) if not k.startswith("_")}
        opt = self._zero_optimizer() if self._zero_optimizer is not None else None
        if opt is not None:  # ZeRO-1: what the optimizer gathered and the state it holds
            out.update(opt.stats())
        return out

    def buckets(self) -> list[torch.Tensor]:
        """The flat gradient buckets, in reduction order (each param's grad is a view into one)."""
        return self._impl.buckets()

    def extra_repr(self) -> str:
        return (
            f"accumulation_steps={self.accumulation_steps}, world_size={self.world_size}, "
            f"buckets={self._impl.stats().buckets}, compression={self.compression!r}"
        )


def _strip_module_prefix(module, state_dict, prefix, local_metadata):
    # The wrapped module's keys (and their version metadata) without the "module." level.
    old = prefix + _PREFIX
    for key in list(state_dict.keys()):
        if key.startswith(old):
            state_dict[prefix + key[len(old) :]] = state_dict.pop(key)
    metadata = getattr(state_dict, "_metadata", None)
    if metadata is not None:
        for key in list(metadata.keys()):
            if key == old[:-1]:
                metadata[prefix[:-1]] = metadata.pop(key)
            elif key.startswith(old):
                metadata[prefix + key[len(old) :]] = metadata.pop(key)


def _add_module_prefix(
    module, state_dict, prefix, local_metadata, strict, missing, unexpected, errs
):
    # Keys arrive plain (ours, or the bare model's) or with torch DDP's "module." prefix; the
    # wrapped module sits under "module." here.
    for key in list(state_dict.keys()):
        if not key.startswith(prefix) or key.startswith(prefix + _PREFIX):
            continue
        state_dict[prefix + _PREFIX + key[len(prefix) :]] = state_dict.pop(key)
