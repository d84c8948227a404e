"""`scripts/gpu_phase_profile.py --min-keys L`: the lowering it profiles judges only cases of L keys or more."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.usefixtures("restore_registry")  # tests/conftest.py


def _script():
    spec = importlib.util.spec_from_file_location("gpu_phase_profile", ROOT / "scripts" / "gpu_phase_profile.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_only_long_cases_are_judged():
    import lowerings
    from parity.engine import policy
    from parity.engine.runner import RunOptions, check_lowering
    from strategies import cases, profile_settings

    base = lowerings.get("decode_rows")
    long_only = _script().LongOnly(base, 200)
    lens: list[int] = []
    rep = check_lowering(long_only, policy.load(None), strategy=cases(long_only),
                         settings=profile_settings("ci", max_examples=8), opts=RunOptions(),
                         progress=lambda r, o: lens.append(max(o.case.context_lens)) if o.status == "pass" else None)
    assert rep.status == "pass" and len(lens) >= 5 and min(lens) >= 200, lens
    from tests.oracle.oracle_cases import build_case

    assert "shorter than 200 keys" in long_only.supports(build_case((5, 199), 4, 2, 2, 64, 16))
    at_length = build_case((5, 200), 4, 2, 2, 64, 16)
    assert long_only.supports(at_length) == base.supports(at_length)  # from L on: the lowering's own answer


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
