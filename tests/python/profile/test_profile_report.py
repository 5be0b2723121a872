"""The profiler's human-facing outputs (torchspeed.profile.report) on hand-built histories with
known numbers: the summary table and findings read back from their text, the PNG opened with
Pillow, the TensorBoard scalars read back from the event file."""

import os
import random
import re
import subprocess
import sys

import numpy as np
import pytest

from torchspeed.profile import PHASES, Finding, StepHistory, summarize
from torchspeed.profile.report import (
    _round_shares,
    format_findings,
    format_summary,
    write_png,
    write_tensorboard,
)

# The table prints milliseconds with three decimals: a printed value is within half a unit of the
# last place (0.0005 ms) of the true one; the extra 1e-9 absorbs float noise in the comparison.
MS_TOL = 0.0005 + 1e-9
# Shares print with one decimal and are rounded by largest remainder: each is within one unit of
# the last place (0.1 %) of its true value.
SHARE_TOL = 0.1 + 1e-9


def make_history(n, seed=0, samples=True, clock="host", dropped=0, scale=1.0):
    """n steps whose phases are random whole microseconds (all phases > 0), steps their sums,
    end_ns the running sum of the steps from an arbitrary clock origin."""
    rng = random.Random(seed)
    h = StepHistory(clock=clock, steps_dropped=dropped)
    t = 123_456_789_000
    for _ in range(n):
        total = 0
        for j, p in enumerate(PHASES):
            v = int(scale * rng.randint(50, 3000) * (j + 1)) * 1000
            h.phase_ns[p].append(v)
            total += v
        h.step_ns.append(total)
        t += total
        h.end_ns.append(t)
        h.samples.append(rng.randint(16, 64) if samples else 0)
    return h


def expected(h):
    """Median / p90 (ms) of each phase and of the step, and each phase's share (%), computed with
    numpy (linear quantiles) independently of summarize()."""
    out = {}
    for name, vals in [(p, h.phase_ns[p]) for p in PHASES] + [("step", h.step_ns)]:
        ms = np.asarray(vals, dtype=np.float64) / 1e6
        share = 100.0 * sum(vals) / sum(h.step_ns)
        out[name] = (float(np.quantile(ms, 0.5)), float(np.quantile(ms, 0.9)), share)
    return out


ROW = re.compile(r"^(\w+)\s+(\d+\.\d+)\s+(\d+\.\d+)\s+(\d+\.\d+) %", re.M)


def parse_table(text):
    return {m[1]: (float(m[2]), float(m[3]), float(m[4])) for m in ROW.finditer(text)}


def parse_ranks(text):
    """{rank: ([step, *phase medians in ms], slowest?)} from the per-rank table."""
    rows = {}
    part = text.split("median ms per rank", 1)[1]
    for line in part.splitlines():
        m = re.match(r"^(\d+)\s+((?:\d+\.\d+\s*)+)(← slowest)?$", line)
        if m:
            rows[int(m[1])] = ([float(x) for x in m[2].split()], m[3] is not None)
    return rows


# --- format_summary ----------------------------------------------------------------------------


@pytest.mark.parametrize("n", [1, 2, 10, 57])
def test_summary_prints_medians_p90_and_shares_of_every_phase_and_the_step(n):
    h = make_history(n, seed=n)
    text = format_summary(summarize(h))
    got = parse_table(text)
    want = expected(h)
    assert list(got) == list(PHASES) + ["step"]
    for name in PHASES:
        med, p90, share = got[name]
        assert med == pytest.approx(want[name][0], abs=MS_TOL), name
        assert p90 == pytest.approx(want[name][1], abs=MS_TOL), name
        assert share == pytest.approx(want[name][2], abs=SHARE_TOL), name
    assert got["step"][0] == pytest.approx(want["step"][0], abs=MS_TOL)
    assert got["step"][1] == pytest.approx(want["step"][1], abs=MS_TOL)
    assert got["step"][2] == 100.0
    assert sum(got[p][2] for p in PHASES) == pytest.approx(100.0, abs=0.1)
    assert f"{n} step{'s' if n > 1 else ''} summarized" in text
    assert "clock: host" in text


