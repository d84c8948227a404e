"""A report the gate reads is input (issue 49, item 5): a figure it reads that is not a finite number
(`"nan"`, `"inf"`, NaN) is refused naming the field (exit 2), and a lowering's status is recomputed from
its cases and failures (a hand-edited `"status": "pass"` listing failures fails the gate)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from parity.report.trust import check_report, entry_status
from tests.cli_runs import run

pytestmark = pytest.mark.usefixtures("restore_registry")  # tests/conftest.py

QUICK = ["--lowering", "sdpa", "--no-isolate", "--max-examples", "2", "--device", "cpu", "--quiet", "--limit",
         "max_batch=2", "--limit", "max_context=20", "--limit", "head_dims=64", "--limit", "max_production_context=0"]


@pytest.fixture(scope="module")
def passing(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("gate-inputs") / "base"
    code, out, err = run(["check", *QUICK, "--report", d])
    assert code == 0, out + err
    return d


def _sdpa(r):
    return r["lowerings"]["sdpa"]


def _first_bound(r):
    per = r["policy"]["bounds"]["sdpa"]
    return next(iter(next(iter(per.values())).values()))


# (id, edit of the new report's data, the field the refusal names)
ROWS = [
    ("worst_margin 'nan'", lambda r: _sdpa(r).update(worst_margin="nan"), "NEW {d}/parity.json: lowerings.sdpa.worst_margin"),
    ("worst_margin 'inf'", lambda r: _sdpa(r).update(worst_margin="inf"), "lowerings.sdpa.worst_margin"),
    ("worst_margin NaN", lambda r: _sdpa(r).update(worst_margin=float("nan")), "lowerings.sdpa.worst_margin"),
    ("worst_ulp '1.0'", lambda r: _sdpa(r).update(worst_ulp="1.0"), "lowerings.sdpa.worst_ulp"),
    ("cases -1", lambda r: _sdpa(r).update(cases=-1), "lowerings.sdpa.cases"),
    ("a bound NaN", lambda r: _first_bound(r).update(value=float("nan")), "policy.bounds.sdpa."),
    ("max_margin_growth 'nan'", lambda r: r["policy"].update(max_margin_growth="nan"), "policy.max_margin_growth"),
    ("status 'passed'", lambda r: _sdpa(r).update(status="passed"), "lowerings.sdpa.status"),
]


@pytest.mark.parametrize("edit,field", [pytest.param(e, f, id=i) for i, e, f in ROWS])
def test_a_figure_the_gate_reads_that_is_not_finite_is_refused(passing, tmp_path, edit, field):
    d = tmp_path / "new"
    shutil.copytree(passing, d)
    data = json.loads((d / "parity.json").read_text())
    edit(data)
    (d / "parity.json").write_text(json.dumps(data))  # NaN as the JSON token NaN, as Python writes it
    code, out, err = run(["gate", d, "--baseline", passing, "--markdown", tmp_path / "gate.md"])
    assert code == 2 and len(err.strip().splitlines()) == 1, out + err
    assert field.format(d=d) in err and "Traceback" not in err, err


def test_a_status_edited_to_pass_with_failures_fails_the_gate(passing, tmp_path):
    d = tmp_path / "new"
    shutil.copytree(passing, d)
    data = json.loads((d / "parity.json").read_text())
    _sdpa(data)["failures"] = [{"file": "failures/sdpa-1.json", "shrunk": True, "case": None, "failures": ["x"],
                                "example": ""}]
    (d / "parity.json").write_text(json.dumps(data))  # "status": "pass", "verdict": "pass" left as they were
    code, out, err = run(["gate", d, "--baseline", passing, "--markdown", tmp_path / "gate.md"])
    assert code == 1 and "`sdpa` passed in the baseline and fails now" in out, out + err


def test_every_rule_of_the_checks_catches_its_violation():
    """`check_report` passes a well-formed report and names each seeded violation; `entry_status` never
    reads a pass over a failure, a failed class or an interruption."""
    good = {"finished": "t", "verdict": "pass", "policy": {"bounds": {}, "max_margin_growth": 0.25},
            "lowerings": {"a": {"status": "pass", "cases": 2, "worst_margin": 0.5, "classes": {}}}}
    check_report(good, "R")
    for bad, field in [({"finished": None}, "R: finished"), ({"verdict": "ok"}, "R: verdict"),
                       ({"lowerings": {"a": []}}, "R: lowerings.a"),
                       ({"lowerings": {"a": {"status": "pass", "classes": {"c": {"cases": 1}}}}}, "lowerings.a.classes")]:
        with pytest.raises(ValueError, match=field):
            check_report({**good, **bad}, "R")
    assert entry_status({"status": "pass", "failures": [{}]}) == "fail"
    assert entry_status({"status": "pass", "classes": {"c": {"cases": 1, "failed": 1}}}) == "fail"
    assert entry_status({"status": "pass", "interrupted": True}) == "fail"
    assert entry_status({"status": "unavailable"}) == "unavailable"
    assert entry_status({"status": "fail"}) == "fail" and entry_status({"status": "pass"}) == "pass"
