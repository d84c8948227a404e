"""`DFLASH_PARITY_CPROFILE=DIR` (parity/exec/host_profile.py): each process of a check writes its cProfile, per role, and
`lab/host_profile_summary.py` sums them; unset, nothing is profiled or written."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from parity.exec import host_profile

ROOT = Path(__file__).resolve().parents[2]


def _busy() -> int:
    return sum(i * i for i in range(20_000))


def test_unset_profiles_nothing(tmp_path, monkeypatch):
    monkeypatch.delenv(host_profile.ENV, raising=False)
    monkeypatch.chdir(tmp_path)
    with host_profile.profiled("check"):
        _busy()
    assert list(tmp_path.iterdir()) == []


def test_set_writes_the_roles_profile_also_when_the_block_raises(tmp_path, monkeypatch):
    import pstats

    monkeypatch.setenv(host_profile.ENV, str(tmp_path / "hp"))
    try:
        with host_profile.profiled("worker"):
            _busy()
            raise KeyError("boom")
    except KeyError:
        pass
    (prof,) = (tmp_path / "hp").iterdir()
    assert prof.name == f"worker-{os.getpid()}.prof"
    assert any(name == "_busy" for (_f, _l, name) in pstats.Stats(str(prof)).stats)  # type: ignore[attr-defined]


def test_a_jobs_check_profiles_its_parent_children_and_workers_and_the_summary_adds_them(tmp_path):
    """An isolated `check --jobs 2` on the CPU: one `check`, two `part` and two `worker` profiles; the summary
    prints each role with its process count, and `--match` keeps the processes that ran a given module."""
    hp = tmp_path / "hp"
    env = dict(os.environ, **{host_profile.ENV: str(hp), "PYTHONPATH": str(ROOT)})
    argv = [sys.executable, "-m", "parity.front.cli", "check", "--device", "cpu", "--lowering", "sdpa", "--lowering",
            "decode_rows", "--max-examples", "2", "--jobs", "2", "--quiet", "--report", str(tmp_path / "r")]
    done = subprocess.run(argv, env=env, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    roles = sorted(p.name.rsplit("-", 1)[0] for p in hp.glob("*.prof"))
    assert roles == ["check", "part", "part", "worker", "worker"], roles
    script = [sys.executable, str(ROOT / "lab" / "host_profile_summary.py"), str(hp), "--top", "5"]
    text = subprocess.run(script, capture_output=True, text=True, timeout=120, check=True).stdout
    for role, n in (("check", 1), ("part", 2), ("worker", 2)):
        assert f"== {role}: {n} processes" in text, text
    only = subprocess.run([*script, "--match", "decode_rows"], capture_output=True, text=True, timeout=120,
                          check=True).stdout
    assert "== worker: 1 processes" in only, only
