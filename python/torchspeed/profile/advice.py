"""The doctor's ranked advice: the breakdown rules' findings (rules.py) and the lints' (lints.py),
ranked by estimated gain, then severity.

    findings = advise(summarize(history), facts)   # largest estimated gain first

Every rule reads its facts defensively (facts.py): a fact that is missing, None or of an
unexpected type makes that rule quiet, never raise, so the report at the end of a long run
cannot crash it.
"""

from __future__ import annotations

from typing import Dict, List

from .facts import _share
from .lints import lint
from .rules import _breakdown
from .summary import PHASES, Finding, RunFacts, StepSummary

_SEVERITY_ORDER = {"critical": 0, "warning": 1, "info": 2}


# ---- ranking ---------------------------------------------------------------------------------
def _rank(findings: List[Finding], weight: Dict[int, float]) -> List[Finding]:
    """Estimated gains first, largest first; then the rest by severity. Gains equal to the
    nanosecond tie on severity, then on the size of the evidence (the phase's time)."""

    def sev(f: Finding) -> int:
        return _SEVERITY_ORDER.get(f.severity, len(_SEVERITY_ORDER))

    gain = [f for f in findings if f.est_gain_s > 0]
    rest = [f for f in findings if not f.est_gain_s > 0]
    gain.sort(key=lambda f: (-round(f.est_gain_s, 9), sev(f), -weight.get(id(f), 0.0)))
    rest.sort(key=sev)
    return gain + rest


def advise(summary: StepSummary, facts: RunFacts) -> List[Finding]:
    """Every finding for the run, ranked: those with an estimated gain first (largest est_gain_s
    first), then the rest by severity (critical, warning, info). Empty when nothing applies."""
    facts = facts if facts is not None else RunFacts()
    found = _breakdown(summary, facts)
    # The evidence behind a breakdown finding, for ties: the share of the phase it is about.
    weight = {id(f): _share(summary, f.rule) if f.rule in PHASES else 0.0 for f in found}
    return _rank(found + lint(facts), weight)
