"""Run a script's measuring children side by side and collect the one JSON line each prints last (used by
`gpu_profiler_cost.py` and `gpu_profiler_first_start.py`)."""

from __future__ import annotations

import json
import subprocess


def json_children(cmd: list[str], count: int, env: dict) -> list[dict]:
    """Start `count` copies of `cmd` at once; each child's last stdout line that starts with `{`, parsed. A child
    that exits non-zero or prints none is reported (its last stderr lines) and left out."""
    kids = [subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
            for _ in range(count)]
    out = []
    for k in kids:
        so, se = k.communicate()
        lines = [ln for ln in so.splitlines() if ln.startswith("{")]
        if k.returncode or not lines:
            print(f"  a child failed (exit {k.returncode}): {se.strip().splitlines()[-3:]}")
            continue
        out.append(json.loads(lines[-1]))
    return out
