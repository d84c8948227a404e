"""No verdict outlives its run (issue 49, item 2): whatever stops `check` before it writes its verdict (a
full disk from the start, a read-only directory, an error before the first case), no passing `parity.json`
is left where `gate` reads one, and the gate refuses a report whose run did not finish."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest


from tests.parity.full_disk import full_disk
from tests.cli_runs import run

pytestmark = pytest.mark.usefixtures("restore_registry")  # tests/conftest.py

QUICK = ["--lowering", "sdpa", "--no-isolate", "--max-examples", "2", "--device", "cpu", "--quiet", "--limit",
         "max_batch=2", "--limit", "max_context=20", "--limit", "head_dims=64", "--limit", "max_production_context=0"]


@pytest.fixture(scope="module")
def passing(tmp_path_factory) -> Path:
    """A passing report (the baseline, and the previous run's verdict in the directory under test)."""
    d = tmp_path_factory.mktemp("stale") / "base"
    code, out, err = run(["check", *QUICK, "--report", d])
    assert code == 0, out + err
    return d


def _previous_run_in(passing: Path, tmp_path: Path) -> Path:
    d = tmp_path / "r"
    shutil.copytree(passing, d)
    return d


def _gate_refuses(d: Path, passing: Path) -> str:
    code, out, err = run(["gate", d, "--baseline", passing, "--markdown", d.parent / "gate.md"])
    assert code != 0, out + err
    return out + err


def test_a_full_disk_from_the_start_leaves_no_passing_verdict(passing, tmp_path):
    """The disk is full before the run writes a byte (a stand-in raising ENOSPC on every write below the
    report directory): one message, exit 2, the previous verdict moved out of where the gate reads it."""
    d = _previous_run_in(passing, tmp_path)
    before = (d / "parity.json").read_text()
    with full_disk(d):
        code, out, err = run(["check", *QUICK, "--report", d])
    assert code == 2 and len(err.strip().splitlines()) == 1, out + err
    assert "No space left on device" in err and "Traceback" not in err
    assert not (d / "parity.json").exists()
    kept = [p for p in d.rglob("*parity.json") if p.read_text() == before]
    assert kept, "the previous verdict is kept (moved aside, never deleted)"
    said = _gate_refuses(d, passing)
    assert "no parity.json there" in said or "in progress" in said, said


def test_a_full_disk_with_previous_already_there_moves_the_verdict_into_it(passing, tmp_path):
    d = _previous_run_in(passing, tmp_path)
    (d / "previous").mkdir()
    with full_disk(d):
        code, _, err = run(["check", *QUICK, "--report", d])
    assert code == 2, err
    assert not (d / "parity.json").exists() and json.loads((d / "previous" / "parity.json").read_text())
    _gate_refuses(d, passing)


def test_an_error_before_the_first_case_leaves_no_passing_verdict(passing, tmp_path):
    """A bad plugin refused after the directory is locked: the old verdict is not left to pass the gate."""
    d = _previous_run_in(passing, tmp_path)
    code, _, err = run(["check", *QUICK, "--report", d, "--tolerances", tmp_path / "missing.toml"])
    assert code == 2, err
    assert not (d / "parity.json").exists() and (d / "previous" / "parity.json").exists()
    _gate_refuses(d, passing)


def test_the_gate_refuses_a_report_of_a_run_that_did_not_finish(passing, tmp_path):
    """A parity.json without `finished` (written by no run that ended) is no verdict."""
    d = _previous_run_in(passing, tmp_path)
    data = json.loads((d / "parity.json").read_text())
    del data["finished"]
    (d / "parity.json").write_text(json.dumps(data))
    code, out, err = run(["gate", d, "--baseline", passing, "--markdown", tmp_path / "gate.md"])
    assert code == 2 and "finished" in err and len(err.strip().splitlines()) == 1, out + err


def test_a_read_only_directory_says_its_verdict_is_stale_and_the_gate_can_refuse_it(passing, tmp_path, monkeypatch):
    """A read-only file system: nothing in the directory can be moved or written, so the previous verdict
    stays; the refusal says so and names the way to refuse it (`gate --not-before`), which works."""
    import errno
    import os

    from parity.report import provenance
    from parity.report import directory as report_dir_mod

    d = _previous_run_in(passing, tmp_path)
    real_open = os.open

    def read_only(path, flags, *a):
        if str(path).startswith(str(d)) and flags & (os.O_WRONLY | os.O_RDWR | os.O_CREAT):
            raise OSError(errno.EROFS, os.strerror(errno.EROFS), str(path))
        return real_open(path, flags, *a)

    started = provenance.now()
    monkeypatch.setattr(report_dir_mod.os, "open", read_only)
    code, out, err = run(["check", *QUICK, "--report", d])
    monkeypatch.undo()
    assert code == 2 and len(err.strip().splitlines()) == 1, out + err
    assert err.strip().endswith(f"{d / 'parity.json'} is an earlier run's verdict that could not be moved aside: "
                                f"refuse it with `dflash-parity gate --not-before TIME` (or remove it)"), err
    code, out, err = run(["gate", d, "--baseline", passing, "--not-before", started, "--markdown", tmp_path / "g.md"])
    assert code == 1 and "the new report is stale" in out, out + err
