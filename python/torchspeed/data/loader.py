"""torchspeed.data.DataLoader: one loader over native sources (sources.py) or a torch Dataset.

Design (why two paths):

* **Native sources** (:class:`WebDataset`, :class:`NpySource`, :class:`TensorSource`) run the whole
  per-sample pipeline (read, decode, crop, flip, normalize, collate) in C++ threads that write
  straight into a ring of reusable (pinned when CUDA exists) batch slots. No Python runs per
  sample, so threads scale without the GIL and without processes, pickling or a pin thread.
* **An ordinary torch map-style Dataset** runs user Python code in ``__getitem__``. Under the GIL,
  threads would serialize that code, so torch's process-based workers are the fastest available
  design; re-implementing them would add risk for no speed. We therefore delegate to
  ``torch.utils.data.DataLoader`` with the same arguments: batches are identical to torch's (same
  sampler, seeds, collate), speed is torch's, and ``device=`` adds the side-stream prefetch.
"""

from __future__ import annotations

import operator
import warnings
from typing import Any, Callable, Iterable, Iterator, Mapping, Optional

import torch

from .._native import native_module
from ..profile import hooks as _profile_hooks
from ..profile import ranges as _profile_ranges
from .prefetch import DevicePrefetcher
from .sources import _native, _NativeSource

_NEXT_NAME_ID = native_module("profile").intern("torchspeed.data.DataLoader.next")
_DATA_WAIT_PHASE = _profile_ranges.PHASE_IDS["data_wait"]


