"""glibc's allocator and the step: page faults a step pays when freed tensors go back to the OS.

glibc's malloc serves a large block (above M_MMAP_THRESHOLD, 128 KiB at first, raised on its own
up to 32 MiB as such blocks are freed) with a fresh mmap and unmaps it when freed, and returns the
free top of its heap to the OS above M_TRIM_THRESHOLD. A training step allocates and frees the
same activations each step, so their pages can be faulted in again (and zeroed by the kernel)
every step: on the demo's model (Zen 4, one thread), forward+backward took 4,000 minor faults and
8 ms of system time in 52 ms in float32, 480 and 0.3 ms in bf16 (whose blocks are half the size);
with both thresholds set, none in either. Whether it happens depends on the heap's history, so it is
measured (PageFaults, at step boundaries) and not assumed.

    faults = PageFaults(); faults.sample(step)            # at each step boundary (~1 µs)
    faults.per_step(first, left_out)                      # (faults, system seconds) or None
    malloc_tuned()                                        # "" = glibc as it comes
    with keep_freed_memory(): ...                         # the fix, applied in this process
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import platform
import statistics
from typing import Dict, Iterable, Iterator, Optional, Tuple

try:
    import resource
except ImportError:  # not on Windows
    resource = None  # type: ignore[assignment]

#: The fix's settings: blocks up to 32 MiB from the heap (glibc's ceiling for M_MMAP_THRESHOLD
#: on 64-bit; 64 MiB was refused) and up to 1 GiB of free heap top kept for the next step.
#: Setting the trim threshold alone turns off the dynamic mmap threshold, and a run faulted more
#: (23,000 faults a step, against 4,000): the two go together.
MMAP_THRESHOLD = 32 << 20
TRIM_THRESHOLD = 1 << 30
#: mallopt(3)'s parameter numbers (malloc.h).
_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
#: Allocators that replace glibc's through LD_PRELOAD (their own reuse; no advice for them).
_PRELOADED = ("jemalloc", "tcmalloc", "mimalloc")

ENV_FIX = f"MALLOC_MMAP_THRESHOLD_={MMAP_THRESHOLD} MALLOC_TRIM_THRESHOLD_={TRIM_THRESHOLD}"


class PageFaults:
    """This process's minor page faults and system CPU time (all its threads; not its children:
    the loader's worker processes fault on their own) in each step, by the step's number
    (``faults``, ``system_s``: the latter is also the --verify trials' measure of the malloc
    fix); ``per_step`` takes their medians over the steps the summary keeps."""

    def __init__(self):
        self.faults: Dict[int, int] = {}  # step -> this process's minor faults in it
        self.system_s: Dict[int, float] = {}  # step -> this process's system time in it
        self._last: Optional[Tuple[int, float]] = None

    def sample(self, step: int) -> None:
        """At the end of step number ``step`` (the first boundary only starts the count)."""
        if resource is None:
            return
        r = resource.getrusage(resource.RUSAGE_SELF)
        now = (int(r.ru_minflt), float(r.ru_stime))
        if self._last is not None:
            self.faults[step] = max(now[0] - self._last[0], 0)
            self.system_s[step] = max(now[1] - self._last[1], 0.0)
        self._last = now

    def per_step(
        self, first: int = 0, left_out: Iterable[int] = ()
    ) -> Optional[Tuple[float, float]]:
        """(minor faults, system seconds): medians over the steps numbered ``first`` on, less
        ``left_out`` (the summary's steps: a step torch.profiler recorded allocates its events
        and faults several times more); None without such a step."""
        drop = set(left_out)
        kept = [i for i in sorted(self.faults) if i >= first and i not in drop]
        if not kept:
            return None
        return (
            float(statistics.median(self.faults[i] for i in kept)),
            float(statistics.median(self.system_s[i] for i in kept)),
        )


def malloc_tuned() -> str:
    """ "" for glibc's malloc with its defaults; else what differs (the rule stays quiet)."""
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return "not glibc"
    pre = os.environ.get("LD_PRELOAD", "")
    for name in _PRELOADED:
        if name in pre:
            return f"LD_PRELOAD {name}"
    for var in ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_", "MALLOC_TOP_PAD_"):
        if var in os.environ:
            return var
    if "glibc.malloc." in os.environ.get("GLIBC_TUNABLES", ""):
        return "GLIBC_TUNABLES"
    return ""


@contextlib.contextmanager
def keep_freed_memory() -> Iterator[None]:
    """The fix in this process: mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD) and
    mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD), as the environment variables do at start. It
    cannot be undone: glibc has no way back to its dynamic threshold, so it stays set for the
    rest of the process (doctor --verify runs its trials last). Raises OSError where mallopt
    is not there or refuses."""
    libc = ctypes.CDLL(None)
    mallopt = getattr(libc, "mallopt", None)
    if mallopt is None:
        raise OSError("mallopt is not available (not glibc)")
    for param, value in ((_M_MMAP_THRESHOLD, MMAP_THRESHOLD), (_M_TRIM_THRESHOLD, TRIM_THRESHOLD)):
        if mallopt(ctypes.c_int(param), ctypes.c_int(value)) != 1:
            raise OSError(f"mallopt({param}, {value}) refused")
    yield
