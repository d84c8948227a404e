"""`scripts/compare_figures.py`: the H200 records' check that a change moved no figure (exit 0 when every report's
per-lowering figures equal the baseline's, 1 otherwise, each difference named), over plain, gzipped and xz reports."""

from __future__ import annotations

import gzip
import json
import lzma
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "compare_figures.py"


def _report(**over) -> dict:
    entry = {"status": "pass", "cases": 500, "passed": 500, "unsupported": 0, "worst_ulp": 0.75, "worst_rel_l2": 2.5e-3,
             "worst_margin": 0.25}
    return {"lowerings": {"hybrid_paged": {**entry, **over}, "sdpa": dict(entry)}}


def _run(*paths) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), *map(str, paths)], capture_output=True, text=True)


def test_equal_figures_pass_across_compressions(tmp_path):
    base = tmp_path / "base.json.gz"
    with gzip.open(base, "wt") as f:
        json.dump(_report(), f)
    other = tmp_path / "other.json.xz"
    with lzma.open(other, "wt") as f:
        json.dump(_report(), f)
    plain = tmp_path / "plain.json"
    plain.write_text(json.dumps(_report()))
    out = _run(base, other, plain)
    assert out.returncode == 0, out.stdout + out.stderr


def test_a_moved_margin_or_a_missing_lowering_fails_and_is_named(tmp_path):
    base = tmp_path / "base.json"
    base.write_text(json.dumps(_report()))
    moved = tmp_path / "moved.json"
    moved.write_text(json.dumps(_report(worst_margin=0.2500001)))
    out = _run(base, moved)
    assert out.returncode == 1 and "hybrid_paged" in out.stdout and "sdpa" not in out.stdout.split("differs")[1]
    fewer = tmp_path / "fewer.json"
    fewer.write_text(json.dumps({"lowerings": {"sdpa": _report()["lowerings"]["sdpa"]}}))
    out = _run(base, fewer)
    assert out.returncode == 1 and "hybrid_paged" in out.stdout
