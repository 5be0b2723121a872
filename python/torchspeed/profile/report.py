"""The human-facing outputs of a profiled run: the end-of-run table, the numbered findings, a PNG of
the phases per step and TensorBoard scalars. matplotlib and tensorboard are optional: without them
write_png / write_tensorboard warn and return, and the text outputs need neither.

    print(format_summary(summarize(history)))
    print(format_findings(findings))
    write_png(history, "step_profile.png")
    write_tensorboard(history, "runs/profile")
"""

from __future__ import annotations

import math
import os
import statistics
import textwrap
import warnings
from typing import List, Optional, Sequence

from .._atomic import atomic_write
from .summary import PHASES, Finding, StepHistory, StepSummary

#: Width of the share bar at 100 %, in characters.
_BAR_WIDTH = 20
#: Partial blocks for the bar's last character, in eighths (index 0 = nothing).
_EIGHTHS = " ▏▎▍▌▋▊▉"
#: Steps above which the PNG stacks areas instead of bars (bars thinner than a pixel turn to mush).
_MAX_BARS = 200
#: Steps in the rolling median of the throughput panel (fewer when the history is shorter).
_THROUGHPUT_WINDOW = 20


def _table(header: Sequence[str], rows: Sequence[Sequence[str]], left: int = 1) -> List[str]:
    """Lines of a plain-text table: the first ``left`` columns left-aligned, the others (numbers)
    right-aligned, each column as wide as its widest cell, a rule under the header. A cell past
    the header's length (a trailing marker or bar) is appended as is."""
    n = len(header)
    widths = [max([len(header[i])] + [len(r[i]) for r in rows]) for i in range(n)]

    def line(cells: Sequence[str]) -> str:
        out = [
            c.ljust(widths[i]) if i < left else c.rjust(widths[i]) for i, c in enumerate(cells[:n])
        ]
        return "  ".join(out + list(cells[n:])).rstrip()

    head = line(header)
    return [head, "-" * len(head)] + [line(r) for r in rows]


def _ms(seconds: float) -> str:
    """Milliseconds with three decimals: one fixed format keeps the table's decimal points aligned
    and shows tens of microseconds (a CPU step can be under a millisecond)."""
    return f"{1e3 * seconds:.3f}"


def _round_shares(shares: Sequence[float], decimals: int = 1) -> List[float]:
    """Percentages rounded to ``decimals`` places that add up to what the shares add up to.

    Rounding each share on its own can make the column add to 99.9 or 100.1 (three phases at a
    third each print 33.3 + 33.3 + 33.3 = 99.9; 49.96 + 49.96 + 0.08 prints 50.0 + 50.0 + 0.1 =
    100.1: each row's half a unit of error adds up). Largest remainder instead: every share is cut down to its
    unit, then the units still missing go to the shares that lost the most in the cut. Each printed
    value is still its true value rounded down or up (off by less than one unit), and the column
    adds to exactly 100.0 when the shares add to 1.
    """
    unit = 10**decimals
    scaled = [100.0 * unit * max(s, 0.0) for s in shares]
    floors = [math.floor(x) for x in scaled]
    missing = round(sum(scaled)) - sum(floors)
    by_remainder = sorted(range(len(scaled)), key=lambda i: floors[i] - scaled[i])
    for i in by_remainder[: max(missing, 0)]:
        floors[i] += 1
    return [f / unit for f in floors]


def _bar(fraction: float, width: int = _BAR_WIDTH) -> str:
    """A text bar of ``fraction`` of ``width`` characters, to an eighth of a character."""
    eighths = round(min(max(fraction, 0.0), 1.0) * width * 8)
    full, part = divmod(eighths, 8)
    return ("█" * full + _EIGHTHS[part]).rstrip()


