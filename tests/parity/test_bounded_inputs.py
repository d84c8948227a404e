"""Every number bounded (issue 49, item 5): timeouts, counts and sizes outside their documented range
(`parity.engine.ranges`) and an empty `--report` are refused naming the option or the environment variable
(exit 2), before anything is written, armed or started."""

from __future__ import annotations


import pytest

from tests.cli_runs import run

pytestmark = pytest.mark.usefixtures("restore_registry")  # tests/conftest.py

TINY = ["--no-isolate", "--max-examples", "2", "--device", "cpu", "--quiet", "--flaky-runs", "0", "--limit",
        "max_batch=2", "--limit", "max_context=20", "--limit", "head_dims=64", "--limit", "max_production_context=0"]


# ---- numbers --------------------------------------------------------------------------------------------

CHECK = ["check", "--lowering", "sdpa", *TINY]
# (id, argv, the message's line)
RANGE_ROWS = [
    ("--hook-timeout 1e12", CHECK + ["--hook-timeout", "1e12"], "--hook-timeout must be at most 86400 seconds (one day)"),
    ("--case-timeout 1e12", ["check", "--lowering", "sdpa", "--case-timeout", "1e12", "--device", "cpu"],
     "--case-timeout must be at most 86400 seconds (one day)"),
    ("repro --case-timeout 1e12", ["repro", "x.json", "--case-timeout", "1e12"], "--case-timeout must be at most 86400"),
    ("bench --time-cap 1e12", ["bench", "--time-cap", "1e12"], "--time-cap must be at most 86400 seconds"),
    ("bench --replays 10^12", ["bench", "--replays", "1000000000000"], "--replays must be at most 1000000"),
    ("--threads 10^9", CHECK + ["--threads", "1000000000"], "--threads must be at most 1024"),
    ("--jobs 10^6", CHECK + ["--jobs", "1000000"], "--jobs must be at most 1024"),
    ("--max-examples 10^11", CHECK + ["--max-examples", "100000000000"], "--max-examples must be at most 10000000"),
    ("--flaky-runs 10^6", CHECK + ["--flaky-runs", "1000000"], "--flaky-runs must be at most 1000"),
    ("--shard 0/30000000", CHECK + ["--shard", "0/30000000"], "--shard: S at most 1024 shards"),
    ("--report ''", CHECK + ["--report", ""], "--report: an empty path: give a report directory"),
    ("--gate-baseline ''", CHECK + ["--gate-baseline", ""], "--gate-baseline: an empty path"),
]


@pytest.mark.parametrize("argv,says", [pytest.param(a, s, id=i) for i, a, s in RANGE_ROWS])
def test_a_number_past_its_documented_range_is_refused_naming_the_option(tmp_path, monkeypatch, argv, says):
    monkeypatch.chdir(tmp_path)  # `--report ''` must write nowhere, the working directory least
    code, out, err = run(argv)
    assert code == 2 and says in err and "Traceback" not in err, out + err
    assert not list(tmp_path.iterdir()), "refused before anything was written"


def test_the_hook_timeout_variable_past_its_range_is_one_line(tmp_path, monkeypatch):
    """`DFLASH_PARITY_HOOK_TIMEOUT=1e12`: once the timer overflowed and a correct built-in failed with
    "case_limits() raised OverflowError"; now one line naming the variable, before any hook runs."""
    monkeypatch.setenv("DFLASH_PARITY_HOOK_TIMEOUT", "1e12")
    code, out, err = run(CHECK + ["--report", tmp_path / "r"])
    assert code == 2 and err.strip() == ("dflash-parity: error: DFLASH_PARITY_HOOK_TIMEOUT: at most 86400 seconds "
                                         "(one day), got '1e12'"), out + err
    monkeypatch.setenv("DFLASH_PARITY_HOOK_TIMEOUT", "86400")
    code, out, err = run(CHECK + ["--report", tmp_path / "r"])
    assert code == 0, out + err  # the top of the range works
