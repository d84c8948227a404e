"""Cases drawn ahead by a second process while this one judges: `search`, `--draw-ahead`.

Drawing a case is hypothesis's own work plus the repair of what the lowering refuses: 8-18 ms a case on the
H200's host against 14-20 ms for judging it (docs/performance.md), all on one core, one after the other. A
derandomized (or seeded) search draws the same sequence whatever the test function does, as long as no case
fails: hypothesis's generate phase reads nothing of a passing call but that it returned. So a forked copy of
the check (the drawer) runs the very same test function (`prop`, its text unchanged: it seeds the draws)
with a `run_case` that only sends each case down a pipe, and this process judges them as they come, as
`prop` would (`judge`: the same wrappers, the same counting and progress, in the same order).

While every case passes, that is the whole search: the same cases, judged once each, in the same order.
When a case fails or raises (an `Exception`: a failure hypothesis shrinks), or the drawer's search ends
with an error (no case it can draw, a health check, a draw it could not send), the drawer is stopped and
hypothesis runs the search here as it always does (`resume`), over `replaying(run_case, judged, last)`:
the cases judged already are answered SKIPPED (a pass, counted once, from the first time), the failing one
with its outcome or exception from the first time (never judged twice: a flaky failure stays the failure
it was), and every later call, shrinking included, is judged. A KeyboardInterrupt, SystemExit or hook
failure propagates at once, as it does through hypothesis. So the report, the shrunk failure and every
figure are those of the search without the drawer (`tests/parity/test_draw_ahead.py`).

When (`wanted`): `--draw-ahead on|off|auto` (auto: on for `AUTO_MIN_EXAMPLES` draws or more), and only
where the draws cannot depend on anything but the seed: a derandomized or seeded search, no example
database (its replays and saves), not targeted (`target()` steers the draw by the figures), with the
generate phase, on a platform with `os.fork`. The drawer is forked from this process and touches no CUDA
(torch marks CUDA unusable in a forked child, so a lowering's `supports()` that would is a drawer error:
the search runs here). Its CPU seconds count in this process's (it is reaped).

Public: `MODES`, `AUTO_MIN_EXAMPLES`, `wanted`, `search`, `replaying`, `Drawer`, `DrawDiverged`.
"""

from __future__ import annotations

import os
import pickle
import signal
import warnings
from typing import Any, Callable, Iterator

from oracle.case import Case
from parity.outcome import SKIPPED, CaseOutcome

MODES = ("auto", "on", "off")
AUTO_MIN_EXAMPLES = 100  # fewer draws: forking a drawer (10-50 ms with torch loaded) is not worth it


class DrawDiverged(RuntimeError):
    """hypothesis drew another case than the drawer did at the same index: the draws were not a function of
    the seed alone (a strategy or `supports()` that reads the clock, the process or the outcomes)."""


def wanted(mode: str, settings: Any, seed: int | None, target: bool) -> bool:
    """Whether `search` forks a drawer for a search under hypothesis `settings` (see the module docstring)."""
    from hypothesis import Phase

    if mode not in MODES:
        raise ValueError(f"draw_ahead: one of {', '.join(MODES)}, got {mode!r}")
    if mode == "off" or not hasattr(os, "fork"):
        return False
    if target or settings.database is not None or Phase.generate not in settings.phases:
        return False
    if not (settings.derandomize or seed is not None):
        return False
    return mode == "on" or settings.max_examples >= AUTO_MIN_EXAMPLES


