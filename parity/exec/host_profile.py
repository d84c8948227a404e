"""Where a check's processes spend host time on a GPU runner: `DFLASH_PARITY_CPROFILE=DIR`.

With the variable set, each process of a check profiles itself with `cProfile` and writes
`DIR/<role>-<pid>.prof` when it ends: `check` for a `dflash-parity check` process (with `--jobs`, the parent
that runs the children), `part` for a `--jobs` child (one lowering or shard: its draws, its bookkeeping, and in
an isolated check its round trips to its worker), `worker` for an isolated case worker (the case itself).
`scripts/host_profile_summary.py DIR` sums them per role. cProfile slows Python-heavy code (a tracing hook on every call): time such a run for its shares, not
for its rate. Unset (the default), nothing is profiled and nothing is written.

Public: `ENV`, `profiled(role)` (a context manager).
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import Iterator

ENV = "DFLASH_PARITY_CPROFILE"


@contextlib.contextmanager
def profiled(role: str) -> Iterator[None]:
    """Profile the block when `DFLASH_PARITY_CPROFILE` names a folder; write `<role>-<pid>.prof` there after it
    (also when it raises or exits). A folder that cannot be written is skipped silently: a profile is a helper."""
    folder = os.environ.get(ENV, "").strip()
    if not folder:
        yield
        return
    import cProfile

    prof = cProfile.Profile()
    prof.enable()
    try:
        yield
    finally:
        prof.disable()
        with contextlib.suppress(OSError):
            Path(folder).mkdir(parents=True, exist_ok=True)
            prof.dump_stats(str(Path(folder) / f"{role}-{os.getpid()}.prof"))
