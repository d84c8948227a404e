"""SIGINT during `check`: stop at once, write the report of what ran, never lose it.

Python's default handler raises KeyboardInterrupt wherever the interpreter happens to be. Two ways that
loses an interrupt or a report, both seen:

- coreutils `timeout -s INT` signals the command and then its whole process group, so the command gets
  SIGINT twice; on a loaded host the second lands while the first is being handled (H200 run 12: a
  `--jobs` parent lost its merged report that way). `SigintOnce` takes a repeat within `window` seconds
  for the same interrupt.
- a KeyboardInterrupt raised inside a garbage-collector callback (hypothesis installs one) or a `__del__`
  is printed as "Exception ignored" and dropped: the check went on drawing cases until its parent
  killed it (measured on CPU: 1 run in 6 under load). So the handler also records the interrupt, and
  `raise_if_requested()`, called between cases and in the `--jobs` poll loop, raises it again.

Public: `SigintOnce`, `installed(force) -> context manager`, `requested()`, `raise_if_requested()`.
"""

from __future__ import annotations

import contextlib
import signal
import time
from typing import Callable, Iterator


class SigintOnce:
    """A SIGINT handler: records the interrupt and raises KeyboardInterrupt, except for a repeat within
    `window` seconds of the one before (the same interrupt). A second Ctrl-C after the window raises."""

    def __init__(self, window: float = 1.0, clock: Callable[[], float] = time.monotonic):
        self.window, self.clock = window, clock
        self.last: float | None = None
        self.hit = False

    def __call__(self, signum, frame) -> None:
        now = self.clock()
        if self.last is not None and now - self.last < self.window:
            return
        self.last, self.hit = now, True
        raise KeyboardInterrupt


_active: SigintOnce | None = None


@contextlib.contextmanager
def installed(force: bool = False) -> Iterator[SigintOnce | None]:
    """`SigintOnce` as the SIGINT handler for the block, then the previous one back. Without `force` an
    ignored SIGINT (a process started in the background) stays ignored, and a handler of the caller's own
    stays in place; `force` (a `--jobs` child, whose parent's SIGINT means "write your partial part")
    installs it anyway."""
    global _active
    previous = signal.getsignal(signal.SIGINT)
    if not (force or previous is signal.default_int_handler):
        yield None
        return
    handler, outer = SigintOnce(), _active
    signal.signal(signal.SIGINT, handler)
    _active = handler
    try:
        yield handler
    finally:
        signal.signal(signal.SIGINT, previous)
        _active = outer


def requested() -> bool:
    """Whether the installed handler has seen SIGINT."""
    return _active is not None and _active.hit


def raise_if_requested() -> None:
    """KeyboardInterrupt if SIGINT came (again, where the first one was swallowed)."""
    if requested():
        raise KeyboardInterrupt