class Drawer:
    """The forked drawer: `Drawer.fork(draw)` runs `draw(send)` in a child process, where `send` has
    `run_case`'s signature, pickles each case down a pipe and answers SKIPPED; `cases()` yields them here
    and raises `Drawer.Ended` with the drawer's error when its search ended with one; `stop()` kills and
    reaps it."""

    class Ended(Exception):
        """The drawer's search ended with an error (its text), or the drawer died."""

    def __init__(self, pid: int, stream) -> None:
        self.pid, self.stream, self.reaped = pid, stream, False

    @classmethod
    def fork(cls, draw: Callable[[Callable[..., CaseOutcome]], None]) -> "Drawer | None":
        """The drawer, or None where it could not be forked (the search then runs here)."""
        r, w = os.pipe()
        try:
            with warnings.catch_warnings():  # 3.12: "this process is multi-threaded, use of fork() may deadlock":
                warnings.simplefilter("ignore", DeprecationWarning)  # the child runs Python only (no CUDA, no locks)
                pid = os.fork()
        except OSError:
            os.close(r)
            os.close(w)
            return None
        if pid == 0:  # the drawer
            os.close(r)
            _drawer_main(draw, w)  # never returns
        os.close(w)
        return cls(pid, os.fdopen(r, "rb"))

    def cases(self) -> Iterator[Case]:
        while True:
            try:
                kind, value = pickle.load(self.stream)
            except (EOFError, OSError, pickle.UnpicklingError) as err:
                raise Drawer.Ended(f"the drawer died ({type(err).__name__})") from None
            if kind == "case":
                yield value
            elif kind == "end":
                return
            else:
                raise Drawer.Ended(value)

    def stop(self) -> None:
        if self.reaped:
            return
        self.reaped = True
        try:
            self.stream.close()
        except OSError:
            pass
        try:
            os.kill(self.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        while True:
            try:
                os.waitpid(self.pid, 0)  # reaped: its CPU seconds count in this process's children
                return
            except InterruptedError:
                continue
            except ChildProcessError:
                return


class _SendFailed(BaseException):
    """The drawer could not send a case (unpicklable, or the judge is gone): its search ends there."""


def _drawer_main(draw: Callable[[Callable[..., CaseOutcome]], None], fd: int) -> None:
    """The drawer process: `draw(send)`, then "end", or "error" with what ended it; `os._exit` always (no
    atexit handler, no flush of the buffers it inherited)."""
    status = 0
    try:
        for s in (getattr(signal, n, None) for n in ("SIGINT", "SIGTERM", "SIGHUP")):
            if s is not None:
                signal.signal(s, signal.SIG_DFL)  # the check's own handlers write reports: not here
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, 1)
        os.dup2(devnull, 2)
        out = os.fdopen(fd, "wb")

        def send(lowering, case, *_args) -> CaseOutcome:
            try:
                pickle.dump(("case", case), out, protocol=pickle.HIGHEST_PROTOCOL)
                out.flush()
            except Exception as err:  # a BaseException: hypothesis would shrink an Exception, sending more
                raise _SendFailed(f"could not send a case ({type(err).__name__}: {err})") from None
            return CaseOutcome(lowering.name, case, SKIPPED)

        try:
            draw(send)
            pickle.dump(("end", None), out)
        except BaseException as err:  # noqa: BLE001  (whatever ended it is the judge's to know)
            pickle.dump(("error", f"{type(err).__name__}: {err}"[:500]), out)
        out.flush()
    except BaseException:  # noqa: BLE001  (a broken pipe: the judge is gone)
        status = 1
    finally:
        os._exit(status)


def replaying(run_case: Callable[..., CaseOutcome], judged: list[Case],
              last: tuple[Case, CaseOutcome | BaseException] | None) -> Callable[..., CaseOutcome]:
    """`run_case` for the search that resumes after the drawer: its first `len(judged)` calls answer SKIPPED
    (judged already), the next answers `last`'s outcome or raises its exception (judged already), every later
    one is judged. Each replayed call must get the case judged at its index (else `DrawDiverged`)."""
    state = {"at": 0}

    def run(lowering, case, policy, opts, yardstick) -> CaseOutcome:
        i = state["at"]
        state["at"] += 1
        if i < len(judged) or (i == len(judged) and last is not None):
            want = judged[i] if i < len(judged) else last[0]
            if case != want:
                raise DrawDiverged(f"draw {i}: hypothesis drew {case.short()} where the drawer drew {want.short()}; "
                                   f"the draws depend on more than the seed (run with --draw-ahead off)")
            if i < len(judged):
                return CaseOutcome(lowering.name, case, SKIPPED)
            if isinstance(last[1], BaseException):
                raise last[1]
            return last[1]
        return run_case(lowering, case, policy, opts, yardstick)
    return run


def search(prop: Callable[[], None], *, enabled: bool, draw: Callable[[Callable[..., CaseOutcome]], None],
           judge: Callable[[Case], CaseOutcome],
           resume: Callable[[list[Case], tuple[Case, CaseOutcome | BaseException] | None], None]) -> None:
    """The search of `parity.sweep.check_lowering`: `prop()` where not `enabled` or no drawer could be forked;
    else the drawn cases judged here by `judge(case)` (prop's body: it counts and reports a case that did not
    fail, returns its outcome) while they all pass, and `resume(judged, last)` (hypothesis's search over
    `replaying`) when one fails or raises an Exception, or the drawer ends with an error."""
    drawer = Drawer.fork(draw) if enabled else None
    if drawer is None:
        prop()
        return
    judged: list[Case] = []
    last = None
    try:
        for case in drawer.cases():
            try:
                out = judge(case)
            except Exception as err:  # noqa: BLE001  (hypothesis's to shrink: replayed to it)
                last = (case, err)
                break
            if out.status == "fail":
                last = (case, out)
                break
            judged.append(case)
        else:
            return  # the drawer's search ended: every case it drew was judged and passed
    except Drawer.Ended:
        pass
    finally:
        drawer.stop()
    resume(judged, last)
