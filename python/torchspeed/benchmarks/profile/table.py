"""The profile benchmark's table: rows of every section (median, IQR, unit, a note), printed as
one table and written as the JSON's rows; the targets each row is judged against."""

from __future__ import annotations

import statistics
from typing import Dict, List, Sequence

# Targets (shared/research/profiler.md §5): C1, C2, C3, C5.
TARGET_CPP_OFF_NS = 2.0
TARGET_CPP_ON_NS = 30.0
TARGET_PY_ON_NS = 600.0
TARGET_STEP10_PCT = 1.0
TARGET_STEP1_PCT = 3.0


def median_iqr(xs: Sequence[float]):
    xs = sorted(xs)
    if len(xs) < 2:
        return xs[0], 0.0, xs[0], xs[0]
    q = statistics.quantiles(xs, n=4, method="inclusive")
    return statistics.median(xs), q[2] - q[0], q[0], q[2]


def verdict(value: float, target: float) -> str:
    return "met" if value <= target else "MISSED"


class Table:
    """Rows of every section; printed as one table, written as the JSON's rows."""

    def __init__(self):
        self.rows: List[Dict] = []

    def add(self, group: str, label: str, median: float, unit: str, **extra) -> Dict:
        row = {"group": group, "label": label, "median": median, "unit": unit, **extra}
        self.rows.append(row)
        print(f"  {group:<22} {label:<52} {_fmt(median):>10} {unit}", flush=True)
        return row

    def format(self, header: str) -> str:
        head = (
            f"{'group':<22} {'measurement':<52} {'median':>10} {'IQR':>8} {'unit':<8} {'note':<s}"
        )
        lines = [header, head, "-" * 128]
        last = None
        for r in self.rows:
            if last is not None and r["group"] != last:
                lines.append("")
            last = r["group"]
            iqr = _fmt(r["iqr"]) if r.get("iqr") is not None else "-"
            lines.append(
                f"{r['group']:<22} {r['label']:<52} {_fmt(r['median']):>10} {iqr:>8} "
                f"{r['unit']:<8} {r.get('note', '')}"
            )
        return "\n".join(lines)


def _fmt(x) -> str:
    if x is None:
        return "-"
    if isinstance(x, str):
        return x
    ax = abs(x)
    if ax >= 1000:
        return f"{x:,.0f}"
    if ax >= 100:
        return f"{x:.1f}"
    if ax >= 10:
        return f"{x:.2f}"
    return f"{x:.3f}" if ax < 1 else f"{x:.2f}"
