"""The pytest plugin as another repository sees it (loaded through the installed `pytest11` entry point,
no conftest): options, parametrization, the parity_gpu marker, a shrunk failure, the report `check`
writes, pytest-xdist shard items merged into one report, usage errors, and a foreign suite left alone.

The subprocess runs (pytester) are the slow part of this file: each test below is one or two of them."""

from __future__ import annotations

import json
import logging
import os
import pathlib
import re

import pytest
import torch

from tests.plugin_runs import assert_outcomes, not_an_xdist_worker, plugin_args, run_subprocess, runpytest

pytest_plugins = ["pytester"]

ROOT = pathlib.Path(__file__).resolve().parents[2]
MUTANT = ROOT / "examples" / "plugin_window_off_by_one.py"

TEST_FILE = '''
import pytest

def test_parity(parity_lowering, parity_check):
    rep = parity_check(parity_lowering, max_examples=3)
    assert rep.passed == rep.cases - rep.unsupported

@pytest.mark.parity_gpu
def test_needs_gpu():
    pass
'''

GPU = int(torch.cuda.is_available())  # the pytester sessions' gpu-marked tests run here (1) or skip (0)
SMALL = ("--parity-limit", "max_batch=2", "--parity-limit", "max_context=64", "--parity-limit",
         "max_production_context=0")  # small cases, few boundary cases: a cheap subprocess run

SWEEP = '''
def test_parity(parity_lowering, parity_check):
    parity_check(parity_lowering)
'''


def test_plugin_parametrizes_selected_lowerings_and_skips_gpu_tests(pytester):
    pytester.makepyfile(test_other_repo=TEST_FILE)
    res = runpytest(pytester, "--parity-lowering", "sdpa", "--parity-lowering", "decode_rows", *SMALL,
                    "--parity-profile", "ci", "--parity-device", "cpu", "-rs", "-p", "no:cacheprovider")
    if GPU:  # on a GPU runner the gpu-marked test runs (and passes)
        assert_outcomes(res, passed=3, skipped=0)
    else:
        assert_outcomes(res, passed=2, skipped=1)
        res.stdout.fnmatch_lines(["*SKIPPED*needs a CUDA GPU; torch sees none on this machine*"])


def test_plugin_fails_a_lowering_whose_hook_fails_before_its_cases(pytester):
    """A hook asked while the cases are planned (here `dispatch_boundaries`, for the boundary cases) that
    raises fails that lowering's test with the hook named, and the session goes on (no internal error).
    The old spellings `--plugin`, `--lowering` and the `gpu` marker still work, each with a deprecation
    warning."""
    plugin = pytester.path / "bad_hook.py"
    plugin.write_text("from lowerings import register\nfrom lowerings.torch_emulation import Sdpa\n\n\n"
                      "class P(Sdpa):\n    name = 'bad_hook'\n\n    def dispatch_boundaries(self):\n"
                      "        raise KeyError('threshold')\n\n\nregister(P())\n")
    pytester.makepyfile(test_other_repo=TEST_FILE + "\n\n@pytest.mark.gpu\ndef test_old_marker():\n    pass\n")
    res = runpytest(pytester, "--plugin", str(plugin), "--lowering", "bad_hook", "--parity-lowering", "sdpa", *SMALL,
                    "--parity-profile", "ci", "--parity-device", "cpu", "-k", "test_parity or test_old_marker",
                    "-p", "no:cacheprovider")
    assert_outcomes(res, failed=1, passed=1 + GPU, skipped=1 - GPU, warnings=3)  # the gpu-marked test runs on a GPU
    res.stdout.fnmatch_lines(["*bad_hook failed parity on cpu: dispatch_boundaries() raised KeyError: 'threshold'*",
                              "*--plugin is deprecated, use --parity-plugin*"])
    res.stdout.fnmatch_lines(["*the `gpu` marker is deprecated, use `parity_gpu`*"])


