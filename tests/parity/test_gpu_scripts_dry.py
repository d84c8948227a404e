"""The scripts that stay in the product (`scripts/`: what a user or CI runs) run their plumbing on the CPU, so a
broken script shows here and not as a wasted device call. The lab's instruments (`lab/`) are not run here:
lab/README.md says what each measured and where its result is kept."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TESTS = ROOT / "tests"


def _run(*argv: str, env: dict | None = None) -> str:
    res = subprocess.run([sys.executable, *argv], cwd=ROOT, capture_output=True, text=True, timeout=240, env=env)
    assert res.returncode == 0, res.stdout + res.stderr
    return res.stdout


def untested_scripts(scripts: list[str], test_texts: list[str]) -> list[str]:
    """The scripts no test file runs: none names it as `scripts/NAME` or `"scripts" / "NAME"`."""
    return [s for s in scripts if not any(f"scripts/{s}" in text or f'"scripts" / "{s}"' in text
                                          for text in test_texts)]


def test_every_script_in_the_product_is_run_by_a_test():
    scripts = sorted(p.name for p in (ROOT / "scripts").iterdir() if p.is_file())
    texts = [p.read_text(errors="replace") for p in TESTS.rglob("*.py")]
    assert untested_scripts(scripts, texts) == [], "a script in scripts/ needs a CPU run in a test (or lab/)"
    assert untested_scripts(["dev", "new_tool.py", "x.py"], ['ROOT / "scripts" / "dev"', "--profile dev", "x.py"]) == [
        "new_tool.py", "x.py"]


def test_the_oracle_ptx_script_compiles_the_kernel_for_sm90(tmp_path):
    out = _run("scripts/oracle_ptx.py", str(tmp_path / "k.ptx"))
    assert "lines" in out and ".entry _oracle_kernel" in (tmp_path / "k.ptx").read_text()


def test_the_precision_script_sets_a_lowering_beside_the_rounding_models(tmp_path):
    from tests.oracle.oracle_cases import build_case

    case = tmp_path / "case.json"
    case.write_text(json.dumps(build_case((5, 40), 4, 2, 2, 64, 16).to_json_dict()))
    out = _run("scripts/fa2_precision.py", "--lowering", "context", str(case))
    for line in ("context ", "the yardstick (working dtype)", "model: P rounded ", "model: scores rounded",
                 "worst element of context"):
        assert line in out, out


def test_the_draw_distribution_script_prints_each_lowerings_draws():
    out = _run("scripts/draw_distribution.py", "--device", "cpu", "--profile", "quick", "sdpa")
    assert out.startswith("sdpa") and " cases " in out and "extremes:" in out, out


def test_the_prebuild_script_parses_its_options_without_a_gpu():
    out = _run("scripts/flashinfer_prebuild.py", "--help")
    assert "--only" in out and "--jobs" in out and "--list" in out


def test_the_bench_plot_script_reads_a_saved_bench_json(tmp_path):
    bench = tmp_path / "bench.json"
    row = {"label": "r", "head": {"heads": "16/2"}, "cells": {"1": {"value": 1.0, "text": "1.0"}}, "tail": {},
           "parity": "pass"}
    bench.write_text(json.dumps({"tables": [{"id": "t1", "title": "T", "unit": "us", "columns": [1], "rows": [row]}]}))
    out = _run("scripts/bench_plot.py", str(bench), str(tmp_path / "png"))
    assert out.startswith("t1: "), out  # written, or the reason it was skipped (matplotlib missing)
