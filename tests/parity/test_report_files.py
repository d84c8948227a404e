"""The report writer's one description of what a run's files say (`parity.report.files.RunFiles`): the
keyword form `write_reports(dir, reports, **fields)` writes what `RunFiles(...).write` writes, and refuses a
field it does not know or lacks one it needs, as a signature would."""

from __future__ import annotations

import pytest

from parity.report import files as report
from tests.parity import report_fixture


def _texts(d):
    return {str(f.relative_to(d)): f.read_text().replace(str(d), "DIR") for f in sorted(d.rglob("*"))
            if f.is_file()}


def test_the_keyword_form_writes_what_the_dataclass_writes(tmp_path, monkeypatch):
    from parity.report import provenance

    monkeypatch.setattr(provenance, "now", lambda: report_fixture.FIXED_TIME)
    facts = dict(device="cpu", profile="ci", tolerances="tolerances.toml", replay=["--device", "cpu"],
                 header=report_fixture.header())
    a = report.write_reports(tmp_path / "a", report_fixture.reports(), policy_entries=["[x]"], **facts)
    b = report.RunFiles(**facts).write(tmp_path / "b", report_fixture.reports(), policy_entries=["[x]"])
    assert _texts(tmp_path / "a") == _texts(tmp_path / "b") and sorted(_texts(tmp_path / "a")) == [
        "failures/beta-1.json", "failures/beta-2.json", "junit.xml", "parity.json", "summary.md"]
    assert a == b


@pytest.mark.parametrize("fields, phrase", [
    (dict(device="cpu", profile="ci", tolerances="t", replays=["--device", "cpu"]), "replays"),
    (dict(device="cpu", profile="ci"), "tolerances"),
])
def test_an_unknown_or_missing_field_is_refused_before_a_file_is_written(tmp_path, fields, phrase):
    with pytest.raises(TypeError, match=phrase):
        report.write_reports(tmp_path, report_fixture.reports(), **fields)
    assert not any(tmp_path.iterdir())
