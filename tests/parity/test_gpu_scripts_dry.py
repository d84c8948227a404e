"""The GPU measuring scripts of issue 18 run their plumbing on the CPU (`--dry` / `--device cpu`), so a broken
script shows here and not as a wasted device call."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _run(*argv: str) -> str:
    res = subprocess.run([sys.executable, *argv], cwd=ROOT, capture_output=True, text=True, timeout=240)
    assert res.returncode == 0, res.stdout + res.stderr
    return res.stdout


def test_the_profiler_first_start_script_runs_dry():
    out = _run("scripts/gpu_profiler_first_start.py", "--dry", "--procs", "1", "2", "--modes", "plain", "kernelnames",
               "cupti", "cprofile")
    assert "== 1 proc(s) plain" in out and "== 1 proc(s) kernelnames" in out and "== 1 proc(s) cupti" in out
    assert "== 1 proc(s) cprofile" in out and "by cumulative time" in out
    assert "== 2 proc(s) plain" in out and ", 2 ok)" in out


def test_the_profiler_cost_script_runs_dry():
    out = _run("scripts/gpu_profiler_cost.py", "--dry", "--procs", "2", "--iters", "2")
    assert "== 2 process(es), 2 reported" in out


def test_the_oracle_ptx_script_compiles_the_kernel_for_sm90(tmp_path):
    out = _run("scripts/oracle_ptx.py", str(tmp_path / "k.ptx"))
    assert "lines" in out and ".entry _oracle_kernel" in (tmp_path / "k.ptx").read_text()