def format_summary(summary: StepSummary) -> str:
    """The end-of-run table: median, p90 and share of the step for each phase, then the step.

    With the per-rank summaries of a distributed run (``summary.ranks``, 2 ranks or more), a
    second table gives each rank's step median and phase medians and marks the slowest rank.
    """
    if summary.steps == 0:
        return "torchspeed.profile: no steps summarized"
    clock = "CUDA events" if summary.clock == "cuda" else "host"
    steps = f"{summary.steps} step" + ("s" if summary.steps != 1 else "")
    head = f"torchspeed.profile: {steps} summarized, clock: {clock}"
    if summary.world_size > 1:
        head += f", rank {summary.rank} of {summary.world_size}"
    if summary.samples_per_s is not None:
        head += f", {summary.samples_per_s:.1f} samples/s"
    lines = [head]
    if summary.dropped_events > 0:
        lines.append(
            f"WARNING: {summary.dropped_events} dropped events (the recorder's ring was full): "
            "the trace is partial"
        )
    shares = _round_shares([summary.phases[p].share for p in PHASES])
    rows = [
        [
            p,
            _ms(summary.phases[p].median_s),
            _ms(summary.phases[p].p90_s),
            f"{pct:.1f} %",
            _bar(summary.phases[p].share),
        ]
        for p, pct in zip(PHASES, shares)
    ]
    rows.append(["step", _ms(summary.step_median_s), _ms(summary.step_p90_s), "100.0 %"])
    lines += [""] + _table(["phase", "median ms", "p90 ms", "share"], rows)
    if summary.ranks is not None and len(summary.ranks) >= 2:
        lines += [""] + _format_ranks(summary.ranks)
    return "\n".join(lines)


def _format_ranks(ranks: Sequence[StepSummary]) -> List[str]:
    """Each rank's step median and phase medians (ms); the slowest rank (by step median) marked:
    in a synchronous data-parallel run the others wait for it in their comm phase."""
    slowest = max(range(len(ranks)), key=lambda r: ranks[r].step_median_s)
    rows = []
    for r, s in enumerate(ranks):
        row = [str(r), _ms(s.step_median_s)] + [_ms(s.phases[p].median_s) for p in PHASES]
        if r == slowest:
            row.append("← slowest")
        rows.append(row)
    return ["median ms per rank"] + _table(["rank", "step"] + list(PHASES), rows)


def _pct(x: float) -> str:
    """A percentage to two significant figures or so: 45, 8.5, 0.4."""
    return f"{x:.0f}" if abs(x) >= 10 else f"{x:.1f}"


def _ms_short(seconds: float) -> str:
    """Milliseconds to about three significant figures (an estimate claims no more)."""
    ms = 1e3 * seconds
    if ms >= 100:
        return f"{ms:.0f}"
    if ms >= 10:
        return f"{ms:.1f}"
    if ms >= 1:
        return f"{ms:.2f}"
    return f"{ms:.3f}"


def format_findings(findings: List[Finding]) -> str:
    """The doctor's findings, numbered in the order given: severity, title, fix, the detail when
    there is one, and the estimated step time when the finding has one."""
    if not findings:
        return "no findings"
    lines = []
    for i, f in enumerate(findings, 1):
        lines.append(f"{i:>2}. [{f.severity}] {f.title}")
        lines.append(f"    fix: {f.fix}")
        if f.detail:
            lines += textwrap.wrap(
                f.detail, width=100, initial_indent="    ", subsequent_indent="    "
            )
        if f.est_step_s is not None:
            # Finding holds the estimate and the gain; the step it starts from is their sum.
            now = f.est_step_s + f.est_gain_s
            cut = 100.0 * f.est_gain_s / now if now > 0 else 0.0
            lines.append(
                f"    step ~{_ms_short(now)} ms → ~{_ms_short(f.est_step_s)} ms (−{_pct(cut)}%)"
            )
    return "\n".join(lines)


def _phase_colors() -> dict:
    """One color per phase, fixed by the phase's place in PHASES, so a phase looks the same in
    every PNG; "other" in grey (it is what no phase covered)."""
    palette = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#7f7f7f"]
    return dict(zip(PHASES, palette))


