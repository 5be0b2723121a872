"""The demo's path flags checked before it runs: `--out` and `--data-dir` must name folders this
process can write (argparse's one-line error, exit status 2, instead of a traceback mid-run)."""

from __future__ import annotations

import argparse
from typing import List, Optional

from .._cli_args import output_folder

PATH_FLAGS = ("--out", "--data-dir")


def check_path_flags(parser: argparse.ArgumentParser, argv: Optional[List[str]]) -> None:
    """Exits with `parser`'s (the demo's) usage error when a path flag names a file or an unwritable
    place; returns quietly otherwise (every other flag is the demo parser's)."""
    import sys

    argv = sys.argv[1:] if argv is None else list(argv)
    ap = argparse.ArgumentParser(add_help=False, exit_on_error=False)
    for flag in PATH_FLAGS:
        ap.add_argument(flag, default=None)
    try:
        args, _ = ap.parse_known_args(argv)
    except argparse.ArgumentError:  # a flag without its value: the demo's own parser says so
        return
    for flag in PATH_FLAGS:
        value = getattr(args, flag[2:].replace("-", "_"))
        if value is None:
            continue
        try:
            output_folder(value)
        except argparse.ArgumentTypeError as e:
            parser.error(f"argument {flag}: {e}")
