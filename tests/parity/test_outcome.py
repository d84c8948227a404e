"""The outcome model (parity/engine/outcome.py): one JSON form, one merge, non-finite figures keep their sign."""

from __future__ import annotations

import difflib
import json
import math
from pathlib import Path

from parity.engine import outcome
from parity.engine.outcome import LoweringReport
from tests.parity import report_fixture

BEFORE = Path(__file__).parent / "data" / "report_before.json"


def test_the_report_files_are_those_written_before_but_for_the_sign_of_minus_inf(tmp_path):
    """`report_fixture.written` (seeded outcomes through absorb, the report writer, a shard merge) against the
    files the writer wrote before the outcome model moved: the same text, except that a `-inf` figure is
    now written `"-inf"` (it was `"inf"`)."""
    before = json.loads(BEFORE.read_text())
    now = report_fixture.written(tmp_path)
    assert sorted(now) == sorted(before)
    changed = 0
    for name in before:
        for line in difflib.ndiff(before[name].splitlines(), now[name].splitlines()):
            if line.startswith(("- ", "+ ")):
                assert line.strip("-+ ") in ('"lse_min": "inf",', '"lse_min": "-inf",'), (name, line)
                changed += line.startswith("+ ")
    assert changed == 6  # the -inf figure of every worst case and failure written (parity.json, a file, the merge)


def test_non_finite_figures_keep_their_sign():
    assert outcome.jsonable([float("-inf"), float("inf"), float("nan"), 1.5]) == ["-inf", "inf", "nan", 1.5]
    back = outcome.unjson(outcome.jsonable({"a": [float("-inf")], "b": float("inf")}))
    assert back["a"][0] == float("-inf") and back["b"] == float("inf")
    assert math.isnan(outcome.unjson("nan"))


def test_an_entry_reads_back_to_the_same_entry():
    for rep in report_fixture.reports():
        entry = rep.to_json(["--device", "cpu"], family_counts=True)
        again = LoweringReport.from_json(rep.lowering, json.loads(json.dumps(entry)), "cpu").to_json(family_counts=True)
        assert again == entry, rep.lowering


def test_absorbing_cases_one_by_one_is_merging_their_reports():
    """The one merge: a report that absorbed every case equals, in its counts, tables and worst figures, the
    merge of reports that each absorbed a part of them (per-process compile counts and the parts' own
    draw time aside)."""
    alpha, beta, _ = report_fixture.reports()
    whole = LoweringReport("x", "cpu", "pass")
    whole.add(alpha)
    whole.add(beta)
    merged = LoweringReport.merged([alpha, beta])
    skip = {"compile_families", "max_compiles_in_a_family", "phase_seconds", "seconds", "status", "failures", "notes",
            "shards", "max_compiles"}
    a, b = whole.to_json(), merged.to_json()
    assert {k: v for k, v in a.items() if k not in skip} == {k: v for k, v in b.items() if k not in skip}
    assert a["cases"] == alpha.cases + beta.cases and b["worst_margin"] == max(alpha.worst_margin, beta.worst_margin)
    assert (b["status"], b["shards"], b["notes"]) == ("fail", 2, ["shard 2/2: a note"])