def _rolling_median(values: Sequence[float], window: int) -> List[float]:
    """Median of each value and the ``window - 1`` before it (fewer at the start)."""
    return [statistics.median(values[max(0, i - window + 1) : i + 1]) for i in range(len(values))]


def _seconds_since_first(history: StepHistory) -> List[float]:
    """x of the throughput panel: each step's end since the first step's end, in seconds. Without
    one end time per step (a hand-built history), the running sum of the step times stands in."""
    n = len(history)
    if len(history.end_ns) == n:
        t0 = history.end_ns[0]
        return [(t - t0) / 1e9 for t in history.end_ns]
    out, t = [], 0.0
    for s in history.step_ns[1:]:
        t += s / 1e9
        out.append(t)
    return [0.0] + out


def _samples_known(history: StepHistory) -> bool:
    """Every step's batch size is known (summarize's rule for samples/s)."""
    return len(history.samples) == len(history) and all(x > 0 for x in history.samples)


def describe_step_source(facts) -> str:
    """One line saying what ended each step (RunFacts.step_source), or "" when unknown."""
    source = getattr(facts, "step_source", "")
    closures = float(getattr(facts, "closure_forwards_per_step", 0.0) or 0.0)
    if source == "optimizer":
        names = sorted({type(o).__name__ for o in getattr(facts, "optimizers", []) or []})
        line = f"steps: each {'/'.join(names) or 'optimizer'}.step() ended a step"
        if closures >= 1:
            line += f" ({closures:.1f} forwards of the model per step in its closure)"
        return line
    if source == "backward":
        return (
            "steps: no optimizer step was seen; each forward (or batch fetch) after a backward "
            "ended a step (a loop that updates the weights itself)"
        )
    if source == "forward":
        return (
            "steps: no optimizer step and no backward were seen; each forward of the top module "
            "ended a step"
        )
    return ""


def describe_page_faults(facts) -> str:
    """One line with this process's minor page faults and system time a step (the malloc rule's
    facts), or "" when not measured."""
    pf = getattr(facts, "page_faults", None)
    if not pf:
        return ""
    return (
        f"this process: {pf[0]:,.0f} minor page faults and {1e3 * pf[1]:.1f} ms of system time "
        "a step (medians over the steps the table keeps)"
    )


def _png_path(path) -> str:
    """The file write_png writes: matplotlib adds ``.png`` to a name without a suffix, so that
    is the path returned; "" and folders (which matplotlib turns into ``.png``/``<dir>.png``)
    are refused."""
    name = "torchspeed.profile.write_png"
    if not isinstance(path, (str, os.PathLike)):
        raise TypeError(f"{name}: path must be a str or os.PathLike, got {type(path).__name__}")
    path = os.fsdecode(os.fspath(path))
    if not path or path.endswith(("/", os.sep)) or os.path.isdir(path):
        raise ValueError(f"{name}: path must name a file, got {path!r}")
    if not os.path.splitext(path)[1]:
        path += ".png"
    return path


