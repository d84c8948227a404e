"""`parity.engine.case_run`'s observers: `phase_observer` gets each phase's seconds and `around_case` wraps the
judged run, without changing the verdict (what a measuring script builds its per-case time line on, e.g. the lab's
`lab/gpu_phase_profile.py`)."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.usefixtures("restore_registry")  # tests/conftest.py


def test_case_run_observers_see_every_phase_and_wrap_the_case(monkeypatch):
    """`parity.engine.case_run.phase_observer` gets each phase block's seconds (summing to the outcome's phases) and
    `around_case` wraps the judged run (its return is the outcome): what the phase profile's per-case time line
    and memory peaks are built on. Neither changes the verdict."""
    import lowerings
    from parity.engine import case_run, policy
    from parity.engine.runner import RunOptions
    from tests.oracle.oracle_cases import build_case

    case = build_case((5, 40), 4, 2, 2, 64, 16)
    seen: dict[str, float] = {}
    wrapped: list = []

    def observe(outcome, phase, seconds):
        seen[phase] = seen.get(phase, 0.0) + seconds

    def around(judged, c, opts):
        wrapped.append(c)
        out = judged()
        out.skipped["marker"] = "set by around_case"  # run_case must return what around_case returned
        return out

    monkeypatch.setattr(case_run, "phase_observer", observe)
    monkeypatch.setattr(case_run, "around_case", around)
    out = case_run.run_case(lowerings.get("decode_rows"), case, policy.load(None), RunOptions())
    assert out.status == "pass" and wrapped == [case] and out.skipped.get("marker") == "set by around_case"
    assert set(seen) == set(out.phases) and {"build", "oracle", "lowering", "judge"} <= set(seen)
    assert all(abs(seen[k] - out.phases[k]) < 1e-9 for k in seen)
