"""The README's quick start: `scripts/dev check` runs the `quick` profile (every lowering, its boundary
cases, a few derandomized draws) and both `scripts/dev` verbs resolve relative paths against the
caller's directory, not the repository's.

The script runs against the venv running these tests (`DFLASH_VENV`); where that venv was not made by
`scripts/dev setup` (or its package metadata is older than pyproject.toml) the script would install
into it, so those tests skip instead.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import lowerings
from strategies import PROFILES, check_cases, profile_settings

ROOT = Path(__file__).resolve().parents[1]
DEV = ROOT / "scripts" / "dev"
MUTANT_PLUGIN = ("import lowerings\nfrom tests.production_mutants import DispatchThresholdLow\n"
                 "lowerings.register(DispatchThresholdLow())\n")


def test_quick_profile_is_registered_derandomized_and_small():
    quick = PROFILES["quick"]
    assert quick.derandomize and not quick.target and 1 <= quick.max_examples <= 8, quick
    assert quick.max_examples < PROFILES["ci"].max_examples and quick.flaky_runs >= 2
    s = profile_settings("quick")
    assert s.derandomize and s.max_examples == quick.max_examples and s.database is None
    assert profile_settings("quick", seed=3).derandomize is False  # a seed overrides it, as for `ci`


def _dev_env() -> dict[str, str]:
    venv = Path(sys.prefix)
    marker = venv / ".dflash-installed"
    if not (venv / "bin" / "dflash-parity").exists() or not marker.exists():
        pytest.skip(f"{venv} was not set up by scripts/dev (no {marker.name}): the script would install into it")
    if (ROOT / "pyproject.toml").stat().st_mtime > marker.stat().st_mtime:
        pytest.skip("pyproject.toml is newer than the venv's install: scripts/dev would reinstall")
    env = {k: v for k, v in os.environ.items() if k not in ("TRITON_INTERPRET", "PYTEST_XDIST_WORKER")}
    env.update(DFLASH_VENV=str(venv), PYTHONPATH=str(ROOT))  # PYTHONPATH: the plugin imports tests.*
    return env


def test_dev_check_runs_the_quick_profile_from_the_callers_directory(tmp_path):
    """`scripts/dev check` from another directory: `--plugin plugin.py` and `--report r` are the caller's;
    the quick profile runs every boundary case and its draws: the correct lowering passes, and the
    dispatch off-by-one (BUGS 17, B = 32 on the wrong path) is caught by its boundary case."""
    env = _dev_env()
    (tmp_path / "plugin.py").write_text(MUTANT_PLUGIN)
    res = subprocess.run([str(DEV), "check", "--plugin", "plugin.py", "--lowering", "decode_rows", "--lowering",
                          "mutant:dispatch_threshold_low", "--device", "cpu", "--report", "r", "--no-isolate"],
                         cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert res.returncode == 1, res.stdout + res.stderr
    assert "(quick profile" in res.stdout + res.stderr, res.stderr
    assert "caught by the boundary case batch_size = 32" in res.stdout, res.stdout
    data = json.loads((tmp_path / "r" / "parity.json").read_text())  # in the caller's directory
    assert data["settings"]["profile"] == "quick"
    n = PROFILES["quick"].max_examples + len(check_cases(lowerings.get("decode_rows"), "cpu",
                                                          profile="quick").boundaries)
    assert data["lowerings"]["decode_rows"]["status"] == "pass" and data["lowerings"]["decode_rows"]["cases"] == n
    assert data["lowerings"]["mutant:dispatch_threshold_low"]["status"] == "fail"
    assert not (ROOT / "r").exists()


def test_dev_check_keeps_an_explicit_profile(tmp_path):
    """`--profile=ci` (or `--profile ci`) is the user's choice: no `--profile quick` is added. (A lowering
    that cannot run on a CPU keeps this cheap: nothing is judged, the report still records the profile.)"""
    res = subprocess.run([str(DEV), "check", "--profile=ci", "--lowering", "context[flashinfer-fa2]", "--device",
                          "cpu", "--report", "r", "--allow-nothing-judged", "--quiet"],
                         cwd=tmp_path, env=_dev_env(), capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stdout + res.stderr
    assert json.loads((tmp_path / "r" / "parity.json").read_text())["settings"]["profile"] == "ci"


def test_dev_test_runs_pytest_in_the_repository_with_the_callers_paths(tmp_path):
    """`scripts/dev test FILE -k EXPR` from another directory: FILE (relative to the caller) is found, pytest
    runs in the repository (its settings and conftest.py), and an option that is not a path is kept."""
    env = _dev_env()
    env.update(DFLASH_WORKERS="0", CWD_FILE=str(tmp_path / "cwd.txt"))
    (tmp_path / "test_tiny.py").write_text("import os\n\ndef test_where():\n"
                                           "    open(os.environ['CWD_FILE'], 'w').write(os.getcwd())\n\n"
                                           "def test_deselected():\n    raise AssertionError('deselected by -k')\n")
    res = subprocess.run([str(DEV), "test", "test_tiny.py", "-k", "where", "-p", "no:randomly", "-q"],
                         cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "1 passed, 1 deselected" in res.stdout, res.stdout
    assert Path((tmp_path / "cwd.txt").read_text()) == ROOT
