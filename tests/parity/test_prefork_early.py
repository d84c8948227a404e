"""The prefork launched when `check --jobs N` starts (`parity.front.startup.start` from `parity.front.cli.main`,
`parity.exec.prefork.start_early`).

The prefork's imports came after the parent's own, before the first child. Launched first, they overlap. Each check
fails when the early launch is wrong in the way it names: launched where no run can use it, adopted with another
environment, or left running."""

from __future__ import annotations

import pytest

from parity.exec import prefork, shared_compiles
from parity.front import cli, startup
from parity.front.part import CHILD_PRELOAD
from tests.parity.test_prefork import run_two_jobs


@pytest.mark.parametrize("argv, launched", [
    (["check", "--jobs", "4"], True),
    (["check", "--plugin", "x.py", "--jobs=3", "--lowering", "sdpa"], True),
    (["--plugin", "x.py", "check", "--jobs=3"], False),  # not a check's command line (a usage error to come)
    (["check", "--jobs", "4", "--jobs-start", "spawn"], False),
    (["check", "--jobs", "4", "--jobs-start=spawn"], False),
    (["check", "--jobs", "1"], False),
    (["check"], False),
    (["check", "--jobs", "four"], False),  # the parser's error to give, not this guess's
    (["check", "--jobs", "4", "--help"], False),
    (["list", "--jobs", "4"], False),
])
def test_the_prefork_is_launched_early_only_for_a_check_with_jobs_that_forks(argv, launched, monkeypatch):
    got = []
    monkeypatch.setattr(prefork, "start_early", lambda env, preload: got.append((env, preload)) or object())
    monkeypatch.setattr(shared_compiles, "share_compiles", lambda: True)  # this process's environment untouched
    started = startup.start(*cli.jobs_asked(argv))
    assert bool(got) is launched and started.launched_prefork is launched
    if launched:  # the children's environment (thread caps) and modules, as `parity.front.controller` gives them
        from parity.exec import pool

        assert got[0] == (pool.child_env(int(argv[argv.index("--jobs") + 1]) if "--jobs" in argv else 3),
                          CHILD_PRELOAD)


def _launched(monkeypatch) -> list:
    procs = []
    real = prefork.Prefork.launch

    def launch(self, env, exclude=()):
        out = real(self, env, exclude)
        procs.append(self.proc)
        return out

    monkeypatch.setattr(prefork.Prefork, "launch", launch)
    return procs


def test_a_check_adopts_the_prefork_launched_when_it_started(tmp_path, capsys, monkeypatch):
    procs = _launched(monkeypatch)
    code, said = run_two_jobs(tmp_path, capsys)
    assert code == 0, said
    assert len(procs) == 1, "one prefork, launched early and adopted (no second launch)"
    assert "launched when the command started, so the run waited" in said, said
    assert procs[0].poll() is not None and not prefork._EARLY  # closed at the end


def test_an_early_prefork_with_another_environment_is_stopped_not_adopted(monkeypatch):
    """A prefork imports with the environment it was launched with (the thread caps the libraries read): one
    launched with other values must not serve the children. MPS's pipe, set per child, may differ."""
    import os

    procs = _launched(monkeypatch)
    base = dict(os.environ, OMP_NUM_THREADS="3")
    prefork.start_early(base)
    assert prefork.adopt_early(dict(base, CUDA_MPS_PIPE_DIRECTORY="/tmp/x")) is not None  # same but the pipe
    prefork.start_early(base)
    assert prefork.adopt_early(dict(base, OMP_NUM_THREADS="4")) is None
    assert procs[1].wait(timeout=10) is not None and not prefork._EARLY
    procs[0].kill()
    procs[0].wait()


def test_an_early_prefork_no_run_adopts_is_stopped_when_the_command_ends(tmp_path, capsys, monkeypatch):
    procs = _launched(monkeypatch)
    # one lowering: nothing to fork, so the run never asks for the prefork launched for --jobs 2
    code = cli.main(["check", "--lowering", "sdpa", "--max-examples", "2", "--no-isolate", "--device", "cpu",
                     "--jobs", "2", "--report", str(tmp_path / "one")])
    assert code == 0, capsys.readouterr()
    # a usage error after the launch
    code = cli.main(["check", "--lowering", "sdpa", "--jobs", "2", "--limit", "no_such_field=1",
                     "--report", str(tmp_path / "bad")])
    assert code == 2
    assert len(procs) == 2 and all(p.poll() is not None for p in procs) and not prefork._EARLY
