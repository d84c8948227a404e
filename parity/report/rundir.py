"""The report directory across a `check`: never a stale or half-written verdict in it.

`retire(report_dir)` runs as soon as the run holds the directory (`parity.report.directory.taken`), before it
writes a byte: the previous run's verdict files (`VERDICT_FILES`: parity.json, summary.md, junit.xml,
gate.md) move to `previous/` (replacing what was there) by renames only, which a full disk still allows;
where `previous/` cannot be made (a full disk: a new directory needs a block), each goes to
`previous.<name>` beside itself. `begin(report_dir, run_id, started)` runs before the first case: the
`IN_PROGRESS` marker (JSON: run_id, started, pid; an empty file where the disk has no room for its text)
first, then the verdict files retired again. `end(report_dir, run_id)` runs after the verdict is written
(parity.json last, atomically) and removes the marker. So a run that ends any other way (killed, a full
disk, a crash outside any case, bad input found after the directory was taken) leaves no parity.json, and
the marker once it got that far: the merge gate refuses such a directory (`in_progress`, or no report)
instead of reading the previous run's verdict.

Public: `VERDICT_FILES`, `MARKER`, `PREVIOUS`, `retire`, `begin`, `end`, `in_progress`.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from parity.report.writing import atomic_write

VERDICT_FILES = ("parity.json", "summary.md", "junit.xml", "gate.md")
MARKER = "IN_PROGRESS"
PREVIOUS = "previous"


def retire(report_dir: str | Path) -> list[Path]:
    """Move the verdict files in `report_dir` out of where the gate reads them (see the module docstring);
    where each went. OSError when a rename fails (a read-only file system)."""
    d = Path(report_dir)
    old = [d / name for name in VERDICT_FILES if (d / name).is_file()]
    if not old:
        return []
    prev = d / PREVIOUS
    try:
        prev.mkdir(exist_ok=True)
        into = prev if prev.is_dir() and not prev.is_symlink() else None
    except OSError:  # no room for a new directory
        into = None
    moved = []
    for f in old:
        to = into / f.name if into is not None else d / f"{PREVIOUS}.{f.name}"
        os.replace(f, to)
        moved.append(to)
    return moved


def begin(report_dir: str | Path, run_id: str, started: str) -> Path:
    """Mark `report_dir` in progress (creating it), then retire the previous verdict files (`retire`).
    OSError when even that fails (the marker, empty, is left where it could be created)."""
    d = Path(report_dir)
    d.mkdir(parents=True, exist_ok=True)
    marker = d / MARKER
    try:
        atomic_write(marker, json.dumps({"run_id": run_id, "started": started, "pid": os.getpid(),
                                         "note": "a dflash-parity check is writing this report (or died doing so): "
                                                 "no verdict here until this file is gone"}, indent=2) + "\n")
    except OSError:
        try:  # an empty file needs no data block: the directory is marked even on a full disk
            os.close(os.open(marker, os.O_WRONLY | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0), 0o644))
        finally:
            retire(d)
        raise
    retire(d)
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
