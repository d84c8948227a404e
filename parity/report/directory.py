"""The report directory of `check`: writable before the first case, held by one run at a time, never a
way to write or delete outside itself, and never holding an earlier run's verdict while a run is in it.

- `taken(dir)` (what `check`, the pytest plugin and `merge` hold for their run): the directory created
  and checked (`prepare`'s checks), locked (`locked`), the previous run's verdict moved out of where the
  gate reads it (`parity.report.rundir.retire`: renames only, which a full disk still allows), then proven
  writable. So whatever stops the run from then on (a full disk from the start, a read-only directory,
  bad input found after the lock, a crash) leaves no `parity.json` there: the gate finds none, or the
  directory marked in progress. A command line refused before the directory is taken leaves it as it was.
- `prepare(dir)`: creates it, proves it writable (a file created and removed), and refuses a `failures/`,
  `inflight/`, `parts/` or `previous/` (or a shard's directory in `parts/`) that is a symbolic link or not
  a directory: `check` deletes stale failure files there and moves old verdicts into `previous/`, and a
  link would make it delete (and write) files elsewhere. One `InvalidInput("--report DIR", ...)`, exit 2,
  before any case runs.
- `locked(dir)`: an exclusive `flock` on `DIR/.lock` for the run (released when the process ends, however
  it ends); a second `check` into the same directory is refused with the holder's pid, start time and
  command line. `--jobs` children run under their parent's lock and take none.

Public: `taken`, `prepare`, `locked`, `written`, `LOCK_NAME`, `SUBDIRS`.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import sys
import time
from pathlib import Path
from typing import Iterator

from oracle.errors import InvalidInput
from parity.report import rundir

LOCK_NAME = ".lock"
SUBDIRS = ("failures", "inflight", "parts", rundir.PREVIOUS)


def _refuse(report_dir: Path, rule: str) -> InvalidInput:
    return InvalidInput(f"--report {report_dir}", rule)


def _check_entry(report_dir: Path, path: Path) -> None:
    rel = path.relative_to(report_dir)
    if path.is_symlink():
        raise _refuse(report_dir, f"{rel} is a symbolic link (to {os.readlink(path)}); check writes and deletes "
                                  f"files in it, so it must be a directory inside the report directory: remove "
                                  f"the link")
    if path.exists() and not path.is_dir():
        raise _refuse(report_dir, f"{rel} exists and is not a directory")


def _created(report_dir: str | Path) -> Path:
    d = Path(report_dir)
    if d.exists() and not d.is_dir():
        raise _refuse(d, "exists and is not a directory")
    try:
        d.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise _refuse(d, f"cannot create the report directory: {err.strerror}") from None
    return d


def _check_structure(d: Path) -> None:
    for name in SUBDIRS:
        _check_entry(d, d / name)
    parts = d / "parts"
    if parts.is_dir():
        for entry in parts.iterdir():
            if entry.is_symlink() or entry.is_dir():
                _check_entry(d, entry)
                if entry.is_dir():
                    for name in ("failures", "inflight"):
                        _check_entry(d, entry / name)


def _stale(d: Path) -> str:
    """What a refusal adds when an earlier run's verdict could not be moved out of the gate's way."""
    if not (d / "parity.json").is_file():
        return ""
    return (f"; {d / 'parity.json'} is an earlier run's verdict that could not be moved aside: refuse it with "
            f"`dflash-parity gate --not-before TIME` (or remove it)")


def _probe(d: Path) -> None:
    probe = d / f".write-test-{os.getpid()}"
    try:
        fd = os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), 0o644)
        try:
            os.write(fd, b"x")
        finally:
            os.close(fd)
        os.unlink(probe)
    except OSError as err:
        with contextlib.suppress(OSError):
            os.unlink(probe)
        raise _refuse(d, f"not writable ({err.strerror}); the report could not be written there{_stale(d)}") from None


def prepare(report_dir: str | Path) -> Path:
    """Create the report directory, check it is writable and that the directories `check` writes and
    deletes in are real directories inside it (see the module docstring); returns it as a Path."""
    d = _created(report_dir)
    _probe(d)
    _check_structure(d)
    return d


@contextlib.contextmanager
def taken(report_dir: str | Path) -> Iterator[Path]:
    """The report directory held for a run that writes a verdict in it (see the module docstring): created,
    its structure checked, locked, the previous verdict retired, proven writable; yields it as a Path."""
    d = _created(report_dir)
    _check_structure(d)
    with locked(d):
        try:
            rundir.retire(d)
        except OSError as err:
            raise _refuse(d, f"cannot move the previous run's verdict aside ({err.strerror}){_stale(d)}") from None
        _probe(d)
        yield d


def _holder(text: str) -> str:
    return text.strip() or "a process that wrote nothing in the lock file"


@contextlib.contextmanager
def locked(report_dir: str | Path) -> Iterator[None]:
    """Hold `DIR/.lock` (exclusive, non-blocking) for the block; refused when another run holds it."""
    d = Path(report_dir)
    path = d / LOCK_NAME
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0), 0o644)
    except OSError as err:
        raise _refuse(d, f"cannot open its lock file {LOCK_NAME}: {err.strerror}{_stale(d)}") from None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as err:
            if err.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                raise _refuse(d, f"cannot lock it: {err.strerror}") from None
            held = os.pread(fd, 4096, 0).decode("utf-8", "replace")
            raise _refuse(d, f"another check is writing to this report directory ({_holder(held)}); wait for it "
                             f"to finish or use another --report") from None
        note = (f"pid {os.getpid()}, started {time.strftime('%Y-%m-%d %H:%M:%S')}: "
                f"{' '.join(sys.argv)[:300]}\n").encode()
        with contextlib.suppress(OSError):  # the holder's note is a courtesy: a full disk must not stop the lock
            os.ftruncate(fd, 0)
            os.pwrite(fd, note, 0)
        try:
            yield
        finally:
            with contextlib.suppress(OSError):
                os.ftruncate(fd, 0)
    finally:
        os.close(fd)


def written(report_dir: Path, write, *args, **kwargs):
    """`write(*args, **kwargs)`; an OSError (a full disk, a directory made read-only under the run) becomes
    one message naming the report directory (exit 2). `parity.json` is written last, so none is left."""
    try:
        return write(*args, **kwargs)
    except OSError as err:
        raise InvalidInput(f"--report {report_dir}", f"could not write the report: {err.strerror or err} "
                                                     f"({err.filename or 'a report file'}); no parity.json was "
                                                     f"written by this run") from None
