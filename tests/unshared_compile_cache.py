"""A mutant of `parity.exec.shared_compile_cache`: Triton's file cache as Triton keeps it (a process that misses
compiles, whatever the others do), with the shared cache's log of each compile (`DFLASH_PARITY_COMPILE_LOG`), so
both sides count their compiles the same way. `tests/parity/test_shared_compiles.py` shows the shared cache's test
failing on it; on a GPU it was the A side of the A/B in docs/gpu/2026-12-03-h200-session22.md:

    PYTHONPATH=.:$PYTHONPATH TRITON_CACHE_MANAGER=tests.unshared_compile_cache:UnsharedCompileCache dflash-parity check ...
"""

from __future__ import annotations

import os

from parity.exec.shared_compile_cache import SharedCompileCache


class UnsharedCompileCache(SharedCompileCache):
    """Never waits: the lock file is opened, never locked, so every miss compiles here."""

    def _acquire(self, wait: bool = True) -> int:
        return os.open(self._lock_path, os.O_RDWR | os.O_CREAT, 0o666)
