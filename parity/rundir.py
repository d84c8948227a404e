"""The report directory across a `check`: never a stale or half-written verdict in it.

`begin(report_dir, run_id, started)` runs before the first case: the previous run's verdict files
(`VERDICT_FILES`: parity.json, summary.md, junit.xml, gate.md) move to `previous/` (replacing what was
there), and an `IN_PROGRESS` marker (JSON: run_id, started, pid) is written. `end(report_dir, run_id)`
runs after the verdict is written (parity.json last) and removes the marker. So a run that ends any other
way (killed, a full disk, a crash outside any case) leaves the marker and no parity.json: the merge gate
refuses such a directory (`in_progress`) instead of reading the previous run's verdict.

Public: `VERDICT_FILES`, `MARKER`, `PREVIOUS`, `begin`, `end`, `in_progress`.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

VERDICT_FILES = ("parity.json", "summary.md", "junit.xml", "gate.md")
MARKER = "IN_PROGRESS"
PREVIOUS = "previous"


def begin(report_dir: str | Path, run_id: str, started: str) -> Path:
    """Mark `report_dir` in progress (creating it), the previous verdict files moved to `previous/`."""
    from parity.report import atomic_write

    d = Path(report_dir)
    d.mkdir(parents=True, exist_ok=True)
    marker = d / MARKER
    atomic_write(marker, json.dumps({"run_id": run_id, "started": started, "pid": os.getpid(),
                                     "note": "a dflash-parity check is writing this report (or died doing so): "
                                             "no verdict here until this file is gone"}, indent=2) + "\n")
    old = [d / name for name in VERDICT_FILES if (d / name).is_file()]
    if old:
        prev = d / PREVIOUS
        prev.mkdir(exist_ok=True)
        for f in old:
            os.replace(f, prev / f.name)
    return marker


def end(report_dir: str | Path, run_id: str) -> None:
    """Remove the marker `begin` wrote for `run_id` (another run's marker stays)."""
    marker = Path(report_dir) / MARKER
    info = in_progress(report_dir)
    if info is not None and info.get("run_id") == run_id:
        marker.unlink(missing_ok=True)


def in_progress(report_dir: str | Path) -> dict[str, Any] | None:
    """The marker's content when `report_dir` is marked in progress (`{}` if unreadable), else None."""
    marker = Path(report_dir) / MARKER
    if not marker.exists():
        return None
    try:
        data = json.loads(marker.read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}
