"""Finding the largest batch that fits: doubling, then a binary search on out-of-memory.

    def step(batch_size):                       # one training step at that batch size
        x = torch.randn(batch_size, 3, 224, 224, device="cuda")
        model(x).sum().backward()
        model.zero_grad(set_to_none=True)
    bs = torchspeed.tune.max_batch_size(step, start=8, limit=4096)

On CUDA an out-of-memory is torch.OutOfMemoryError; the cache is emptied between tries. On the CPU
the process rarely gets an error before the machine swaps, so give ``rss_limit_bytes``: a try
whose peak resident memory (VmHWM, reset before each try) passes it counts as out of memory.
"""

from __future__ import annotations

import gc
import numbers
from typing import Callable, Optional

import torch

_NAME = "torchspeed.tune.max_batch_size"


# The exact text of torch's CPU allocator when malloc fails (it raises a plain RuntimeError, not
# torch.OutOfMemoryError): c10/core/impl/alloc_cpu.cpp.
_CPU_ALLOCATOR_OOM = (
    "DefaultCPUAllocator: can't allocate memory",
    "DefaultCPUAllocator: not enough memory",
)


def _is_oom(e: BaseException) -> bool:
    """A real out-of-memory only: torch.OutOfMemoryError (CUDA, and the CPU allocator in newer
    torch), MemoryError, or the CPU allocator's own failure. Another error that merely mentions
    memory ("index out of memory map range") is the step's bug and propagates."""
    if isinstance(e, (torch.OutOfMemoryError, MemoryError)):
        return True
    return type(e) is RuntimeError and any(m in str(e) for m in _CPU_ALLOCATOR_OOM)


def _free(device: Optional[str]) -> None:
    gc.collect()
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()


def _reset_peak_rss() -> bool:
    """Resets the kernel's peak-RSS mark of this process (Linux: clear_refs 5)."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def peak_rss_bytes() -> int:
    """This process's peak resident memory since the last reset (VmHWM), in bytes."""
    with open("/proc/self/status", encoding="ascii") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    raise OSError("no VmHWM in /proc/self/status")


def _int_arg(value, name: str, low: int, low_text: Optional[str] = None) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{_NAME}: {name} must be an int, got {value!r}")
    if value < low:
        raise ValueError(f"{_NAME}: {name} must be an int >= {low_text or low}, got {value!r}")
    return int(value)


def max_batch_size(
    step_fn: Callable[[int], object],
    start: int = 1,
    limit: Optional[int] = None,
    rss_limit_bytes: Optional[int] = None,
    max_tries: int = 64,
    verbose: bool = False,
) -> int:
    """The largest batch size in [start, limit] for which ``step_fn(batch_size)`` runs without
    running out of memory: ``start`` doubles until a try fails (or ``limit`` is reached), then a
    binary search between the last size that fitted and the first that did not. Memory is freed
    between tries. Raises RuntimeError when even ``start`` does not fit.

    Only a real out-of-memory counts as "does not fit": torch.OutOfMemoryError, MemoryError, the
    CPU allocator's failure, or a peak RSS above ``rss_limit_bytes``. Every other exception of
    ``step_fn`` propagates, even one whose message mentions memory."""
    if not callable(step_fn):
        raise TypeError(f"{_NAME}: step_fn must be callable, got {type(step_fn).__name__}")
    start = _int_arg(start, "start", 1)
    if limit is not None:
        limit = _int_arg(limit, "limit", start, f"start ({start})")
    max_tries = _int_arg(max_tries, "max_tries", 1)
    if not isinstance(verbose, bool):
        raise TypeError(f"{_NAME}: verbose must be a bool, got {verbose!r}")
    if rss_limit_bytes is not None:
        rss_limit_bytes = _int_arg(rss_limit_bytes, "rss_limit_bytes", 1)
        if not _reset_peak_rss():
            raise RuntimeError(f"{_NAME}: rss_limit_bytes needs Linux's /proc/self/clear_refs")
    tries = 0

    def fits(bs: int) -> bool:
        nonlocal tries
        tries += 1
        if tries > max_tries:
            raise RuntimeError(f"{_NAME}: gave up after {max_tries} tries")
        _free(None)
        if rss_limit_bytes is not None:
            _reset_peak_rss()
        try:
            step_fn(bs)
            ok = rss_limit_bytes is None or peak_rss_bytes() <= rss_limit_bytes
        except BaseException as e:  # noqa: BLE001 (only out-of-memory is swallowed)
            if not _is_oom(e):
                raise
            ok = False
        _free(None)
        if verbose:
            print(f"{_NAME}: batch {bs}: {'fits' if ok else 'out of memory'}", flush=True)
        return ok

    if not fits(start):
        raise RuntimeError(f"{_NAME}: even start={start} does not fit in memory")
    good, bad = start, None
    while limit is None or good < limit:
        nxt = good * 2 if limit is None else min(good * 2, limit)
        if fits(nxt):
            good = nxt
        else:
            bad = nxt
            break
    if bad is None:
        return good
    while bad - good > 1:
        mid = (good + bad) // 2
        if fits(mid):
            good = mid
        else:
            bad = mid
    return good


__all__ = ["max_batch_size", "peak_rss_bytes"]
