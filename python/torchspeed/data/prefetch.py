"""DevicePrefetcher: copies batches to the GPU on a side CUDA stream, ``depth`` batches ahead."""

from __future__ import annotations

import collections
from typing import Any, Iterable, Iterator

import torch


def _map_tensors(obj: Any, fn) -> Any:
    if isinstance(obj, torch.Tensor):
        return fn(obj)
    if isinstance(obj, dict):
        return type(obj)((k, _map_tensors(v, fn)) for k, v in obj.items())
    if isinstance(obj, tuple) and hasattr(obj, "_fields"):  # namedtuple
        return type(obj)(*(_map_tensors(v, fn) for v in obj))
    if isinstance(obj, (list, tuple)):
        return type(obj)(_map_tensors(v, fn) for v in obj)
    return obj


def _for_each_tensor(obj: Any, fn) -> None:
    _map_tensors(obj, lambda t: (fn(t), t)[1])


class DevicePrefetcher:
    """Wraps any iterable of batches (torchspeed's or torch's loader) and yields them on ``device``.

    Copies are issued on a side CUDA stream ``depth`` batches ahead with ``non_blocking=True``;
    the consumer's current stream waits on an event (a GPU-side wait, no host sync), and
    ``record_stream`` tells the caching allocator the tensors are used on the consumer stream.
    Host batches stay referenced until their copy has finished, so pinned loader slots are never
    rewritten under an in-flight copy. Without CUDA (or for a CPU device) it is a pass-through.

    Args:
        iterable: yields tensors or (nested) tuples/lists/dicts of tensors; other leaves pass through.
        device: target device (default: the current CUDA device if available, else CPU).
        depth: batches in flight on the copy stream (>= 1).
    """

    def __init__(self, iterable: Iterable, device: Any = None, depth: int = 2):
        if depth < 1:
            raise ValueError(f"torchspeed.data.DevicePrefetcher: depth must be >= 1, got {depth}")
        if device is None:
            device = "cuda" if torch.cuda.is_available() else "cpu"
        self.iterable = iterable
        self.device = torch.device(device)
        if self.device.type == "cuda" and self.device.index is None and torch.cuda.is_available():
            self.device = torch.device("cuda", torch.cuda.current_device())
        self.depth = depth
        self.enabled = self.device.type == "cuda" and torch.cuda.is_available()

    def __len__(self) -> int:
        return len(self.iterable)  # type: ignore[arg-type]

    def __repr__(self) -> str:
        return (
            f"DevicePrefetcher(device={self.device}, depth={self.depth}, "
            f"enabled={self.enabled}, iterable={self.iterable!r})"
        )

    def __iter__(self) -> Iterator:
        if not self.enabled:
            if self.device.type == "cpu":
                yield from self.iterable
            else:  # e.g. "meta" or another accelerator: plain synchronous copies
                for batch in self.iterable:
                    yield _map_tensors(batch, lambda t: t.to(self.device))
            return
        yield from self._cuda_iter()

    def _cuda_iter(self) -> Iterator:
        device = self.device
        stream = torch.cuda.Stream(device=device)
        it = iter(self.iterable)
        queue: collections.deque = collections.deque()
        pending_hosts: collections.deque = collections.deque()  # (event, host batch)

        def issue() -> bool:
            try:
                host = next(it)
            except StopIteration:
                return False
            with torch.cuda.stream(stream):
                dev = _map_tensors(host, lambda t: t.to(device, non_blocking=True))
                event = torch.cuda.Event()
                event.record(stream)
            queue.append((dev, event, host))
            return True

        for _ in range(self.depth):
            if not issue():
                break
        while queue:
            dev, event, host = queue.popleft()
            current = torch.cuda.current_stream(device)
            current.wait_event(event)
            _for_each_tensor(dev, lambda t, s=current: t.record_stream(s))
            pending_hosts.append((event, host))
            while pending_hosts and pending_hosts[0][0].query():
                pending_hosts.popleft()  # copy finished: the loader may reuse that slot
            issue()
            yield dev
