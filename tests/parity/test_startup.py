"""The front ends' start-up (parity/front/startup.py) runs for the verbs that run cases, and only for them: `list`
and `gate` start no process machinery; the exit codes are defined once (parity/front/exit_codes.py). Each check is
shown to catch a planted violation."""

from __future__ import annotations

import multiprocessing.process
import os
import re
import subprocess
from pathlib import Path

import pytest

from parity.exec import prefork, shared_compiles
from parity.front import cli, startup

ROOT = Path(__file__).resolve().parents[2]


def machinery_started(monkeypatch, run) -> list[str]:
    """What `run()` started of the process machinery: the start-up, a prefork, the shared compile cache's selection,
    a subprocess, a fork, a multiprocessing process (each is still started: only seen)."""
    seen: list[str] = []

    def spy(owner, name: str, what: str) -> None:
        real = getattr(owner, name)

        def wrapper(*a, **kw):
            seen.append(what)
            return real(*a, **kw)
        monkeypatch.setattr(owner, name, wrapper)

    spy(startup, "start", "start-up")
    spy(prefork.Prefork, "launch", "prefork")
    spy(shared_compiles, "share_compiles", "shared compile cache")
    spy(subprocess.Popen, "__init__", "subprocess")
    spy(os, "fork", "fork")
    spy(multiprocessing.process.BaseProcess, "start", "multiprocessing")
    run()
    return seen


def test_list_starts_no_process_machinery(monkeypatch, capsys):
    assert machinery_started(monkeypatch, lambda: cli.main(["list", "--device", "cpu"])) == []
    assert "sdpa" in capsys.readouterr().out


def test_gate_starts_no_process_machinery(monkeypatch, tmp_path, capsys):
    code = []
    assert machinery_started(monkeypatch, lambda: code.append(cli.main(
        ["gate", str(tmp_path / "new"), "--baseline", str(tmp_path / "old")]))) == []
    assert code == [2] and "--baseline" in capsys.readouterr().err  # bad input, said: the verb ran


def test_a_verb_that_runs_cases_runs_the_start_up(monkeypatch, capsys):
    assert "start-up" in machinery_started(monkeypatch, lambda: cli.main(["check", "--help"]))
    capsys.readouterr()


def test_a_start_up_run_for_every_verb_is_caught(monkeypatch, capsys):
    """The planted violation: `list` asking for the start-up, as `main` once did for every verb."""
    monkeypatch.setitem(cli.VERBS, "list", cli.Verb(cli.cmd_list, machinery=True))
    monkeypatch.setattr(prefork, "start_early", lambda *a: None)
    seen = machinery_started(monkeypatch, lambda: cli.main(["list", "--device", "cpu"]))
    assert "start-up" in seen and "shared compile cache" in seen, seen
    capsys.readouterr()


# ---- the exit codes, defined once ----------------------------------------------------------------------------
_CODE = r"EXIT_(?:OK|FAIL|USAGE|INTERRUPTED)"
_DEFINITION = re.compile(rf"^\s*({_CODE}(?:\s*,\s*{_CODE})*)\s*=", re.M)


def exit_code_definitions(root: Path = ROOT) -> list[str]:
    """`file: names` for every module of the product that assigns an exit code of `dflash-parity` (`EXIT_OK`, ...)
    but `parity/front/exit_codes.py`."""
    found = []
    for pkg in ("oracle", "lowerings", "strategies", "parity"):
        for f in sorted((root / pkg).rglob("*.py")):
            rel = str(f.relative_to(root))
            if rel == "parity/front/exit_codes.py":
                continue
            for m in _DEFINITION.finditer(f.read_text()):
                found.append(f"{rel}: {m.group(1)}")
    return found


def test_the_exit_codes_are_defined_once():
    assert exit_code_definitions() == []


def test_a_second_definition_of_an_exit_code_is_caught(tmp_path):
    (tmp_path / "parity" / "front").mkdir(parents=True)
    (tmp_path / "parity" / "front" / "exit_codes.py").write_text("EXIT_OK, EXIT_FAIL = 0, 1\n")
    (tmp_path / "parity" / "front" / "cli.py").write_text("import x\nEXIT_OK, EXIT_FAIL, EXIT_USAGE = 0, 1, 2\n")
    assert exit_code_definitions(tmp_path) == ["parity/front/cli.py: EXIT_OK, EXIT_FAIL, EXIT_USAGE"]


def _imports_torch(module: str, plant: str = "") -> bool:
    """Whether importing `module` in a fresh interpreter imports torch (`plant`: code run first, a seeded violation)."""
    code = f"import sys\n{plant}\nimport {module}\nsys.exit(0 if 'torch' in sys.modules else 3)"
    res = subprocess.run([os.sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert res.returncode in (0, 3), res.stderr
    return res.returncode == 0


@pytest.mark.parametrize("module", ["parity.front.startup", "parity.front.pytest_plugin"])
def test_the_start_up_imports_no_torch(module):
    """The start-up launches the `--jobs` prefork before torch is imported (its imports then overlap this process's),
    and a pytest session loading the plugin (a foreign suite's, xdist's controller) pays no torch import for it: the
    start-up's module and the plugin's import none (importing `parity.exec.interrupt` once pulled the engine's ports,
    and torch with them, into both)."""
    assert not _imports_torch(module)


def test_a_start_up_that_imports_torch_is_caught():
    """The check above fails on a start-up whose imports reach torch (here: the engine's ports imported first by a
    module the start-up imports, as `parity.exec.interrupt` did)."""
    assert _imports_torch("parity.front.startup", plant="import parity.exec.interrupt, parity.engine.ports")