def test_parity_limit_narrows_the_draw_and_bad_input_is_one_usage_line(pytester):
    """--parity-limit narrows the draw; a bad option value, a plugin file that does not import or
    `--parity-device cuda` without a GPU is a usage error naming it in one line (exit 4), never an internal
    error, a failure of every test or a session of skips that exits 0."""
    pytester.makepyfile(test_other_repo='''
def test_parity(parity_lowering, parity_check):
    rep = parity_check(parity_lowering, max_examples=5)
    assert set(rep.drawn["head_dim"]) == {"64"}, rep.drawn
''')
    with not_an_xdist_worker():  # in process, as the usage errors below (a subprocess costs its imports, seconds)
        res = pytester.runpytest_inprocess(*plugin_args(), "--parity-lowering", "sdpa", "--parity-profile", "ci",
                                           "--parity-device", "cpu", "--parity-limit", "head_dims=64", *SMALL, "-p",
                                           "no:cacheprovider")
    assert_outcomes(res, passed=1)
    broken = pytester.path / "broken.py"
    broken.write_text("def oops(:\n")
    for args, says in ((["--parity-limit", "head_dim=64"], "ERROR: --parity-limit: expected FIELD=VALUE"),
                       (["--parity-max-examples", "x"], "ERROR: --parity-max-examples must be a positive integer, got 'x'"),
                       (["--parity-hook-timeout", "1e12"],  # the timer overflowed: built-ins failed (issue 49)
                        "ERROR: --parity-hook-timeout must be at most 86400 seconds (one day), got '1e12'"),
                       (["--parity-report", ""], "ERROR: --parity-report: an empty path: give a report directory"),
                       (["--parity-plugin", str(broken)], f"ERROR: --parity-plugin {broken}: "),
                       (["--parity-device", "cuda"], "ERROR: --parity-device cuda: needs a CUDA GPU")):
        if args[1] == "cuda" and torch.cuda.is_available():
            continue
        bad = pytester.runpytest_inprocess(*plugin_args(), "--parity-device", "cpu", *args, "-p", "no:cacheprovider")
        err = [ln for ln in bad.stderr.str().splitlines() if ln.strip()]
        assert bad.ret == 4 and len(err) == 1 and err[0].startswith(says), (args, bad.stderr.str(), bad.stdout.str())


def test_the_report_is_the_cli_report_and_xdist_workers_merge_into_it(pytester, tmp_path, capsys, restore_registry):
    """`pytest -n 2 --parity-report DIR` (each lowering split into two shard items, one per worker) writes
    the files `check` writes, with the verdicts, counts and worst figures of a serial `check` of the same
    seed, and the shrunk failure; a second run replays the saved failure first."""
    from lowerings import registry
    from parity.front import cli

    common = ["--max-examples", "8", "--profile", "ci", "--device", "cpu", "--seed", "11", "--flaky-runs", "0",
              "--limit", "max_batch=2", "--limit", "max_context=64", "--limit", "max_production_context=0"]
    with registry.restored():  # the in-process run below registers the plugin's lowering again
        code = cli.main(["check", "--plugin", str(MUTANT), "--lowering", "sdpa", "--lowering", "my_windowed_merge",
                         "--no-isolate", "--quiet", "--report", str(tmp_path / "cli"), *common])
    capsys.readouterr()
    assert code == 1
    pytester.makepyfile(test_other_repo=SWEEP)
    report = pytester.path / "rep"
    res = runpytest(pytester, "-n", "2", "--parity-plugin", str(MUTANT), "--parity-lowering", "sdpa",
                    "--parity-lowering", "my_windowed_merge", "--parity-report", str(report), "-p", "no:cacheprovider",
                    *[("--parity-" + a[2:]) if a.startswith("--") else a for a in common])
    outcomes = res.parseoutcomes()  # sdpa's two items pass; the mutant fails in each item that finds a failure
    assert outcomes.get("passed", 0) >= 2 and outcomes.get("failed", 0) >= 1 and \
        outcomes.get("passed", 0) + outcomes.get("failed", 0) == 4, res.stdout.str()[-3000:]
    res.stdout.fnmatch_lines(["*test_parity?my_windowed_merge-shard?of2?*", "*dflash-parity*", "*my_windowed_merge*FAIL*",
                              f"*report (fail) in {report}*"])
    serial, merged = (json.loads((d / "parity.json").read_text()) for d in (tmp_path / "cli", report))
    assert {p.name for p in report.iterdir() if p.is_file()} >= {"parity.json", "junit.xml", "summary.md"}
    assert merged["verdict"] == serial["verdict"] == "fail" and merged["settings"]["seed"] == 11
    s, m = serial["lowerings"]["sdpa"], merged["lowerings"]["sdpa"]
    for key in ("status", "cases", "passed", "unsupported", "classes", "drawn", "worst_case", "worst_ulp_case"):
        assert m[key] == s[key], key
    assert m["worst_ulp"] == pytest.approx(s["worst_ulp"], abs=1.0) and m["shards"] == 2
    s, m = serial["lowerings"]["my_windowed_merge"], merged["lowerings"]["my_windowed_merge"]
    assert m["status"] == "fail" and s["failures"][0]["case"] in [f["case"] for f in m["failures"]]
    first = m["failures"][0]
    saved = json.loads((report / first["file"]).read_text())
    assert first["file"] == "failures/my_windowed_merge-1.json" and saved["case"] == first["case"]
    assert str(report / first["file"]) in saved["replay"]
    # again, on the same report: the saved failure is replayed first and still fails (in process: a serial
    # session needs no fresh interpreter, and a subprocess costs its imports, seconds)
    with not_an_xdist_worker():
        again = pytester.runpytest_inprocess(*plugin_args(), "--parity-plugin", str(MUTANT), "--parity-lowering",
                                             "my_windowed_merge", "--parity-report", str(report), "-p",
                                             "no:cacheprovider",
                                             *[("--parity-" + a[2:]) if a.startswith("--") else a for a in common])
    assert_outcomes(again, failed=1)
    again.stdout.fnmatch_lines(["*a saved failure still fails; fix it before new cases are drawn*"])