class DataLoader:
    """Drop-in for ``torch.utils.data.DataLoader`` (same argument names and meanings).

    With a native source (:class:`WebDataset`, :class:`NpySource`, :class:`TensorSource`) batches
    are produced by ``num_workers`` C++ threads (0 means 1) into ``num_workers * prefetch_factor
    + 2`` reusable slots. Extra arguments: ``seed`` (or ``generator``: its initial seed) fixes the
    shuffle and every augmentation: batches are bitwise identical for any ``num_workers``;
    ``device`` copies batches ahead on a side CUDA stream (:class:`DevicePrefetcher`);
    ``on_error`` "raise" (an error naming shard and sample key) or "skip" (counted in
    ``stats()["skipped"]`` and warned about at the end of the epoch); ``rank``/``world_size``/
    ``drop_uneven`` shard the epoch across processes (pad by default, like DistributedSampler).
    ``state_dict()``/``load_state_dict()`` resume mid-epoch exactly, with any ``num_workers``.
    A ``sampler`` (e.g. DistributedSampler) is iterated once per epoch for the order.
    ``collate_fn``, if given, is applied to each native batch (after C++ collation).

    With any other dataset, everything is delegated to ``torch.utils.data.DataLoader`` (see the
    module docstring for why) and ``device=`` is applied on top.
    """

    def __init__(
        self,
        dataset: Any,
        batch_size: Optional[int] = 1,
        shuffle: Optional[bool] = None,
        sampler: Optional[Iterable] = None,
        batch_sampler: Optional[Iterable] = None,
        num_workers: int = 0,
        collate_fn: Optional[Callable] = None,
        pin_memory: bool = False,
        drop_last: bool = False,
        timeout: float = 0,
        worker_init_fn: Optional[Callable] = None,
        multiprocessing_context: Any = None,
        generator: Optional[torch.Generator] = None,
        *,
        prefetch_factor: Optional[int] = None,
        persistent_workers: bool = False,
        pin_memory_device: str = "",
        in_order: bool = True,
        seed: Optional[int] = None,
        device: Any = None,
        prefetch_depth: int = 2,
        on_error: str = "raise",
        rank: Optional[int] = None,
        world_size: Optional[int] = None,
        drop_uneven: bool = False,
    ):
        self.dataset = dataset
        self.batch_size = batch_size
        self.device = torch.device(device) if device is not None else None
        self.prefetch_depth = prefetch_depth
        self.native = isinstance(dataset, _NativeSource)
        self.sampler = sampler
        self.collate_fn = collate_fn
        self.persistent_workers = persistent_workers
        self._epoch_sampler_seen = None
        self._iterator_id = 0  # the newest native iterator; older ones raise (one stream)
        if not self.native:
            kwargs = dict(
                batch_size=batch_size,
                shuffle=shuffle,
                sampler=sampler,
                batch_sampler=batch_sampler,
                num_workers=num_workers,
                collate_fn=collate_fn,
                pin_memory=pin_memory,
                drop_last=drop_last,
                timeout=timeout,
                worker_init_fn=worker_init_fn,
                multiprocessing_context=multiprocessing_context,
                generator=generator,
                prefetch_factor=prefetch_factor,
                persistent_workers=persistent_workers,
                pin_memory_device=pin_memory_device,
            )
            if not in_order:
                kwargs["in_order"] = in_order
            if seed is not None and generator is None:
                kwargs["generator"] = torch.Generator().manual_seed(seed)
            self._torch_loader = torch.utils.data.DataLoader(dataset, **kwargs)
            return

        if batch_sampler is not None or batch_size is None:
            raise ValueError(
                "torchspeed.data.DataLoader: native sources need batch_size >= 1 and "
                "no batch_sampler (batches are assembled in C++)"
            )
        if worker_init_fn is not None:
            raise ValueError(
                "torchspeed.data.DataLoader: worker_init_fn does not apply to native "
                "sources (workers are C++ threads running no Python)"
            )
        if sampler is not None and shuffle:
            raise ValueError(
                "torchspeed.data.DataLoader: sampler option is mutually exclusive with shuffle"
            )
        if seed is None:
            seed = (
                generator.initial_seed()
                if generator is not None
                else int(torch.empty((), dtype=torch.int64).random_().item())
            )
        self.seed = int(seed) & 0xFFFFFFFFFFFFFFFF
        # Ranges are checked once, in C++ (ValueError); here only that integers are integers.
        o = _native().LoaderOptions()
        o.batch_size = _int_option(batch_size, "batch_size")
        o.shuffle = bool(shuffle)
        o.drop_last = bool(drop_last)
        o.num_workers = _int_option(num_workers, "num_workers")  # 0 runs one C++ thread
        o.prefetch_factor = (
            2 if prefetch_factor is None else _int_option(prefetch_factor, "prefetch_factor")
        )
        o.pin_memory = bool(pin_memory) or (self.device is not None and self.device.type == "cuda")
        o.timeout_s = float(timeout)
        o.seed = self.seed
        o.on_error = str(on_error)
        o.rank = 0 if rank is None else _int_option(rank, "rank")
        o.world_size = 1 if world_size is None else _int_option(world_size, "world_size")
        o.drop_uneven = bool(drop_uneven)
        self.options = o
        self._loader = _native().Loader(dataset._source, o)

    # ---- torch DataLoader surface
    def __len__(self) -> int:
        if not self.native:
            return len(self._torch_loader)
        if self.sampler is not None:
            n = len(self.sampler)  # type: ignore[arg-type]
            b = self.options.batch_size
            return n // b if self.options.drop_last else (n + b - 1) // b
        return self._loader.num_batches()

    def __iter__(self) -> Iterator:
        _profile_hooks.saw_loader(self)
        it = iter(self._torch_loader) if not self.native else _NativeIterator(self)
        if self.device is not None:
            return iter(DevicePrefetcher(_Once(it, len(self)), self.device, self.prefetch_depth))
        return it

    def set_epoch(self, epoch: int) -> None:
        """Sets the epoch of the next iteration (shuffle order and augmentation draws)."""
        if self.sampler is not None and hasattr(self.sampler, "set_epoch"):
            self.sampler.set_epoch(epoch)
        if self.native:
            self._loader.set_epoch(_as_int(epoch, "set_epoch", "epoch"))
        elif hasattr(getattr(self._torch_loader, "sampler", None), "set_epoch"):
            self._torch_loader.sampler.set_epoch(epoch)

    @property
    def epoch(self) -> int:
        self._require_native("epoch")
        return self._loader.epoch

    def state_dict(self) -> dict:
        """Resume state (a few integers): epoch, batches consumed and samples skipped, plus what
        fixes the sample order (seed, sizes, shuffle, drop_last), checked on load."""
        self._require_native("state_dict")
        return dict(self._loader.state_dict())

    def load_state_dict(self, state: Mapping[str, int]) -> None:
        """Restores :meth:`state_dict`; the next iteration resumes after the consumed batches.

        Every field is validated (in C++) before anything changes: ValueError for a missing or
        unexpected key, a value out of range, or a state saved with another order; TypeError
        for a value that is not an integer.
        """
        self._require_native("load_state_dict")
        if not isinstance(state, Mapping):
            raise TypeError(
                "torchspeed.data.DataLoader.load_state_dict: state must be a mapping (from "
                f"state_dict()), got {type(state).__name__}"
            )
        self._loader.load_state_dict(
            {str(k): _as_int(v, "load_state_dict", str(k)) for k, v in state.items()}
        )

    def stats(self) -> dict:
        """Throughput, per-stage seconds (summed over threads), queue occupancy, consumer wait."""
        self._require_native("stats")
        return self._loader.stats()

    def reset_stats(self) -> None:
        self._require_native("reset_stats")
        self._loader.reset_stats()

    def shutdown(self) -> None:
        """Stops the worker threads now (they restart on the next iteration)."""
        if self.native:
            self._loader.shutdown()

    def __repr__(self) -> str:
        if not self.native:
            return f"torchspeed.data.DataLoader(delegating to {self._torch_loader!r})"
        o = self.options
        return (
            f"torchspeed.data.DataLoader({self.dataset!r}, batch_size={o.batch_size}, "
            f"shuffle={o.shuffle}, drop_last={o.drop_last}, num_workers={o.num_workers}, "
            f"prefetch_factor={o.prefetch_factor}, seed={o.seed}, on_error={o.on_error!r}, "
            f"rank={o.rank}, world_size={o.world_size}, device={self.device})"
        )

    def _require_native(self, what: str) -> None:
        if not self.native:
            raise NotImplementedError(
                f"torchspeed.data.DataLoader.{what}: only available for native sources "
                "(WebDataset, NpySource, TensorSource); torch Datasets are delegated to "
                "torch.utils.data.DataLoader"
            )


