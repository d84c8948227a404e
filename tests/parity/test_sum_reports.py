"""`scripts/sum_reports.py`: the totals of a GPU record over runs topped up with other seeds."""

from __future__ import annotations

import lzma
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "sum_reports.py"


def _entry(cases, margin, long, fp8, failures=0, interrupted=False):
    e = {"status": "fail" if failures or interrupted else "pass", "cases": cases, "worst_margin": margin,
         "failures": [{}] * failures, "drawn": {"context": {"128-2047": cases - long, "4097-32768": long},
                                               "kv_dtype": {"fp8": fp8, "bf16": cases - fp8}}}
    if interrupted:
        e["interrupted"] = True
    return e


def test_totals_add_cases_keep_the_worst_and_mark_partial_runs(tmp_path):
    a = {"settings": {"seed": 3}, "lowerings": {"x": _entry(100, 0.4, 50, 10, interrupted=True),
                                                "y": {"status": "unavailable", "cases": 0}}}
    b = {"settings": {"seed": 4}, "lowerings": {"x": _entry(300, 0.7, 50, 90, failures=1)}}
    (tmp_path / "1-a-parity.json").write_text(json.dumps(a))
    with lzma.open(tmp_path / "2-b-parity.json.xz", "wt") as f:  # a recompressed record (runs/RECOMPRESSED.md)
        json.dump(b, f)
    out = subprocess.run([sys.executable, str(SCRIPT), str(tmp_path / "1-a-parity.json"),
                          str(tmp_path / "2-b-parity.json.xz")], capture_output=True, text=True, check=True).stdout
    row = next(line for line in out.splitlines() if line.startswith("| x"))
    assert row == "| x * | **400** (1-a: 100 (seed 3); 2-b: 300 (seed 4)) | 1 | 0.70 | 25% | 25% |"
    assert "| y" not in out  # unavailable: not a run of it


def test_an_unreadable_report_is_named(tmp_path):
    bad = tmp_path / "x-parity.json"
    bad.write_text("{not json")
    proc = subprocess.run([sys.executable, str(SCRIPT), str(bad)], capture_output=True, text=True)
    assert proc.returncode == 2 and "x-parity.json: not a readable parity.json" in proc.stderr


def test_help_prints_the_usage_and_no_argument_is_an_error():
    proc = subprocess.run([sys.executable, str(SCRIPT), "--help"], capture_output=True, text=True)
    assert proc.returncode == 0 and "python scripts/sum_reports.py REPORT" in proc.stdout
    proc = subprocess.run([sys.executable, str(SCRIPT)], capture_output=True, text=True)
    assert proc.returncode == 2 and "python scripts/sum_reports.py REPORT" in proc.stderr
