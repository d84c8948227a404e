"""The case in flight: written before a case goes to its isolated worker, removed when the worker answers.

`<inflight_dir>/<lowering>.json` holds the case being run, written atomically (a temporary file renamed over the
name), so that it is on disk even if everything dies (the machine, the parent, the OOM killer). It is kept when the
worker died on the case: the next `dflash-parity check` replays it first (`read_inflight`).

Public: `inflight_path`, `read_inflight`, `write_inflight`, `remove_inflight`.
"""

from __future__ import annotations

import json
import os
import tempfile
import time
from pathlib import Path

from oracle.case import Case


def _inflight_name(lowering: str) -> str:
    safe = "".join(ch if ch.isalnum() or ch in "-_." else "_" for ch in lowering)
    return f"{safe}.json"


def inflight_path(inflight_dir: str | Path, lowering: str) -> Path:
    return Path(inflight_dir) / _inflight_name(lowering)


def read_inflight(inflight_dir: str | Path, lowering: str) -> Case | None:
    """The case a previous run left in flight for `lowering` (it died on it), or None."""
    path = inflight_path(inflight_dir, lowering)
    try:
        data = json.loads(path.read_text())
        if data.get("lowering") != lowering:
            return None
        return Case.from_json_dict(data["case"], source=str(path))
    except (OSError, ValueError, KeyError):
        return None


def write_inflight(inflight_dir: str | Path, lowering: str, case: Case) -> Path:
    """The case `lowering`'s worker is about to run, on disk (atomically) before it is sent; its path."""
    path = inflight_path(inflight_dir, lowering)
    text = json.dumps({"lowering": lowering, "case": case.to_json_dict(),
                       "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
                       "note": "the case this lowering's worker was running; kept when it died"}, indent=2) + "\n"
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    return path


def remove_inflight(path: Path | None) -> None:
    """The worker answered: the case is no longer in flight."""
    if path is not None:
        try:
            path.unlink()
        except FileNotFoundError:
            pass
