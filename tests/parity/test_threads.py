"""`--threads` (issue "Four times the cases per GPU-minute"): torch's CPU threads per process that runs cases,
by default the cores over the processes running cases at once; named in a bad value; passed to `--jobs`
children; recorded in the report; the caller's count restored when the session closes."""

from __future__ import annotations

import json

import pytest
import torch

from oracle.errors import InvalidInput
from parity.front import cli
from parity.front.config import CheckConfig, default_threads
from parity.front.part import Part, child_argv
from parity.front.session import CheckSession

pytestmark = pytest.mark.usefixtures("restore_registry")


@pytest.mark.parametrize("processes,cpus,want", [(1, 2, 2), (2, 2, 1), (3, 2, 1), (4, 16, 4), (5, 16, 3), (0, 8, 8)])
def test_default_threads_share_the_cores(processes, cpus, want):
    assert default_threads(processes, cpus) == want


def test_threads_follow_jobs_and_workers(monkeypatch):
    monkeypatch.setattr("os.cpu_count", lambda: 16)
    assert CheckConfig().threads_per_process() == 16
    assert CheckConfig(jobs=4).threads_per_process() == 4
    assert CheckConfig(jobs=2).threads_per_process(workers=4) == 2
    assert CheckConfig(jobs=4, threads=3).threads_per_process(workers=4) == 3


@pytest.mark.parametrize("bad", [0, -1, True, 1.5])
def test_a_bad_thread_count_names_the_option(bad):
    with pytest.raises(InvalidInput) as err:
        CheckConfig(threads=bad)
    assert "--threads" in str(err.value) and "an integer >= 1" in str(err.value)


def test_a_jobs_child_gets_the_parents_share(monkeypatch):
    monkeypatch.setattr("os.cpu_count", lambda: 8)
    argv = child_argv(CheckConfig(jobs=4, lowerings=("sdpa", "context")), Part("sdpa"))
    spec = json.loads(argv[argv.index("--part") + 1])
    assert spec["config"]["jobs"] == 1 and spec["config"]["threads"] == 2


def test_the_session_sets_torch_threads_records_them_and_restores_the_callers(tmp_path):
    before = torch.get_num_threads()
    s = CheckSession(CheckConfig(device="cpu", threads=1, report=None), workers=2)
    s.load(probe=False)
    try:
        assert torch.get_num_threads() == 1 and s.threads == 1
        assert s.run_settings(["sdpa"])["threads"] == 1
    finally:
        s.close()
    assert torch.get_num_threads() == before


def test_check_records_threads_in_the_report(tmp_path, capsys):
    code = cli.main(["check", "--lowering", "sdpa", "--device", "cpu", "--no-isolate", "--max-examples", "3",
                     "--threads", "1", "--quiet", "--report", str(tmp_path / "r")])
    assert code == 0, capsys.readouterr()
    assert json.loads((tmp_path / "r" / "parity.json").read_text())["settings"]["threads"] == 1
    assert cli.main(["check", "--lowering", "sdpa", "--threads", "0"]) == 2
    assert "--threads must be a positive integer, got '0'" in capsys.readouterr().err


def test_a_check_inside_an_xdist_worker_shares_the_cores(monkeypatch):
    """`cli.main(["check", ...])` in a test under `pytest -n 10` on 16 cores: 1 thread, not 16 in each worker."""
    monkeypatch.setattr("os.cpu_count", lambda: 16)
    monkeypatch.setenv("PYTEST_XDIST_WORKER_COUNT", "10")
    s = CheckSession(CheckConfig(device="cpu", report=None))
    assert s.workers == 10 and s.config.threads_per_process(s.workers) == 1
    monkeypatch.setenv("PYTEST_XDIST_WORKER_COUNT", "x")
    assert CheckSession(CheckConfig(device="cpu", report=None)).workers == 1
