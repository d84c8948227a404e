"""`parity.exec.bytecode`: a bytecode cache for a torch installed without bytecode that cannot take any.

On the H200's image torch has no `__pycache__` and `PYTHONDONTWRITEBYTECODE=1` is set (run 68), so every
process compiles its sources at import. Each check fails when the cache is wrong in the way it names: set up
where Python caches by itself, or against the user's choice, or not set up where the user opted in."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from parity.exec import bytecode

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def pkg(tmp_path, monkeypatch):
    """A package `dflash_probe_pkg` with no bytecode, importable from `tmp_path/src`."""
    src = tmp_path / "src" / "dflash_probe_pkg"
    src.mkdir(parents=True)
    (src / "__init__.py").write_text("VALUE = 1\n")
    monkeypatch.syspath_prepend(str(tmp_path / "src"))
    monkeypatch.setattr(sys, "pycache_prefix", None)
    monkeypatch.setattr(sys, "dont_write_bytecode", False)
    return src


def test_nothing_changes_where_python_caches_the_bytecode_itself(pkg):
    env = {}
    assert bytecode.can_take_bytecode(pkg)
    assert bytecode.cache_bytecode(env, probe="dflash_probe_pkg") is None and env == {}
    (pkg / "__pycache__").mkdir()
    (pkg / "__pycache__" / f"__init__.{sys.implementation.cache_tag}.pyc").write_bytes(b"")
    assert bytecode.has_bytecode(pkg)


def test_a_read_only_package_without_bytecode_gets_the_cache(pkg, tmp_path, monkeypatch):
    monkeypatch.setattr(bytecode, "can_take_bytecode", lambda d: False)  # root can write anywhere: faked
    said, env = [], {bytecode.ENV: str(tmp_path / "cache")}
    where = bytecode.cache_bytecode(env, said.append, probe="dflash_probe_pkg")
    assert where == tmp_path / "cache" and sys.pycache_prefix == str(where)
    assert env["PYTHONPYCACHEPREFIX"] == str(where)  # every process this one starts
    assert len(said) == 1 and "cached in" in said[0]
    assert bytecode.cache_bytecode(dict(env), probe="dflash_probe_pkg") is None  # a prefix is set now: kept


@pytest.mark.parametrize("env", [{"PYTHONPYCACHEPREFIX": "/elsewhere"}, {bytecode.ENV: "off"}])
def test_the_users_own_prefix_or_off_wins(pkg, monkeypatch, env):
    monkeypatch.setattr(bytecode, "can_take_bytecode", lambda d: False)
    assert bytecode.cache_bytecode(dict(env), probe="dflash_probe_pkg") is None and sys.pycache_prefix is None


def test_no_bytecode_written_unless_the_user_names_the_folder(pkg, tmp_path, monkeypatch):
    """PYTHONDONTWRITEBYTECODE is the user's: only naming the folder (the opt-in) caches, and `check` says so."""
    monkeypatch.setattr(sys, "dont_write_bytecode", True)
    said = []
    assert bytecode.cache_bytecode({}, said.append, probe="dflash_probe_pkg", hint=True) is None
    assert len(said) == 1 and "PYTHONDONTWRITEBYTECODE" in said[0] and bytecode.ENV in said[0]
    assert bytecode.cache_bytecode({}, said.append, probe="dflash_probe_pkg") is None and len(said) == 1
    env = {bytecode.ENV: str(tmp_path / "c"), "PYTHONDONTWRITEBYTECODE": "1"}
    assert bytecode.cache_bytecode(env, probe="dflash_probe_pkg") == tmp_path / "c"
    assert not sys.dont_write_bytecode and "PYTHONDONTWRITEBYTECODE" not in env


def test_the_opted_in_cache_holds_the_bytecode_for_the_next_process(tmp_path):
    """End to end, as on the H200: a package with no bytecode, PYTHONDONTWRITEBYTECODE set, the folder named.
    The first process writes the bytecode into the folder (not next to the sources); without the opt-in
    nothing is written."""
    src = tmp_path / "src" / "dflash_probe_pkg"
    src.mkdir(parents=True)
    (src / "__init__.py").write_text("VALUE = 1\n")
    code = textwrap.dedent("""
        import sys
        from parity.exec import bytecode
        print(bytecode.cache_bytecode(probe="dflash_probe_pkg"))
        import dflash_probe_pkg
    """)
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": f"{tmp_path / 'src'}:{ROOT}", "PYTHONDONTWRITEBYTECODE": "1",
           "HOME": str(tmp_path)}
    run = lambda e: subprocess.run([sys.executable, "-c", code], env=e, capture_output=True, text=True, cwd=ROOT,
                                   timeout=120)
    res = run(env)
    assert res.returncode == 0 and res.stdout.strip() == "None", res.stderr
    assert not list(tmp_path.rglob("*.pyc"))
    res = run(dict(env, **{bytecode.ENV: str(tmp_path / "cache")}))
    assert res.returncode == 0 and res.stdout.strip() == str(tmp_path / "cache"), res.stderr
    cached = [p for p in (tmp_path / "cache").rglob("*.pyc") if "dflash_probe_pkg" in str(p)]
    assert cached and not (src / "__pycache__").exists()


@pytest.mark.parametrize("argv, hint", [(["check", "--lowering", "no_such"], True),
                                        (["check", "--quiet", "--lowering", "no_such"], False),
                                        (["list", "--device", "tpu"], False)])
def test_the_cli_asks_for_the_cache_before_anything_and_hints_only_in_a_check_that_talks(argv, hint, monkeypatch,
                                                                                          capsys):
    asked = []
    monkeypatch.setattr(bytecode, "cache_bytecode", lambda **kw: asked.append(kw["hint"]))
    from parity.front import cli

    assert cli.main(argv) == 2  # a usage error, after the cache was asked for
    assert asked == [hint]
    capsys.readouterr()


def test_the_pytest_plugin_asks_for_the_cache_before_the_conftests_import_torch(monkeypatch):
    """pytest's front end too: the plugin asks before the initial conftests are imported, so the session's own
    torch import and its pytest-xdist workers (which inherit the environment) use the cache."""
    from parity.front import pytest_plugin

    asked = []
    monkeypatch.setattr(bytecode, "cache_bytecode", lambda *a, **kw: asked.append(kw))
    hook = pytest_plugin.pytest_load_initial_conftests(None, None, [])
    next(hook)  # up to the point where pytest imports the conftests
    assert asked == [{"chosen_only": True}]  # a test session is changed only where the user named the folder
    hook.close()


def test_chosen_only_changes_nothing_unless_the_folder_is_named(pkg, tmp_path, monkeypatch):
    monkeypatch.setattr(bytecode, "can_take_bytecode", lambda d: False)  # where the CLI would cache by default
    assert bytecode.cache_bytecode({}, probe="dflash_probe_pkg", chosen_only=True) is None
    assert sys.pycache_prefix is None
    env = {bytecode.ENV: str(tmp_path / "c")}
    assert bytecode.cache_bytecode(env, probe="dflash_probe_pkg", chosen_only=True) == tmp_path / "c"
