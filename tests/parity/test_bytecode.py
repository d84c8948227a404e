"""The bytecode cache a user opts into (`DFLASH_PARITY_PYCACHE=DIR`, parity/front/startup.py `pycache_where_asked`):
Python's own `PYTHONPYCACHEPREFIX`, set for this process and those it starts, where the variable names a folder."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from parity.front import startup

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def _restore(monkeypatch):
    monkeypatch.setattr(sys, "pycache_prefix", None)
    monkeypatch.setattr(sys, "dont_write_bytecode", sys.dont_write_bytecode)


@pytest.mark.parametrize("env", [{}, {"DFLASH_PARITY_PYCACHE": ""}, {"DFLASH_PARITY_PYCACHE": "off"},
                                 {"DFLASH_PARITY_PYCACHE": "/x", "PYTHONPYCACHEPREFIX": "/mine"}])
def test_nothing_changes_unless_the_folder_is_named_and_the_user_set_no_prefix(env):
    before = dict(env)
    assert startup.pycache_where_asked(env) is None
    assert env == before and sys.pycache_prefix is None


def test_the_named_folder_is_the_cache_for_this_process_and_those_it_starts(tmp_path, monkeypatch):
    monkeypatch.setattr(sys, "dont_write_bytecode", True)
    env = {startup.PYCACHE_ENV: str(tmp_path / "c"), "PYTHONDONTWRITEBYTECODE": "1"}
    assert startup.pycache_where_asked(env) == tmp_path / "c"
    assert sys.pycache_prefix == env["PYTHONPYCACHEPREFIX"] == str(tmp_path / "c")
    assert not sys.dont_write_bytecode and "PYTHONDONTWRITEBYTECODE" not in env  # naming the folder is the opt-in


def test_the_opted_in_cache_holds_the_bytecode_for_the_next_process(tmp_path):
    """End to end: a package with no bytecode, PYTHONDONTWRITEBYTECODE set, the folder named. The first process
    writes the bytecode into the folder (not next to the sources); without the opt-in nothing is written."""
    src = tmp_path / "src" / "dflash_probe_pkg"
    src.mkdir(parents=True)
    (src / "__init__.py").write_text("VALUE = 1\n")
    code = textwrap.dedent("""
        from parity.front import startup
        print(startup.pycache_where_asked())
        import dflash_probe_pkg
    """)
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": f"{tmp_path / 'src'}:{ROOT}", "PYTHONDONTWRITEBYTECODE": "1",
           "HOME": str(tmp_path)}
    run = lambda e: subprocess.run([sys.executable, "-c", code], env=e, capture_output=True, text=True, cwd=ROOT,
                                   timeout=120)
    res = run(env)
    assert res.returncode == 0 and res.stdout.strip() == "None", res.stderr
    assert not list(tmp_path.rglob("*.pyc"))
    res = run(dict(env, **{startup.PYCACHE_ENV: str(tmp_path / "cache")}))
    assert res.returncode == 0 and res.stdout.strip() == str(tmp_path / "cache"), res.stderr
    cached = [p for p in (tmp_path / "cache").rglob("*.pyc") if "dflash_probe_pkg" in str(p)]
    assert cached and not (src / "__pycache__").exists()


def test_the_pytest_plugin_asks_for_the_cache_before_the_conftests_import_torch(monkeypatch):
    """pytest's front end too: the plugin asks before the initial conftests are imported, so the session's own
    torch import and its pytest-xdist workers (which inherit the environment) use the cache."""
    from parity.front import pytest_plugin

    asked = []
    monkeypatch.setattr(startup, "pycache_where_asked", lambda *a: asked.append(a))
    hook = pytest_plugin.pytest_load_initial_conftests(None, None, [])
    next(hook)  # up to the point where pytest imports the conftests
    assert asked == [()]
    hook.close()