def test_summary_shares_add_to_exactly_100_where_rounding_each_would_not():
    # Three phases at a third of the step each: rounded one by one they print 33.3 x 3 = 99.9.
    h = StepHistory()
    for _ in range(4):
        for p in PHASES:
            h.phase_ns[p].append(1_000_000 if p in ("forward", "backward", "optimizer") else 0)
        h.step_ns.append(3_000_000)
    got = parse_table(format_summary(summarize(h)))
    assert sorted(got[p][2] for p in ("forward", "backward", "optimizer")) == [33.3, 33.3, 33.4]
    # Largest remainder adds to exactly 100.0 (tolerance: float noise of the sum of seven values).
    assert sum(got[p][2] for p in PHASES) == pytest.approx(100.0, abs=1e-9)
    assert got["data_wait"][2] == 0.0


def test_round_shares_stays_within_a_unit_and_adds_up_on_random_shares():
    rng = random.Random(7)
    for _ in range(500):
        raw = [rng.random() ** 3 for _ in PHASES]
        shares = [x / sum(raw) for x in raw]
        pct = _round_shares(shares)
        assert sum(pct) == pytest.approx(100.0, abs=1e-9)
        for p, s in zip(pct, shares):
            assert abs(p - 100 * s) < 0.1 + 1e-9


def test_summary_header_shows_samples_per_s_clock_and_dropped_events():
    h = make_history(20, seed=3, clock="cuda")
    s = summarize(h)
    s.dropped_events = 17
    text = format_summary(s)
    head = text.splitlines()[0]
    assert "clock: CUDA events" in head
    m = re.search(r"(\d+\.\d) samples/s", head)
    assert m, head
    # One decimal printed: within 0.05 samples/s of the samples over the summed step time.
    assert float(m[1]) == pytest.approx(sum(h.samples) / (sum(h.step_ns) / 1e9), abs=0.05 + 1e-9)
    assert re.search(r"\b17 dropped events\b.*partial", text)


def test_summary_without_samples_or_dropped_events_says_neither():
    s = summarize(make_history(8, samples=False))
    assert s.samples_per_s is None and s.dropped_events == 0
    text = format_summary(s)
    assert "samples/s" not in text
    assert "dropped" not in text and "partial" not in text
    assert "median ms per rank" not in text


def test_summary_of_no_steps():
    assert "no steps" in format_summary(summarize(StepHistory()))


def test_per_rank_table_gives_each_ranks_medians_and_marks_the_slowest():
    # Rank 2 is the slowest: its phases are 1.5x the others'.
    hists = [make_history(30, seed=r, scale=1.5 if r == 2 else 1.0) for r in range(4)]
    ranks = [summarize(h) for h in hists]
    top = summarize(hists[0])
    top.world_size, top.ranks = 4, ranks
    text = format_summary(top)
    assert "rank 0 of 4" in text.splitlines()[0]
    rows = parse_ranks(text)
    assert sorted(rows) == [0, 1, 2, 3]
    assert [r for r, (_, slow) in rows.items() if slow] == [2]
    for r, h in enumerate(hists):
        want = expected(h)
        values, _ = rows[r]
        assert values[0] == pytest.approx(want["step"][0], abs=MS_TOL)
        for p, v in zip(PHASES, values[1:]):
            assert v == pytest.approx(want[p][0], abs=MS_TOL), (r, p)


def test_per_rank_table_needs_two_ranks():
    s = summarize(make_history(5))
    s.ranks = [summarize(make_history(5))]
    assert "median ms per rank" not in format_summary(s)


# --- format_findings ---------------------------------------------------------------------------


EST = re.compile(r"step ~(\d+(?:\.\d+)?) ms → ~(\d+(?:\.\d+)?) ms \(−(\d+(?:\.\d+)?)%\)")


def test_findings_are_numbered_with_severity_title_fix_and_estimate():
    findings = [
        Finding(
            rule="data_wait",
            severity="critical",
            title="data_wait is 40% of the step",
            fix="torchspeed.data.Loader(num_workers=8)",
            est_step_s=0.0612,
            est_gain_s=0.0408,
        ),
        Finding(
            rule="h2d",
            severity="warning",
            title="pageable host-to-device copies",
            fix="pin_memory=True",
            est_step_s=0.00475,
            est_gain_s=0.00025,
        ),
        Finding(
            rule="conv_bias_before_bn",
            severity="info",
            title="Conv2d bias before BatchNorm",
            fix="bias=False",
            kind="lint",
        ),
    ]
    text = format_findings(findings)
    lines = text.splitlines()
    assert re.match(r"^\s*1\. \[critical\] data_wait is 40% of the step$", lines[0])
    assert "fix: torchspeed.data.Loader(num_workers=8)" in lines[1]
    est = EST.findall(text)
    assert len(est) == 2  # the lint has no estimate line
    # ~3 significant figures printed: 102 ms -> 61.2 ms is -40%; 5.00 ms -> 4.75 ms is -5.0%.
    (a0, a1, a2), (b0, b1, b2) = [tuple(map(float, e)) for e in est]
    assert (a0, a1, a2) == (pytest.approx(102, abs=0.5), pytest.approx(61.2, abs=0.05), 40.0)
    assert (b0, b1) == (pytest.approx(5.00, abs=0.005), pytest.approx(4.75, abs=0.005))
    assert b2 == pytest.approx(5.0, abs=0.05)
    assert re.search(r"^\s*2\. \[warning\] pageable", text, re.M)
    assert re.search(r"^\s*3\. \[info\] Conv2d bias before BatchNorm", text, re.M)
    assert "fix: bias=False" in text


