"""The one progress bar of torchspeed's long operations (write_shards, the demo's dataset and
training runs): a tqdm bar on stderr, or an object with the same methods that draws nothing."""

from __future__ import annotations

import sys


class _NoBar:
    """What progress_bar returns when no bar is drawn: tqdm's methods, doing nothing."""

    def update(self, n: int = 1) -> None:
        pass

    def set_postfix(self, *args, **kwargs) -> None:
        pass

    def set_postfix_str(self, s: str = "") -> None:
        pass

    def close(self) -> None:
        pass


def progress_bar(
    total: int, desc: str, unit: str, enabled: bool = True, terminal_only: bool = False
):
    """A tqdm bar of ``total`` ``unit``s on stderr, or a bar that draws nothing when ``enabled`` is
    false or tqdm is missing. ``terminal_only``: none when stderr is a file or a pipe."""
    if not enabled:
        return _NoBar()
    try:
        from tqdm import tqdm  # a dependency; an environment without it just gets no bar
    except ImportError:
        return _NoBar()
    return tqdm(
        total=total,
        desc=desc,
        unit=unit,
        file=sys.stderr,
        dynamic_ncols=True,
        disable=None if terminal_only else False,
    )