FOREIGN_CONFTEST = '''
import pytest
from hypothesis import settings

settings.register_profile("foreign", max_examples=7)
settings.load_profile("foreign")


def pytest_addoption(parser):
    parser.addoption("--lowering", action="store", default="none", help="this suite's own option")


def pytest_configure(config):
    config.addinivalue_line("markers", "gpu: this suite's own marker")
'''

FOREIGN_TESTS = '''
import os
import pytest
from hypothesis import given, settings, strategies as st


@given(st.integers())
def test_own_profile(x):
    assert settings._current_profile == "foreign" and settings.default.max_examples == 7


@pytest.mark.gpu
def test_own_gpu_marker_runs(request):
    assert request.config.getoption("--lowering") == "fp8-path"
    print("OWN-GPU-TEST-RAN")


def test_nothing_pinned():
    assert "CUDA_VISIBLE_DEVICES" not in os.environ
'''


def test_a_foreign_suite_runs_as_without_the_plugin(pytester, monkeypatch):
    """Another project's suite with its own hypothesis profile, its own `gpu` marker and its own `--lowering`
    option: the same outcomes and output with the plugin installed as with it disabled; no warning, no
    profile loaded, its `gpu` test run (not skipped for want of a GPU), its option its own."""
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    pytester.makeconftest(FOREIGN_CONFTEST)
    pytester.makepyfile(test_foreign=FOREIGN_TESTS)
    args = ("--lowering", "fp8-path", "-s", "-p", "no:cacheprovider", "-W", "error")
    res = runpytest(pytester, *args)
    off = run_subprocess(pytester, "-p", "no:dflash_parity", *args)
    assert_outcomes(res, passed=3)
    assert_outcomes(off, passed=3)
    assert "OWN-GPU-TEST-RAN" in res.stdout.str() and "warning" not in res.stdout.str().lower()

    def shown(r) -> list[str]:  # the output but for the list of plugins and the time taken
        return [re.sub(r" in [0-9.]+s", "", ln) for ln in r.stdout.lines if not ln.startswith("plugins:")]

    assert shown(res) == shown(off)


