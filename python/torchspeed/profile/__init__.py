"""torchspeed.profile: nanosecond ranges, an always-on per-step breakdown, traces, plots and the
doctor that names the bottleneck and the fix.

    import torchspeed.profile as tsp
    with tsp.StepProfiler(hooks=True) as prof:     # hooks: plain torch code is covered too
        for x, y in loader:
            with tsp.range("augment"): x = augment(x)   # C++ range: ~tens of ns when on
            loss = loss_fn(model(x), y); loss.backward(); opt.step(); opt.zero_grad()
            prof.step()
    print(prof.report())                           # median/p90/share per phase + ranked advice
    prof.export_chrome_trace("trace.json")         # Perfetto / chrome://tracing

    with tsp.doctor(steps=100): train()            # or: torchspeed doctor -- python train.py
"""

from ._doctor import doctor
from .advice import advise
from .ranges import (
    clock_source,
    dropped_events,
    enabled,
    export_chrome_trace,
    now_ns,
    phase,
    range,  # noqa: A004
    set_enabled,
)
from .step import StepProfiler
from .summary import PHASES, Finding, PhaseStat, RunFacts, StepHistory, StepSummary, summarize

__all__ = [
    "PHASES",
    "Finding",
    "PhaseStat",
    "RunFacts",
    "StepHistory",
    "StepProfiler",
    "StepSummary",
    "advise",
    "clock_source",
    "doctor",
    "dropped_events",
    "enabled",
    "export_chrome_trace",
    "now_ns",
    "phase",
    "range",
    "set_enabled",
    "summarize",
]