def test_no_findings():
    assert format_findings([]) == "no findings"


# --- write_png ---------------------------------------------------------------------------------


@pytest.fixture
def mpl_calls(monkeypatch):
    """Records the calls write_png makes on matplotlib's Axes (bar, stackplot, plot), passing
    them through, so the test sees which path drew the phases and the throughput line's data."""
    axes = pytest.importorskip("matplotlib.axes", reason="matplotlib is not installed")
    calls = {"bar": [], "stackplot": [], "plot": []}
    for name in calls:
        orig = getattr(axes.Axes, name)

        def spy(self, *args, _orig=orig, _name=name, **kwargs):
            calls[_name].append((args, kwargs))
            return _orig(self, *args, **kwargs)

        monkeypatch.setattr(axes.Axes, name, spy)
    return calls


def phase_pixels(path):
    """Pixels of each phase's color in the PNG (opened with Pillow)."""
    from PIL import Image

    from torchspeed.profile.report import _phase_colors

    with Image.open(path) as img:
        assert img.format == "PNG"
        assert img.mode == "RGBA"
        assert img.size == (1100, 750)  # figsize 11 x 7.5 in at 100 dpi
        counts = dict((c[:3], k) for k, c in img.getcolors(maxcolors=1 << 20))
    return {
        p: counts.get(tuple(int(c[i : i + 2], 16) for i in (1, 3, 5)), 0)
        for p, c in _phase_colors().items()
    }


@pytest.mark.parametrize("n, samples", [(12, True), (200, False), (201, True), (600, False)])
def test_png_stacks_phases_and_plots_throughput(tmp_path, mpl_calls, n, samples):
    pyplot_before = "matplotlib.pyplot" in sys.modules
    h = make_history(n, seed=n, samples=samples, dropped=40)
    path = tmp_path / "sub" / "profile.png"
    assert write_png(h, path, title="test run") == str(path)
    assert path.stat().st_size > 0
    # Bars up to 200 steps, one bar call per phase; a stacked area beyond.
    if n <= 200:
        assert len(mpl_calls["bar"]) == len(PHASES) and not mpl_calls["stackplot"]
        x = list(mpl_calls["bar"][0][0][0])
    else:
        assert len(mpl_calls["stackplot"]) == 1 and not mpl_calls["bar"]
        x = list(mpl_calls["stackplot"][0][0][0])
    assert x == list(range(40, 40 + n))  # step numbers count the dropped steps
    # Every phase is drawn (far more pixels of its color than its legend patch holds).
    for p, count in phase_pixels(path).items():
        assert count > 2000, (p, count)
    # Throughput: the raw rate and its rolling median over the last 20 steps, x in seconds since
    # the first step's end. float64 arithmetic on both sides: rel 1e-9.
    (t, raw), _ = mpl_calls["plot"][0]
    (t2, rolled), kw = mpl_calls["plot"][1]
    t0 = h.end_ns[0]
    assert list(t) == pytest.approx([(e - t0) / 1e9 for e in h.end_ns], rel=1e-9, abs=1e-12)
    assert list(t2) == list(t)
    per = [1 / (s / 1e9) for s in h.step_ns]
    if samples:
        per = [b * r for b, r in zip(h.samples, per)]
    assert list(raw) == pytest.approx(per, rel=1e-9)
    want = [float(np.median(per[max(0, i - 19) : i + 1])) for i in range(n)]
    assert list(rolled) == pytest.approx(want, rel=1e-9)
    assert kw["label"] == f"median of {min(20, n)}"  # a shorter run: all its steps
    # Drawn on its own Figure: pyplot (the user's global backend) was not imported for it.
    if not pyplot_before:
        assert "matplotlib.pyplot" not in sys.modules


