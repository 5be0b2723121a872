"""The loader's own CPU time over the profiled steps, read from /proc (Linux): torch DataLoader
worker processes (their pids, from the iterators the hooks see) and torchspeed's C++ loader
threads (named LOADER_THREAD_NAME by csrc/data/loader_workers.cpp). The cpu_threads rule needs it:
the cores the loader keeps busy are not free for torch's intra-op threads. Unknown (None) where
/proc is not there. A sample lists this process's threads and reads a few stat files: ~35 µs,
once per step.

    cpu = LoaderCpu()
    cpu.add_workers([w.pid for w in it._workers])   # a torch DataLoader iterator's processes
    cpu.sample(counting=True)                        # at each step boundary
    cpu.per_step_s()                                 # CPU seconds per counted step, or None
"""

from __future__ import annotations

import os
from typing import Dict, Iterable, Optional, Set, Tuple

#: The name torchspeed's C++ loader gives its worker threads (pthread_setname_np).
LOADER_THREAD_NAME = "ts-loader"


def _tick() -> float:
    try:
        return float(os.sysconf("SC_CLK_TCK"))
    except (AttributeError, ValueError, OSError):
        return 100.0


_TICK = _tick()


def stat_cpu_s(path: str) -> Optional[float]:
    """utime + stime of a /proc/.../stat file in seconds; None when it cannot be read (the
    process or thread is gone)."""
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError:
        return None
    # The command name (field 2) is in parentheses and may hold spaces: split after its end.
    fields = data[data.rfind(b")") + 2 :].split()
    try:
        return (int(fields[11]) + int(fields[12])) / _TICK  # fields 14 and 15 of stat(5)
    except (IndexError, ValueError):
        return None


class LoaderCpu:
    """Sums the CPU time of the loader's processes and threads between step boundaries."""

    def __init__(self, proc: str = "/proc"):
        self.proc = proc
        self.available = os.path.isdir(os.path.join(proc, "self", "task"))
        self.pids: Set[int] = set()
        self._fresh: Set[int] = set()  # pids added while counting: all their CPU is the window's
        self._last: Dict[Tuple[str, object], float] = {}  # ("pid", pid) / ("thread", path)
        self._threads: Dict[str, bool] = {}  # tid -> named LOADER_THREAD_NAME
        self.total_s = 0.0
        self.steps = 0
        self.counting = False
        self.seen = False  # a loader process or thread was read at least once

    def add_workers(self, pids: Iterable[int]) -> None:
        for pid in pids:
            if isinstance(pid, int) and pid > 0 and pid not in self.pids:
                self.pids.add(pid)
                if self.counting:
                    self._fresh.add(pid)

    def _loader_threads(self):
        task = os.path.join(self.proc, "self", "task")
        try:
            tids = os.listdir(task)
        except OSError:
            return []
        out = []
        for tid in tids:
            named = self._threads.get(tid)
            if named is None:
                try:
                    with open(os.path.join(task, tid, "comm"), "rb") as f:
                        named = f.read().strip() == LOADER_THREAD_NAME.encode()
                except OSError:
                    continue
                self._threads[tid] = named
            if named:
                out.append(os.path.join(task, tid, "stat"))
        return out

    def sample(self, counting: bool) -> None:
        """Reads every loader process and thread; with counting, adds the CPU each used since
        the previous sample (a process first seen while counting: all of its CPU) and counts a
        step. A process or thread that ended between two samples loses its last interval."""
        if not self.available:
            return
        now: Dict[Tuple[str, object], float] = {}
        for pid in self.pids:
            v = stat_cpu_s(os.path.join(self.proc, str(pid), "stat"))
            if v is not None:
                now[("pid", pid)] = v
        for path in self._loader_threads():
            v = stat_cpu_s(path)
            if v is not None:
                now[("thread", path)] = v
        if counting and self.counting:
            for key, v in now.items():
                before = self._last.get(key)
                if before is None and key[0] == "pid" and key[1] in self._fresh:
                    before = 0.0
                if before is not None:
                    self.total_s += max(v - before, 0.0)
            self.steps += 1
        self.seen = self.seen or bool(now)
        self._last = now
        self._fresh.clear()
        self.counting = counting

    def per_step_s(self) -> Optional[float]:
        """The loader's CPU seconds per counted step; None when not measured: no /proc, no
        counted step, or no loader process or thread seen (a loader in the main thread costs
        the step's own time, not other cores; another library's threads are not known)."""
        if not self.available or self.steps == 0 or not self.seen:
            return None
        return self.total_s / self.steps
