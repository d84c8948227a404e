"""Cases drawn ahead by a second process while this one judges: the drawer port's process-aware implementation
(`ForkedDrawAhead`, `parity.engine.ports.DrawAhead`), `--draw-ahead`.

Drawing a case is hypothesis's own work plus the repair of what the lowering refuses, about as long as judging
it on a GPU host (docs/performance.md, "Where a case's time goes"), all on one core, one after the other. A derandomized (or seeded) search draws
the same sequence whatever the test function does, as long as no case fails (`parity.engine.draws`). So a forked
copy of the check (the drawer) runs the very same test function (`prop`, its text unchanged: it seeds the draws)
with a `run_case` that only sends each case down a pipe, and this process judges them as they come, as `prop`
would (`judge`: the same wrappers, the same counting and progress, in the same order).

While every case passes, that is the whole search: the same cases, judged once each, in the same order.
When a case fails or raises (an `Exception`: a failure hypothesis shrinks), or the drawer's search ends
with an error (no case it can draw, a health check, a draw it could not send), the drawer is stopped and
hypothesis runs the search here as it always does (`resume`), over `parity.engine.draws.replaying`:
the cases judged already are answered SKIPPED (a pass, counted once, from the first time), the failing one
with its outcome or exception from the first time (never judged twice: a flaky failure stays the failure
it was), and every later call, shrinking included, is judged. A KeyboardInterrupt, SystemExit or hook
failure propagates at once, as it does through hypothesis. So the report, the shrunk failure and every
figure are those of the search without the drawer (`tests/parity/test_draw_ahead.py`). A plugin's hook that the
drawer calls and that spins in C code past its bound ends the drawer (`_exits_when_stuck`): the search then goes on
here, where the hook is asked in the isolated worker and stopped (`parity.exec.hooks.answered_by`).

The shards of one lowering (`check --jobs N --shards NAME=S`) share one drawer (`SharedDraws`): the first shard
to reach its search forks it, the drawer appends each case to a file next to the parts, and every shard reads them
from it; one draw of each case instead of S. A shard whose case fails goes on as above; the drawer draws on for
the others.

When: the engine asks for a drawer where `parity.engine.draws.wanted` says so (`--draw-ahead on|off|auto`, the
draws fixed by the seed); `search` forks one only on a platform with `os.fork`. The drawer is forked from this
process and touches no CUDA (torch marks CUDA unusable in a forked child, so a lowering's `supports()` that would
is a drawer error: the search runs here). Its CPU seconds count in this process's (it is reaped).

Public: `ForkedDrawAhead`, `search`, `Drawer`, `SharedDraws`, `Ended`, `STUCK_GRACE`.
"""

from __future__ import annotations

import faulthandler
import os
import pickle
import signal
import time
import warnings
from pathlib import Path
from typing import Any, Callable, Iterator

from oracle.case import Case
from parity.exec import hooks
from parity.engine.outcome import SKIPPED, CaseOutcome
from parity.exec.pool import process_alive

STUCK_GRACE = 1.0  # seconds past a hook's bound before a drawer stuck in it (in C code) exits


def _frame(kind: str, value: Any) -> bytes:
    """One record of the drawer's stream: a 4-byte big-endian length, then the pickled `(kind, value)`."""
    data = pickle.dumps((kind, value), protocol=pickle.HIGHEST_PROTOCOL)
    return len(data).to_bytes(4, "big") + data


def _records(read: Callable[[int], bytes | None]) -> Iterator[tuple[str, Any]]:
    """The records of a stream; `read(n)` returns n bytes, or None at its end."""
    while True:
        head = read(4)
        if head is None:
            return
        body = read(int.from_bytes(head, "big"))
        if body is None:
            return
        yield pickle.loads(body)


class Ended(Exception):
    """The drawer's search ended with an error (its text), or the drawer died."""


