"""The doctor: profile a training run with torch's hooks installed, then print the step
breakdown and ranked advice (and write the trace, a PNG and a JSON summary).

    with torchspeed.profile.doctor(steps=100):      # stops the run after 100 optimizer steps
        train()

    $ torchspeed doctor --steps 100 -- python train.py --lr 0.1   # an unmodified script
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import runpy
import sys
import traceback
from typing import Iterator, List, Optional

from .._atomic import atomic_write
from .step import StepProfiler


class StopRun(BaseException):
    """Raised inside the profiled code when the doctor has its steps (a BaseException, so the
    script's ``except Exception`` does not swallow it)."""


def _rank() -> int:
    try:
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            return dist.get_rank()
    except ImportError:
        pass
    return 0


class _Progress:
    """A tqdm bar over the steps on stderr when tqdm is installed, else a line every 10 steps."""

    def __init__(self, total: Optional[int], enabled: bool):
        self.bar = None
        self.n = 0
        self.enabled = enabled and _rank() == 0
        if not self.enabled:
            return
        try:
            from tqdm import tqdm

            self.bar = tqdm(
                total=total, desc="torchspeed doctor", unit="step", file=sys.stderr, leave=False
            )
        except ImportError:
            self.bar = None
        self.total = total

    def update(self) -> None:
        self.n += 1
        if not self.enabled:
            return
        if self.bar is not None:
            self.bar.update(1)
        elif self.n % 10 == 0:
            of = f"/{self.total}" if self.total else ""
            print(f"torchspeed doctor: step {self.n}{of}", file=sys.stderr, flush=True)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def write_outputs(
    prof: StepProfiler, out: str, summary=None, trace: bool = True, png: bool = True
) -> dict:
    """Writes report.txt, summary.json, trace[_rankN].json and steps.png under ``out``; returns
    {kind: path}. Every rank writes its trace; rank 0 the rest. Without ``summary`` it calls
    ``prof.summary()``, a collective in distributed runs."""
    if summary is None:
        summary = prof.summary()
    rank = summary.rank
    os.makedirs(out, exist_ok=True)
    paths = {}
    if trace:
        name = "trace.json" if summary.world_size == 1 else f"trace_rank{rank}.json"
        paths["trace"] = prof.export_chrome_trace(os.path.join(out, name))
    if rank != 0:
        return paths
    text = prof.report(summary)
    paths["report"] = os.path.join(out, "report.txt")
    atomic_write(paths["report"], text + "\n", who="torchspeed.profile.doctor")
    paths["summary"] = os.path.join(out, "summary.json")
    d = dataclasses.asdict(summary)
    d["findings"] = [dataclasses.asdict(x) for x in prof.advice(summary)]
    atomic_write(
        paths["summary"], json.dumps(d, indent=1, default=str), who="torchspeed.profile.doctor"
    )
    if png:
        p = prof.write_png(os.path.join(out, "steps.png"))
        if p:
            paths["png"] = p
    return paths


@contextlib.contextmanager
def doctor(
    steps: Optional[int] = None,
    *,
    out: Optional[str] = "torchspeed_doctor",
    device: Optional[str] = None,
    warmup: int = 1,
    trace: bool = True,
    png: bool = True,
    progress: bool = True,
    file=None,
    then: str = "stop",
    probe: bool = True,
) -> Iterator[StepProfiler]:
    """Profiles the block with torch's hooks and prints the breakdown, where the time goes inside
    forward and backward, and the advice to ``file`` (stdout), writing them to ``out`` too (None:
    print only).

    Steps end at each step of the first optimizer; in a loop without one, at the first forward
    or batch fetch after a backward (a manual update), else at each forward of the top module
    (the report says which). ``steps``: after that many steps, ``then="stop"`` stops the block
    (StopRun, caught here) and ``then="continue"`` stops profiling, reports at once and lets the
    block run on, unprofiled. An error in the doctor's own code is reported on stderr and ends
    the profiling, never the block.
    """
    if steps is not None and (isinstance(steps, bool) or not isinstance(steps, int) or steps < 1):
        raise ValueError(
            f"torchspeed.profile.doctor: steps must be an int >= 1 or None, got {steps!r}"
        )
    if then not in ("stop", "continue"):
        raise ValueError(
            f"torchspeed.profile.doctor: then must be 'stop' or 'continue', got {then!r}"
        )
    created = False
    if out is not None:
        # Before the run, so an unwritable folder fails now rather than after the training.
        created = not os.path.exists(out)
        os.makedirs(out, exist_ok=True)
    prof = StepProfiler(
        hooks=True, step_on="auto", device=device, warmup=warmup, attribute=True, probe=probe
    )
    bar = _Progress(steps, progress)
    stream = file or sys.stdout
    finished = []

    def finish() -> None:
        """Stops profiling and reports, once (at the step limit, or when the block ends)."""
        if finished:
            return
        finished.append(True)
        bar.close()
        prof.stop()
        try:
            _report(prof, out, created, stream, trace=trace, png=png)
        except Exception as e:  # noqa: BLE001 (the doctor's failure must not be the script's)
            print(
                f"torchspeed doctor: could not write the report ({type(e).__name__}: {e})",
                file=sys.stderr,
                flush=True,
            )

    def on_step(p: StepProfiler) -> None:
        bar.update()
        # Steps taken on the host: on CUDA, history() lags until the step's events resolve.
        if steps is not None and p.steps_taken >= steps:
            if then == "stop":
                raise StopRun()
            finish()

    prof._on_step.append(on_step)
    try:
        with prof:
            yield prof
    except StopRun as e:
        # The stopped frames never resume: their locals are freed now, before the report's
        # probes run. Kept by this traceback, the demo's loader and its two persistent worker
        # processes, still decoding the batches they prefetch, ran beside the probe.
        traceback.clear_frames(e.__traceback__)
    finally:
        finish()


def _report(prof: StepProfiler, out, created: bool, stream, trace: bool, png: bool) -> None:
    if prof.steps_taken == 0:
        print(
            "torchspeed doctor: no step was seen (no optimizer step, and too few iterations of "
            "forward and backward to tell the loop's steps), nothing to report",
            file=stream,
        )
        if out is not None and created and not os.listdir(out):
            os.rmdir(out)
        return
    summary = prof.summary()  # every rank: gathers the ranks' summaries on rank 0
    if summary.rank == 0:
        print(prof.report(summary), file=stream, flush=True)  # first: files may fail
    if out is not None:
        paths = write_outputs(prof, out, summary, trace=trace, png=png)
        if summary.rank == 0:
            print("\nwritten: " + ", ".join(f"{k} {v}" for k, v in paths.items()), file=stream)


# Interpreter options that take a value (`-W error`, `-X dev`); the doctor runs the script in its
# own interpreter, so these are accepted and not applied (the rest are single flags like -u).
_PY_OPTS_WITH_VALUE = ("-W", "-X")


def _script_argv(argv: List[str]) -> List[str]:
    """Drops a leading python interpreter and its options: `python -u train.py` -> `train.py`."""
    if not argv or not os.path.basename(argv[0]).startswith("python") or argv[0].endswith(".py"):
        return argv
    rest = argv[1:]
    while rest and rest[0].startswith("-") and rest[0] != "-m":
        if rest[0] == "-c":
            raise ValueError(
                "torchspeed doctor: python -c is not supported; put the code in a script"
            )
        if rest[0] in _PY_OPTS_WITH_VALUE:
            rest = rest[2:]
        else:
            rest = rest[1:]
    return rest


def check_command(argv: List[str]) -> List[str]:
    """The command to run, as run() reads it (``[python [options]] script.py ARGS`` or
    ``[python] -m module ARGS``), checked before anything is installed: returns it without the
    interpreter; raises ValueError (no command, ``-c``, ``-m`` without a name),
    FileNotFoundError (no such script) or ModuleNotFoundError (no such module)."""
    argv = _script_argv(list(argv))
    if not argv:
        raise ValueError(
            "torchspeed doctor: give the training command after --, e.g. -- python train.py"
        )
    if argv[0] == "-m":
        if len(argv) < 2:
            raise ValueError("torchspeed doctor: -m needs a module name")
        import importlib.util

        sys.path.insert(0, os.getcwd())
        try:
            found = importlib.util.find_spec(argv[1]) is not None
        except (ImportError, ValueError):
            found = False
        finally:
            sys.path.pop(0)
        if not found:
            raise ModuleNotFoundError(f"torchspeed doctor: no module named {argv[1]!r}")
    elif not os.path.isfile(argv[0]):
        raise FileNotFoundError(f"torchspeed doctor: no such script: {argv[0]}")
    return argv


def run(argv: List[str], **kwargs) -> int:
    """Runs ``argv`` (``[python [options]] script.py ARGS`` or ``[python] -m module ARGS``) in
    this process under ``doctor(**kwargs)``; returns the script's exit status. An exception from
    the script propagates after the report."""
    # Resolved before profiling starts: a typo fails at once, with nothing installed.
    argv = check_command(argv)
    status = 0
    try:
        with doctor(**kwargs):
            status = _execute(argv)
    except KeyboardInterrupt:
        status = 130
    return status


def print_script_error(e: BaseException, file=None) -> None:
    """The traceback of an exception the script raised, as ``python script.py`` prints it: the
    frames of the doctor and of runpy that ran the script are left out (all of them kept when the
    error is the doctor's own)."""
    import traceback

    ours = (
        os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
        os.path.abspath(runpy.__file__),
    )
    tb = e.__traceback__
    while tb is not None:
        name = tb.tb_frame.f_code.co_filename
        if not (name.startswith(ours) or name == "<frozen runpy>"):
            break
        tb = tb.tb_next
    traceback.print_exception(type(e), e, tb if tb is not None else e.__traceback__, file=file)


def _execute(argv: List[str]) -> int:
    """Runs the checked command as __main__ in this process; returns its exit status (an
    exception propagates). sys.argv and sys.path are restored after."""
    status = 0
    saved_argv, saved_path = sys.argv, list(sys.path)
    try:
        if argv[0] == "-m":
            sys.argv = [argv[1]] + argv[2:]
            sys.path.insert(0, os.getcwd())
            runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
        else:
            sys.argv = argv
            sys.path.insert(0, os.path.dirname(os.path.abspath(argv[0])))
            runpy.run_path(argv[0], run_name="__main__")
    except SystemExit as e:
        code = e.code
        if isinstance(code, int):
            status = code
        elif code is None:
            status = 0
        else:  # sys.exit("message"): Python prints it and exits with 1
            print(code, file=sys.stderr)
            status = 1
    finally:
        sys.argv, sys.path[:] = saved_argv, saved_path
    return status


def verify_script(argv: List[str], steps: int = 8, warmup: int = 1, rounds: int = 1) -> tuple:
    """The rows of ``torchspeed doctor --verify`` (verify.VerifyRow: the script as it is, then
    one per fix that applies) and the first failing run's exit status (0 when none failed)."""
    import io

    from .verify import losses_recorded, verify

    argv = check_command(argv)
    failed: List[int] = []

    def run_steps(ctx, advise):
        losses: List[float] = []
        with ctx, losses_recorded(losses), contextlib.redirect_stdout(io.StringIO()):
            with doctor(
                steps=steps,
                out=None,
                progress=False,
                file=io.StringIO(),
                warmup=warmup,
                probe=advise,
            ) as prof:
                code = _execute(argv)
                if code:
                    failed.append(code)
        s = prof.summary(gather=False)
        if not advise:
            return s, losses, [], None
        return s, losses, prof.advice(s), prof.facts()

    rows = verify(run_steps, rounds=rounds)
    return rows, (failed[0] if failed else 0)


def run_verify(argv: List[str], steps: int = 8, warmup: int = 1, file=None, rounds: int = 1) -> int:
    """``torchspeed doctor --verify``: runs the script's first ``steps`` steps as it is, then
    again with each fix that applies (verify.py), and prints each fix's measured gain beside the
    estimate and the loss drift. The script's stdout during these runs is dropped (it runs
    several times); returns 0, or the first failing run's exit status."""
    from .verify import format_rows

    stream = file or sys.stdout
    rows, failed = verify_script(argv, steps=steps, warmup=warmup, rounds=rounds)
    if failed:
        print(f"torchspeed doctor --verify: the script exited with {failed}", file=stream)
        return failed
    print(format_rows(rows, steps, rounds), file=stream, flush=True)
    return 0
