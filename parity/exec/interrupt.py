"""SIGINT, SIGTERM and SIGHUP during `check`: stop at once, write the report of what ran, never lose it.

The three are handled alike (`SIGNALS`): a CI time limit sends SIGTERM, a closed terminal or ssh
session SIGHUP, Ctrl-C SIGINT. Each raises KeyboardInterrupt; `check` writes the partial report (the
interrupted lowering failed as "a partial run, not a verdict") and exits `exit_code()` = 128 + the
signal's number (130, 143, 129). An ignored signal (`nohup` ignores SIGHUP) stays ignored.

A signal inherited blocked (a launcher's signal mask: some GPU hosts' shells block SIGINT) is unblocked
while the handler is installed, and blocked again after: blocked, it never arrives, and the kill that a
time limit sends next loses the report.

Python's default handler raises KeyboardInterrupt wherever the interpreter happens to be. Two ways that
loses an interrupt or a report, both seen (docs/gpu/2026-11-30-h200-session4.md):

- coreutils `timeout -s INT` signals the command and then its whole process group, so the command gets
  SIGINT twice; on a loaded host the second lands while the first is being handled (a `--jobs` parent
  lost its merged report that way). `SigintOnce` takes a repeat within `window` seconds for the same
  interrupt.
- a KeyboardInterrupt raised inside a garbage-collector callback (hypothesis installs one) or a `__del__`
  is printed as "Exception ignored" and dropped: the check went on drawing cases until its parent
  killed it (on a loaded CPU, about one run in six). So the handler also records the interrupt, and
  `raise_if_requested()`, called between cases and in the `--jobs` poll loop, raises it again. The engine
  reads the same record through its stop request port (`SignalStop`, installed by
  `parity.exec.ports_impl.install()`).

Public: `SIGNALS`, `SigintOnce`, `installed(force) -> context manager`, `requested()`, `raise_if_requested()`,
`exit_code()`, `ignored_sigint_notice()`, `SignalStop`.
"""

from __future__ import annotations

import contextlib
import signal
import time
from typing import Callable, Iterator


SIGNALS = tuple(s for s in (getattr(signal, n, None) for n in ("SIGINT", "SIGTERM", "SIGHUP")) if s is not None)


class SigintOnce:
    """A handler for `SIGNALS`: records the interrupt (and which signal) and raises KeyboardInterrupt,
    except for a repeat within `window` seconds of the one before (the same interrupt). A second Ctrl-C
    after the window raises."""

    def __init__(self, window: float = 1.0, clock: Callable[[], float] = time.monotonic):
        self.window, self.clock = window, clock
        self.last: float | None = None
        self.hit = False
        self.signum: int | None = None

    def __call__(self, signum, frame) -> None:
        global _last_signum
        now = self.clock()
        if self.last is not None and now - self.last < self.window:
            return
        self.last, self.hit = now, True
        if self.signum is None:  # the first signal names the interrupt (and the exit code)
            self.signum = _last_signum = int(signum)
        raise KeyboardInterrupt


_active: SigintOnce | None = None
_last_signum: int | None = None


def _default(signum: int) -> object:
    return signal.default_int_handler if signum == signal.SIGINT else signal.SIG_DFL


@contextlib.contextmanager
def installed(force: bool = False) -> Iterator[SigintOnce | None]:
    """`SigintOnce` as the handler of `SIGNALS` for the block, then the previous ones back. Without
    `force` an ignored signal (a process started in the background, `nohup`) stays ignored, and a handler
    of the caller's own stays in place; `force` (a `--jobs` child, whose parent's SIGINT means "write your
    partial part") installs it anyway. Returns None when it installed none. While it holds, the handler is the
    engine's stop request (`SignalStop`, `parity.engine.ports`)."""
    global _active, _last_signum
    previous = {s: signal.getsignal(s) for s in SIGNALS}
    mine = [s for s in SIGNALS if force or previous[s] is _default(s)]
    if not mine:
        yield None
        return
    handler, outer = SigintOnce(), _active
    _last_signum = None
    for s in mine:
        signal.signal(s, handler)
    # A signal the process inherited *blocked* (not ignored: a launcher's mask) would never reach the handler:
    # a `timeout -s INT` limit then kills the check with its report unwritten. Unblocked for the block, the
    # mask restored after.
    mask = getattr(signal, "pthread_sigmask", None)
    blocked = mask(signal.SIG_BLOCK, []) & set(mine) if mask is not None else set()
    if blocked:
        mask(signal.SIG_UNBLOCK, blocked)
    _active = handler
    from parity.engine import ports  # here: the engine imports torch, which the front ends' start-up
    #                                    (parity.front.startup, importing this module) launches the prefork before
    try:
        with ports.installed(stop=SignalStop()):  # the engine's stop request reads this handler for the block
            yield handler
    finally:
        if blocked:
            mask(signal.SIG_BLOCK, blocked)
        for s in mine:
            signal.signal(s, previous[s])
        _active = outer


def ignored_sigint_notice() -> str | None:
    """The line `check` prints when SIGINT is ignored in this process (inherited: a script's background job,
    or a launcher that ignores it), so a SIGINT time limit would not stop it and its report would be lost
    to the kill that follows (a `check` stopped by `timeout -s INT` kept running); None when SIGINT is not
    ignored."""
    if signal.getsignal(signal.SIGINT) is not signal.SIG_IGN:
        return None
    return ("dflash-parity: note: SIGINT is ignored in this process (inherited from whatever started it, e.g. a "
            "script's background job): Ctrl-C or `timeout -s INT` will not stop this check; SIGTERM (timeout's "
            "default) stops it and writes the report of what ran")


def requested() -> bool:
    """Whether the installed handler has seen SIGINT."""
    return _active is not None and _active.hit


def raise_if_requested() -> None:
    """KeyboardInterrupt if SIGINT came (again, where the first one was swallowed)."""
    if requested():
        raise KeyboardInterrupt


def exit_code() -> int:
    """128 + the number of the signal that interrupted the last check (130 for SIGINT, 143 for SIGTERM,
    129 for SIGHUP); 130 when none was seen (a KeyboardInterrupt raised otherwise)."""
    return 128 + (_last_signum if _last_signum is not None else int(signal.SIGINT))


class SignalStop:
    """The engine's stop request port (`parity.engine.ports.StopRequest`) read from the installed handler: a
    signal seen while `installed()` holds is a request to stop, though its KeyboardInterrupt was swallowed."""

    def requested(self) -> bool:
        return requested()