class Drawer:
    """The forked drawer: `Drawer.fork(draw, path)` runs `draw(send)` in a child process, where `send` has
    `run_case`'s signature, writes each case as a record (`_frame`) and answers SKIPPED. The records go down a
    pipe (`path` None: `cases()` reads them), or are appended to the file `path` (a lowering's shards share one
    drawer: `SharedDraws`). `stop()` kills and reaps it, `wait()` reaps it once its search is done."""

    def __init__(self, pid: int, fd: int | None) -> None:
        self.pid, self.fd, self.reaped = pid, fd, False

    @classmethod
    def fork(cls, draw: Callable[[Callable[..., CaseOutcome]], None], path: Path | None = None) -> "Drawer | None":
        """The drawer, or None where it could not be forked (the search then runs here)."""
        if path is None:
            r, w = os.pipe()
        else:
            r, w = None, os.open(path, os.O_WRONLY | os.O_APPEND)
        try:
            with warnings.catch_warnings():  # 3.12: "this process is multi-threaded, use of fork() may deadlock":
                warnings.simplefilter("ignore", DeprecationWarning)  # the child runs Python only (no CUDA, no locks)
                pid = os.fork()
        except OSError:
            for fd in (r, w):
                if fd is not None:
                    os.close(fd)
            return None
        if pid == 0:  # the drawer
            if r is not None:
                os.close(r)
            _drawer_main(draw, w)  # never returns
        os.close(w)
        return cls(pid, r)

    def cases(self) -> Iterator[Case]:
        """The cases from the pipe, in order; `Ended` when the drawer's search ended with an error or it died."""
        def read(n: int) -> bytes | None:
            chunks, left = [], n
            while left:
                try:
                    got = os.read(self.fd, left)
                except InterruptedError:
                    continue
                if not got:
                    return None
                chunks.append(got)
                left -= len(got)
            return b"".join(chunks)

        yield from _cases_of(_records(read))

    def stop(self) -> None:
        self._reap(kill=True)

    def wait(self) -> None:
        self._reap(kill=False)

    def _reap(self, kill: bool) -> None:
        if self.reaped:
            return
        self.reaped = True
        if self.fd is not None:
            try:
                os.close(self.fd)
            except OSError:
                pass
        if kill:
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


def _cases_of(records: Iterator[tuple[str, Any]]) -> Iterator[Case]:
    """The cases of a drawer's records up to its "end"; `Ended` at its "error", or where the records stop
    before "end" (the drawer died)."""
    for kind, value in records:
        if kind == "case":
            yield value
        elif kind == "end":
            return
        elif kind == "error":
            raise Ended(value)
    raise Ended("the drawer died before the end of its search")


class SharedDraws:
    """The draws of a lowering's `--jobs` shards, drawn once: every shard draws the very same sequence (a
    derandomized or seeded search), so the first shard to reach its search (`claim`: the file created
    exclusively) forks the one drawer, which appends each case to the file, and every shard, that one included,
    judges its share of them as they come (`cases`). Instead of S draws of every case, one: on a GPU host the
    draw was 9 ms a case of the compiled merge's shards, 4-5 s of each shard's 16-27 s
    (docs/gpu/2026-12-03-h200-session20.md).
    A reader that finds no new record waits (0.5-5 ms), and asks whether the drawer (or, before it has
    written, the shard that claimed the file) still lives: dead before its last record, the search is
    `Ended` and hypothesis draws here as always."""

    POLL = (0.0005, 0.005)  # the reader's first and longest wait for a record, seconds
    ALIVE_EVERY = 0.5  # seconds without a record between two checks that the drawer lives

    def __init__(self, path: Path) -> None:
        self.path = Path(path)

    def claim(self) -> bool:
        """True for the one shard that creates the file (and then forks the drawer)."""
        try:
            fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        except FileExistsError:
            return False
        try:
            os.write(fd, _frame("pid", os.getpid()))  # whom the readers watch until the drawer writes its own
        finally:
            os.close(fd)
        return True

    def fail(self, why: str) -> None:
        """Tell the readers the draws ended (a drawer that could not be forked)."""
        with open(self.path, "ab") as f:
            f.write(_frame("error", why))

    def cases(self, sleep: Callable[[float], None] = time.sleep) -> Iterator[Case]:
        state = {"pid": None}

        def records() -> Iterator[tuple[str, Any]]:
            with open(self.path, "rb") as f:
                def read(n: int) -> bytes | None:
                    at, waited, pause, dead = f.tell(), 0.0, self.POLL[0], False
                    while True:
                        data = f.read(n)
                        if len(data) == n:
                            return data
                        f.seek(at)
                        if dead:
                            return None
                        if waited >= self.ALIVE_EVERY:
                            dead, waited = not process_alive(state["pid"]), 0.0  # dead: one last read, then the end
                            continue
                        sleep(pause)
                        waited += pause
                        pause = min(pause * 2, self.POLL[1])

                for kind, value in _records(read):
                    if kind == "pid":
                        state["pid"] = value
                        continue
                    yield kind, value

        yield from _cases_of(records())


class _SendFailed(BaseException):
    """The drawer could not send a case (unpicklable, or the judge is gone): its search ends there."""


