"""Triton's file cache, shared by the processes of a run: the first to miss an entry compiles it, the others
wait for it and load it. Why and how: `parity.exec.shared_compiles`, which selects it (`TRITON_CACHE_MANAGER`)."""

from __future__ import annotations

import contextlib
import fcntl
import os
import time

from triton.runtime.cache import FileCacheManager

LOCK_NAME = "parity.lock"
LOG_ENV = "DFLASH_PARITY_COMPILE_LOG"  # a file: each compile and each wait appended as one line (for the records)
WAIT_S = 600.0  # a waiter compiles itself after this: far past any compile seen (seconds, on a loaded host)
_POLL_S = (0.005, 0.05)  # first and longest sleep between tries of a held lock

_no_wait = False  # under `not_waiting()`: a kernel another process is compiling raises Busy instead of waiting
_held_here: set[str] = set()  # lock files this process holds (a second miss on one must not wait for itself)
compiled_here: list[str] = []  # the entries this process held the lock for and stored ("KEY/FILE"), in order


class Busy(Exception):
    """A kernel another process is compiling now, missed under `not_waiting()` (`parity.exec.precompile`: do another
    one meanwhile, load this one later)."""


@contextlib.contextmanager
def not_waiting():
    """Within: a miss on a kernel that another process holds the lock for raises `Busy` (nothing is changed,
    the compile can be asked for again) instead of waiting; a miss nobody holds is compiled here as usual."""
    global _no_wait
    before, _no_wait = _no_wait, True
    try:
        yield
    finally:
        _no_wait = before


class SharedCompileCache(FileCacheManager):
    """Triton's `FileCacheManager`; a miss makes this process the one that compiles the entry, or waits for
    the process that does (`parity.exec.shared_compiles`). `waited`: the seconds this manager waited for the lock."""

    def __init__(self, key, override=False, dump=False):
        super().__init__(key, override=override, dump=dump)
        self._shared = not override and not dump and bool(getattr(self, "cache_dir", None))
        self._lock_path = os.path.join(self.cache_dir, LOCK_NAME) if self._shared else None
        self._fd: int | None = None
        self._entry: str | None = None  # the file whose miss this manager holds the lock for
        self._group = False
        self.waited = 0.0

    def get_group(self, filename: str):
        return self._look(filename, super().get_group, group=True)

    def get_file(self, filename: str):
        return self._look(filename, super().get_file)

    def put_group(self, filename: str, group):
        stored = False
        try:
            path = super().put_group(filename, group)
            stored = True
            return path
        finally:
            self._release(filename, stored)

    def put(self, data, filename, binary=True):
        # A kernel's compile puts its metadata file under the group's own name before `put_group`: the lock of a
        # group miss is kept until the group is stored (released here, a reader found no group yet and compiled
        # again: 33-34 compiles of 32 in lab/bench_precompile_schedule.py, docs/lab/precompile-schedule.md).
        stored = False
        try:
            path = super().put(data, filename, binary)
            stored = True
            return path
        finally:
            if not self._group:
                self._release(filename, stored)

    def __del__(self):
        self._release(None)

    def _look(self, filename: str, look, group: bool = False):
        found = look(filename)
        if found is not None or not self._shared or self._fd is not None or self._lock_path in _held_here:
            return found
        self._group = group  # a kernel's group (released by put_group; may raise Busy), else one file (by its put)
        fd = self._acquire(wait=not (group and _no_wait))
        if fd is None:  # waited WAIT_S: compile here, as Triton would have
            _log("gave-up", self.key, filename, self.waited)
            return look(filename)
        found = look(filename)
        if found is not None:  # compiled by the process this one waited for
            _unlock(fd)
            _log("loaded", self.key, filename, self.waited)
            return found
        self._fd, self._entry, self._since = fd, filename, time.monotonic()
        _held_here.add(self._lock_path)
        return None

    def _acquire(self, wait: bool = True) -> int | None:
        fd = os.open(self._lock_path, os.O_RDWR | os.O_CREAT, 0o666)
        start = time.monotonic()
        pause = _POLL_S[0]
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                self.waited += time.monotonic() - start
                return fd
            except BlockingIOError:
                if not wait:
                    os.close(fd)
                    raise Busy(self.key) from None
            if time.monotonic() - start >= WAIT_S:
                self.waited += time.monotonic() - start
                os.close(fd)
                return None
            time.sleep(pause)
            pause = min(pause * 2, _POLL_S[1])

    def _release(self, filename: str | None, stored: bool = False) -> None:
        """Drop the lock held for `filename`'s miss (None: whichever is held); `stored`: the entry was written."""
        fd = getattr(self, "_fd", None)
        if fd is None or (filename is not None and filename != self._entry):
            return
        if stored:
            compiled_here.append(f"{self.key}/{filename}")
            _log("compiled", self.key, filename, time.monotonic() - self._since)
        self._fd = self._entry = None
        _held_here.discard(self._lock_path)
        _unlock(fd)


def _log(what: str, key: str, filename: str, seconds: float) -> None:
    """`pid what KEY/FILE seconds end` appended to `$DFLASH_PARITY_COMPILE_LOG` where set: `compiled` (held the lock
    that long), `loaded` (waited that long, then found it), `gave-up` (waited `WAIT_S`); `end`: when it ended (Unix
    seconds), so that a run's compiles can be laid on its time line."""
    path = os.environ.get(LOG_ENV)
    if path:
        with open(path, "a") as f:
            f.write(f"{os.getpid()} {what} {key}/{filename} {seconds:.3f} {time.time():.3f}\n")


def _unlock(fd: int) -> None:
    try:
        fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)