class _Once:
    """An already-started iterator with a length, for DevicePrefetcher."""

    def __init__(self, it: Iterator, n: int):
        self.it, self.n = it, n

    def __iter__(self) -> Iterator:
        return self.it

    def __len__(self) -> int:
        return self.n


def _as_int(value: Any, op: str, name: str) -> int:
    """An integer argument for the C++ loader (int, numpy or 0-dim tensor integer; not float)."""
    try:
        v = operator.index(value)
    except TypeError:
        raise TypeError(
            f"torchspeed.data.DataLoader.{op}: {name} must be an integer, got "
            f"{type(value).__name__} ({value!r:.60})"
        ) from None
    if not -(2**63) <= v < 2**63:
        raise ValueError(f"torchspeed.data.DataLoader.{op}: {name} must fit in int64, got {v}")
    return v


def _int_option(value: Any, name: str) -> int:
    v = _as_int(value, "__init__", name)
    if not -(2**31) <= v < 2**31:
        raise ValueError(f"torchspeed.data.DataLoader: {name} must fit in int32, got {v}")
    return v


def _sampler_indices(sampler: Iterable) -> list:
    out = []
    for i in sampler:
        try:
            out.append(operator.index(i))
        except TypeError:
            raise TypeError(
                "torchspeed.data.DataLoader: sampler must yield integer indices, got "
                f"{type(i).__name__} ({i!r:.60}); a sampler of batches goes in batch_sampler=, "
                "which native sources do not take"
            ) from None
    return out


class _NativeIterator:
    """One pass over a native loader. A native loader runs one stream of batches at a time (like
    torch's loader with persistent_workers=True): a new iterator's first next() starts a new
    epoch and the previous iterator, if unfinished, is abandoned; it raises if used again."""

    def __init__(self, dl: DataLoader):
        self.dl = dl
        self.done = False
        self.started = False
        dl._iterator_id += 1
        self.id = dl._iterator_id
        self.skipped_at_start = 0

    def _start(self) -> None:
        # At the first next(), not at iter(): an iterator never advanced (Lightning's "is it
        # iterable?" check calls iter() once) must not start an epoch, whose abandonment by the
        # next iter() would advance the epoch and the state_dict.
        dl = self.dl
        if dl.sampler is not None:
            dl._loader.set_indices(_sampler_indices(dl.sampler))
        dl._loader.start_epoch()
        self.started = True
        self.skipped_at_start = dl._loader.stats()["skipped"]

    def __iter__(self) -> _NativeIterator:
        return self

    def __len__(self) -> int:
        return len(self.dl)

    def __next__(self) -> Any:
        if self.done:
            raise StopIteration
        if self.id != self.dl._iterator_id:
            raise RuntimeError(
                "torchspeed.data.DataLoader: this iterator was superseded by a newer iter() over "
                "the same loader, which started a new epoch (a native loader runs one stream at a "
                "time); use one iterator per loader, or a second DataLoader for a second stream"
            )
        if not self.started:
            self._start()
        # The data wait of torchspeed.profile's step breakdown (the C++ Loader::next reports it
        # too; this one also marks the CUDA timeline).
        _profile_ranges._enter(_NEXT_NAME_ID, _DATA_WAIT_PHASE)
        try:
            r = self.dl._loader.next()
            if r is None:
                self._finish()
                raise StopIteration
            batch = self.dl.dataset._convert(r[0])
            if self.dl.collate_fn is not None:
                batch = self.dl.collate_fn(batch)
        finally:
            _profile_ranges._exit(_NEXT_NAME_ID, _DATA_WAIT_PHASE)
        if _profile_hooks._active_hooks:
            _profile_hooks.saw_batch(batch)
        return batch

    def __del__(self) -> None:
        # Dropping an unfinished iterator stops the threads (unless persistent_workers).
        try:
            superseded = self.id != self.dl._iterator_id
            if self.started and not self.done and not superseded and not self.dl.persistent_workers:
                self.done = True
                self.dl._loader.shutdown()
        except Exception:  # noqa: BLE001 (interpreter shutdown)
            pass

    def _finish(self) -> None:
        self.done = True
        st = self.dl._loader.stats()
        skipped = st["skipped"] - self.skipped_at_start
        if skipped:
            warnings.warn(
                f"torchspeed.data.DataLoader: skipped {skipped} sample(s) this epoch "
                f"(on_error='skip'); last error: {st['last_error']}",
                stacklevel=3,
            )
        if not self.dl.persistent_workers:
            self.dl._loader.shutdown()
