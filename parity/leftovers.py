"""What plugin code leaves behind once its work is done: the processes a lowering starts in its isolated worker.

A lowering's code may start processes (a `run()` that forks, or starts a `sleep`): they outlived `check` and held its
output open, so a CI step reading that pipe never ended. `own_group()` / `stop_group(pgid)`: an isolated worker (and
the plugin probe) leads a process group of its own (`parity.isolation`); whatever its lowering starts there is in
that group, and the whole group is killed when the worker is stopped or replaced (a hook past its timeout, a crash,
the end of the run). A process that leaves the group on purpose (`setsid`) is not followed.

Public: `own_group`, `stop_group`.
"""

from __future__ import annotations

import os
import signal


def own_group() -> None:
    """Make this process the leader of a process group of its own (best effort)."""
    try:
        os.setpgid(0, 0)
    except OSError:
        pass


def stop_group(pgid: int | None) -> bool:
    """SIGKILL the process group `pgid` (an isolated worker's: the worker and what its lowering started); True
    when some process was in it. Never this process's own group."""
    if not pgid or pgid <= 1 or pgid == os.getpgrp():
        return False
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        return False
    return True
