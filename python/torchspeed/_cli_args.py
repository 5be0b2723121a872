"""argparse types shared by the command-line tools (`torchspeed doctor`, `torchspeed demo`): a bad
value becomes argparse's one-line usage error with exit status 2, never a traceback; and the quiet
end of a command whose output reader has gone."""

from __future__ import annotations

import argparse
import os
import sys


def output_folder(value: str) -> str:
    """A folder this process can write into: an existing folder, or one that can be created (its
    nearest existing ancestor is a writable folder). Returns the value unchanged."""
    if not value:
        raise argparse.ArgumentTypeError("must be a folder path, got ''")
    path = os.path.abspath(value)
    if os.path.exists(path) and not os.path.isdir(path):
        raise argparse.ArgumentTypeError(f"must be a folder, got a file: {value}")
    probe = path
    while not os.path.exists(probe):
        parent = os.path.dirname(probe)
        if parent == probe:
            break
        probe = parent
    if not os.path.isdir(probe):
        raise argparse.ArgumentTypeError(
            f"cannot be created: {probe} is a file, not a folder (in {value})"
        )
    if not os.access(probe, os.W_OK | os.X_OK):
        raise argparse.ArgumentTypeError(f"is not writable: {probe} (in {value})")
    return value


def int_at_least(low: int):
    """An int >= low (``type=int_at_least(0)``)."""

    def parse(value: str) -> int:
        try:
            n = int(value)
        except ValueError:
            raise argparse.ArgumentTypeError(f"must be an int >= {low}, got {value!r}") from None
        if n < low:
            raise argparse.ArgumentTypeError(f"must be an int >= {low}, got {n}")
        return n

    parse.__name__ = f"int >= {low}"
    return parse


def quiet_broken_pipe() -> None:
    """stdout's reader has gone: point stdout at /dev/null, so that Python's flush at exit does
    not print a second BrokenPipeError."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):
        pass
    finally:
        os.close(devnull)
