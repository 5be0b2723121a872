"""Shared by the profiler tests: the accuracy bound of issue 10 and the per-step check of a
history against known phase times (test_profile.py on the CPU, test_profile_cuda.py on a GPU)."""

import torchspeed.profile as tsp


def tolerance_ns(step_ns: int) -> float:
    """The issue's accuracy bound: max(3 % of the step, 0.2 ms)."""
    return max(0.03 * step_ns, 0.2e6)


def assert_phases(history, truth, skip: int = 1) -> None:
    """Every step i >= skip of `history`: the phases in truth[i] (ns; or one dict for all steps)
    within tolerance, and the step's phases summing to its time exactly."""
    n = len(history) if isinstance(truth, dict) else min(len(history), len(truth))
    assert n > skip, f"only {len(history)} steps recorded"
    for i in range(skip, n):
        want_all = truth if isinstance(truth, dict) else truth[i]
        tol = tolerance_ns(history.step_ns[i])
        assert sum(history.phase_ns[p][i] for p in tsp.PHASES) == history.step_ns[i]
        for p, want in want_all.items():
            got = history.phase_ns[p][i]
            assert abs(got - want) <= tol, (
                f"step {i} {p}: measured {got / 1e6:.3f} ms, truth {want / 1e6:.3f} ms "
                f"(tol {tol / 1e6:.3f})"
            )