def _exits_when_stuck(lowering: Any, hook: str, args: tuple, limit: float, case: Any = None) -> Any:
    """In the drawer, a plugin's hook (`parity.exec.hooks.answer_with`): called here under the watchdog; one that has
    not returned `STUCK_GRACE` seconds past its bound (a loop in C code, which no signal handler stops) ends the
    drawer (faulthandler's timer runs in a thread of its own): the judge reads `Ended` and runs the search
    itself, asking the hook in its worker, which is killed past the bound."""
    if limit > 0:
        faulthandler.dump_traceback_later(limit + STUCK_GRACE, exit=True)
    try:
        return hooks.call_here(lowering, hook, args, limit, case)
    finally:
        if limit > 0:
            faulthandler.cancel_dump_traceback_later()


def _drawer_main(draw: Callable[[Callable[..., CaseOutcome]], None], fd: int) -> None:
    """The drawer process: its pid, `draw(send)`, then "end", or "error" with what ended it; `os._exit` always
    (no atexit handler, no flush of the buffers it inherited)."""
    status = 0
    try:
        for s in (getattr(signal, n, None) for n in ("SIGINT", "SIGTERM", "SIGHUP")):
            if s is not None:
                signal.signal(s, signal.SIG_DFL)  # the check's own handlers write reports: not here
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, 1)
        os.dup2(devnull, 2)
        hooks.answer_with(_exits_when_stuck)  # a plugin's hooks: here, not in the judge's worker

        def write(kind: str, value: Any) -> None:
            data = _frame(kind, value)
            while data:
                data = data[os.write(fd, data):]

        def send(lowering, case, *_args) -> CaseOutcome:
            try:
                write("case", case)
            except Exception as err:  # a BaseException: hypothesis would shrink an Exception, sending more
                raise _SendFailed(f"could not send a case ({type(err).__name__}: {err})") from None
            return CaseOutcome(lowering.name, case, SKIPPED)

        write("pid", os.getpid())
        try:
            draw(send)
            write("end", None)
        except BaseException as err:  # noqa: BLE001  (whatever ended it is the judge's to know)
            write("error", f"{type(err).__name__}: {err}"[:500])
    except BaseException:  # noqa: BLE001  (a broken pipe: the judge is gone)
        status = 1
    finally:
        os._exit(status)


def search(prop: Callable[[], None], *, enabled: bool, draw: Callable[[Callable[..., CaseOutcome]], None],
           judge: Callable[[Case], CaseOutcome],
           resume: Callable[[list[Case], tuple[Case, CaseOutcome | BaseException] | None], None],
           shared: Path | None = None) -> None:
    """The search of `parity.engine.search`: `prop()` where not `enabled`, on a platform without `os.fork`, or
    where no drawer could be forked;
    else the drawn cases judged here by `judge(case)` (prop's body: it counts and reports a case that did not
    fail, returns its outcome) while they all pass, and `resume(judged, last)` (hypothesis's search over
    `replaying`) when one fails or raises an Exception, or the drawer ends with an error. `shared` (a `--jobs`
    shard: `SharedDraws`' file, removed by the parent before the shards start): the cases come from the one
    drawer of the lowering's shards; this process forks it if it is the first to get here, and reaps it at the
    end without stopping it before (the other shards read it)."""
    enabled = enabled and hasattr(os, "fork")
    drawer, source = None, None
    if shared is not None and enabled:
        draws = SharedDraws(shared)
        if draws.claim():
            drawer = Drawer.fork(draw, path=draws.path)
            if drawer is None:
                draws.fail("the drawer could not be forked")
        source = draws.cases()
    elif enabled:
        drawer = Drawer.fork(draw)
        source = drawer.cases() if drawer is not None else None
    if source is None:
        prop()
        return
    judged: list[Case] = []
    last, finished = None, False
    try:
        for case in source:
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
            finished = True  # the drawer's search ended: every case it drew was judged and passed
    except Ended:
        pass
    except BaseException:
        if drawer is not None:
            drawer.stop()
        raise
    if drawer is not None and shared is None:
        drawer.stop()
    try:
        if not finished:
            resume(judged, last)
    except BaseException as err:
        if drawer is not None:
            if shared is not None and isinstance(err, Exception):
                drawer.wait()  # this shard's failure, raised after its shrink: the other shards still read the drawer
            else:
                drawer.stop()
        raise
    if drawer is not None:
        drawer.wait()


class ForkedDrawAhead:
    """The drawer port (`parity.engine.ports.DrawAhead`) of a process that may fork: `search` above."""

    def search(self, prop: Callable[[], None], *, enabled: bool, draw: Callable[..., None],
               judge: Callable[[Case], CaseOutcome], resume: Callable[..., None], shared: Path | None = None) -> None:
        search(prop, enabled=enabled, draw=draw, judge=judge, resume=resume, shared=shared)