def test_library_logs_below_warning_are_dropped_during_a_sweep(caplog):
    """What flashinfer or torch log at INFO while a parity check runs does not reach the failure's report."""
    from parity.front.pytest_parts import quiet_library_logs

    caplog.set_level(logging.DEBUG)
    with quiet_library_logs():
        logging.getLogger("flashinfer.jit").info("compiling module ...")
        logging.getLogger("flashinfer.jit").warning("a warning stays")
    logging.getLogger("flashinfer.jit").info("after the sweep: kept")
    assert [r.getMessage() for r in caplog.records] == ["a warning stays", "after the sweep: kept"]


def test_xdist_shard_items_spread_each_lowering_over_the_workers():
    """Under `pytest -n 4` each lowering's test is four shard items; item j runs shard (j, 4) of the serial
    run's cases, composed with a machine's `--parity-shard I/S` as (I + S*j, S*4)."""
    from parity.front.pytest_parts import lowering_params
    from parity.front.part import compose

    params = lowering_params(["a", "b"], 4)
    assert [p.id for p in params][:5] == ["a-shard1of4", "a-shard2of4", "a-shard3of4", "a-shard4of4", "b-shard1of4"]
    assert [p.values[0].shard for p in params[:4]] == [(0, 4), (1, 4), (2, 4), (3, 4)]
    assert [p.id for p in lowering_params(["a"], 1)] == ["a"] and lowering_params(["a"], 1)[0].values[0].shard is None
    shards = [compose((i, 3), (j, 4)) for i in range(3) for j in range(4)]
    assert sorted(shards) == [(k, 12) for k in range(12)]  # every case of the serial run exactly once
    assert compose(None, (1, 4)) == (1, 4) and compose((2, 3), None) == (2, 3)


def test_gpu_pinning_and_the_profile_only_in_a_session_that_uses_the_plugin(pytester, monkeypatch):
    """A pytest-xdist worker (faked: `workerinput`, `gw1`, torch's pinning recorded) of a session whose tests
    take no parity fixture loads no hypothesis profile and pins no GPU; once a test takes `parity_check`,
    the worker is pinned and the `dflash-<profile>` profile loaded, once."""
    import types

    from hypothesis import settings

    from parity.exec import gpus
    from parity.front import pytest_plugin as plug

    pinned, before = [], settings._current_profile
    monkeypatch.setattr(gpus, "pin_xdist_worker", pinned.append)
    monkeypatch.setenv("PYTEST_XDIST_WORKER", "gw1")
    settings.register_profile("foreign-suite", max_examples=7)
    settings.load_profile("foreign-suite")
    config = pytester.parseconfigure(*plugin_args(), "-p", "no:cacheprovider")
    config.workerinput = {"workercount": 2}
    foreign = types.SimpleNamespace(fixturenames=("tmp_path",), keywords={})
    ours = types.SimpleNamespace(fixturenames=("parity_lowering", "parity_check"), keywords={})
    try:
        plug.pytest_collection_modifyitems(config, [foreign])
        assert pinned == [] and settings._current_profile == "foreign-suite"
        plug.pytest_collection_modifyitems(config, [foreign, ours])
        plug.pytest_collection_modifyitems(config, [ours])
        assert pinned == ["gw1"] and settings._current_profile == f"dflash-{plug.ps.state(config).config_().profile}"
    finally:
        settings.load_profile(before)


def test_a_pytester_session_is_not_an_xdist_worker(pytester, monkeypatch):
    """The inner sessions of these tests are standalone runs: run from an xdist worker, they do not inherit
    its `PYTEST_XDIST_WORKER` (a plugin that reads it, as pytest-benchmark does, took them for workers on
    the H200), and the worker's own environment is unchanged afterwards."""
    monkeypatch.setenv("PYTEST_XDIST_WORKER", "gw3")
    pytester.makepyfile(test_env="import os\n\ndef test_env():\n    assert 'PYTEST_XDIST_WORKER' not in os.environ\n")
    # The plugin left out (-p no:dflash_parity): what is checked is the environment run_subprocess gives, and the
    # plugin's imports (torch) would be most of the run's time.
    assert_outcomes(run_subprocess(pytester, "-p", "no:dflash_parity", "-p", "no:cacheprovider"), passed=1)
    assert os.environ["PYTEST_XDIST_WORKER"] == "gw3"