def write_png(history: StepHistory, path, title: Optional[str] = None) -> Optional[str]:
    """A PNG of the run: the phases of each step stacked (ms), and the throughput over time
    (samples/s when every batch size is known, else steps/s; a rolling median of the steps).

    Draws on its own Figure with the Agg canvas: the user's pyplot backend and open figures are
    left alone. Returns the path written (``.png`` is added to a name without a suffix, as
    matplotlib does), or None with a warning when matplotlib is missing or the history has no
    steps. An empty path or an existing folder is refused (ValueError) before anything is drawn.
    """
    path = _png_path(path)
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError as e:
        warnings.warn(
            f"torchspeed.profile: no PNG written, matplotlib is missing ({e})", stacklevel=2
        )
        return None
    n = len(history)
    if n == 0:
        warnings.warn("torchspeed.profile: no PNG written, the history has no steps", stacklevel=2)
        return None

    fig = Figure(figsize=(11, 7.5), layout="constrained")
    FigureCanvasAgg(fig)
    ax_phase, ax_rate = fig.subplots(2, 1)
    colors = _phase_colors()
    # Step numbers count the steps the bounded window already let go.
    x = list(range(history.steps_dropped, history.steps_dropped + n))
    ms = {p: [v / 1e6 for v in history.phase_ns[p]] for p in PHASES}
    if n <= _MAX_BARS:
        bottom = [0.0] * n
        for p in PHASES:
            ax_phase.bar(x, ms[p], width=1.0, bottom=bottom, color=colors[p], label=p)
            bottom = [b + v for b, v in zip(bottom, ms[p])]
    else:
        ax_phase.stackplot(
            x, *[ms[p] for p in PHASES], labels=list(PHASES), colors=[colors[p] for p in PHASES]
        )
    ax_phase.set_xlabel("step")
    ax_phase.set_ylabel("ms")
    ax_phase.set_xlim(x[0] - 0.5, x[-1] + 0.5)
    ax_phase.set_title(f"phases per step ({'CUDA events' if history.clock == 'cuda' else 'host'})")
    # Legend top to bottom in the order the phases stack, bottom phase last.
    handles, labels = ax_phase.get_legend_handles_labels()
    ax_phase.legend(
        handles[::-1], labels[::-1], loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize="small"
    )

    t = _seconds_since_first(history)
    step_s = [max(v, 1) / 1e9 for v in history.step_ns]  # a 0 ns step would divide by zero
    if _samples_known(history):
        rate = [b / s for b, s in zip(history.samples, step_s)]
        unit = "samples/s"
    else:
        rate = [1.0 / s for s in step_s]
        unit = "steps/s"
    window = max(1, min(_THROUGHPUT_WINDOW, n))
    ax_rate.plot(t, rate, color="#bbbbbb", linewidth=0.8, label="per step")
    ax_rate.plot(t, _rolling_median(rate, window), color="#1f77b4", label=f"median of {window}")
    ax_rate.set_xlabel("seconds since the first step")
    ax_rate.set_ylabel(unit)
    ax_rate.set_ylim(bottom=0)
    ax_rate.set_title(f"throughput ({unit}, rolling median of {window} steps)")
    ax_rate.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize="small")

    fig.suptitle(title or f"torchspeed.profile: {n} steps")
    parent = os.path.dirname(os.path.abspath(path))
    os.makedirs(parent, exist_ok=True)
    # To exactly `path` (savefig on a name would add ".png" to one without a suffix), atomically.
    atomic_write(
        path, lambda f: fig.savefig(f, format="png", dpi=100), who="torchspeed.profile.write_png"
    )
    return path


def write_tensorboard(history: StepHistory, logdir, tag_prefix: str = "torchspeed/step") -> bool:
    """TensorBoard scalars for each step of the history: ``{prefix}/step_ms``, ``{prefix}/<phase>_ms``
    and ``{prefix}/<phase>_share`` (the phase's fraction of that step, 0 to 1). global_step is the
    step's index in the run, counting the steps the bounded window let go (``steps_dropped``), so
    histories written one after another line up. Returns False with a warning when tensorboard is
    missing or the history has no steps.
    """
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError as e:
        warnings.warn(
            f"torchspeed.profile: no TensorBoard scalars written, tensorboard is missing ({e})",
            stacklevel=2,
        )
        return False
    n = len(history)
    if n == 0:
        warnings.warn(
            "torchspeed.profile: no TensorBoard scalars written, the history has no steps",
            stacklevel=2,
        )
        return False
    writer = SummaryWriter(log_dir=os.fspath(logdir))
    try:
        for i in range(n):
            step = history.steps_dropped + i
            total = history.step_ns[i]
            writer.add_scalar(f"{tag_prefix}/step_ms", total / 1e6, step)
            for p in PHASES:
                v = history.phase_ns[p][i]
                writer.add_scalar(f"{tag_prefix}/{p}_ms", v / 1e6, step)
                writer.add_scalar(f"{tag_prefix}/{p}_share", v / total if total > 0 else 0.0, step)
    finally:
        writer.close()
    return True