def test_png_of_an_empty_history_warns_and_writes_nothing(tmp_path):
    pytest.importorskip("matplotlib", reason="matplotlib is not installed")
    path = tmp_path / "empty.png"
    with pytest.warns(UserWarning, match="no steps"):
        assert write_png(StepHistory(), path) is None
    assert not path.exists()


def test_png_returns_the_file_it_wrote_and_refuses_a_folder_or_an_empty_path(tmp_path):
    # Issue 23 item 25: a folder or "" was returned as given while the PNG went to <dir>.png/.png.
    pytest.importorskip("matplotlib", reason="matplotlib is not installed")
    h = make_history(3)
    for bad in (tmp_path, str(tmp_path) + "/", ""):
        with pytest.raises(ValueError, match="path must name a file"):
            write_png(h, bad)
    with pytest.raises(TypeError, match="path must be a str"):
        write_png(h, 3)
    assert sorted(p.name for p in tmp_path.parent.iterdir() if p.name.endswith(".png")) == []
    assert list(tmp_path.iterdir()) == []
    got = write_png(h, tmp_path / "steps")  # matplotlib adds the suffix: the real name comes back
    assert got == str(tmp_path / "steps.png") and os.path.getsize(got) > 0


def test_png_without_matplotlib_warns(tmp_path, monkeypatch):
    # A None entry in sys.modules makes the import raise ImportError, as if it were not installed.
    monkeypatch.setitem(sys.modules, "matplotlib.figure", None)
    monkeypatch.setitem(sys.modules, "matplotlib.backends.backend_agg", None)
    with pytest.warns(UserWarning, match="matplotlib is missing"):
        assert write_png(make_history(3), tmp_path / "x.png") is None
    assert not (tmp_path / "x.png").exists()


# --- write_tensorboard -------------------------------------------------------------------------


def test_tensorboard_scalars_match_the_history(tmp_path):
    pytest.importorskip("tensorboard", reason="tensorboard is not installed")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    h = make_history(250, seed=5, dropped=1000)
    h.step_ns[3] = 0  # a 0 ns step (all phases 0) has shares 0, not a division by zero
    for p in PHASES:
        h.phase_ns[p][3] = 0
    assert write_tensorboard(h, tmp_path, tag_prefix="run/step") is True
    acc = EventAccumulator(str(tmp_path), size_guidance={"scalars": 0})  # 0: keep every event
    acc.Reload()
    tags = {"run/step/step_ms"}
    tags |= {f"run/step/{p}_ms" for p in PHASES} | {f"run/step/{p}_share" for p in PHASES}
    assert set(acc.Tags()["scalars"]) == tags
    steps = list(range(1000, 1250))

    def check(tag, want):
        events = acc.Scalars(tag)
        assert [e.step for e in events] == steps, tag
        # Scalars are stored as float32: relative 1e-6 (float32 epsilon is 1.2e-7).
        assert [e.value for e in events] == pytest.approx(want, rel=1e-6, abs=1e-12), tag

    check("run/step/step_ms", [s / 1e6 for s in h.step_ns])
    for p in PHASES:
        check(f"run/step/{p}_ms", [v / 1e6 for v in h.phase_ns[p]])
        check(
            f"run/step/{p}_share",
            [v / s if s else 0.0 for v, s in zip(h.phase_ns[p], h.step_ns)],
        )


def test_tensorboard_without_tensorboard_warns(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "torch.utils.tensorboard", None)
    with pytest.warns(UserWarning, match="tensorboard is missing"):
        assert write_tensorboard(make_history(3), tmp_path) is False
    assert not any(tmp_path.iterdir())


def test_tensorboard_of_an_empty_history_warns(tmp_path):
    pytest.importorskip("tensorboard", reason="tensorboard is not installed")
    with pytest.warns(UserWarning, match="no steps"):
        assert write_tensorboard(StepHistory(), tmp_path) is False


def test_report_imports_and_formats_without_matplotlib_or_tensorboard():
    code = (
        "import sys\n"
        "for m in ('matplotlib', 'tensorboard', 'torch.utils.tensorboard'): sys.modules[m] = None\n"
        "from torchspeed.profile import StepHistory, PHASES, summarize\n"
        "from torchspeed.profile.report import format_summary\n"
        "h = StepHistory(step_ns=[7], phase_ns={p: [1] for p in PHASES})\n"
        "print(format_summary(summarize(h)))\n"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "1 step summarized" in r.stdout
