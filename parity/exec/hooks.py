"""A lowering's own hooks (`available`, `supports`, `expected_calls`, ...) and its plugin's import, called
bounded and contained: a hook that raises, exits or loops is a failure of that lowering, never of the run.

Where each hook runs, and what bounds it (`check`, isolated: the default):

- the plugin import: first in a throwaway worker process (`parity.exec.plugin_probe.probe_plugins`: a crash, a
  hang or an exit at import is `--plugin FILE: ...`, exit 2, before anything else runs), then in this
  process (`load_plugin`: bounded by the hook timeout, `SystemExit` refused the same way);
- `available(device)`: in the case worker (`IsolatedExecutor.available`), where a crash or a hang kills
  only the worker;
- `supports(case)`, `case_limits`, `dispatch_boundaries`, `compile_family` (and `jit_modules` for the
  warm-up), which `check` asks in its own process (hypothesis asks `supports` while it draws: the repair
  of a refused draw, `strategies._cases._repair`, tries many candidates): a built-in's here, under a
  watchdog (`call_here`): a `SIGALRM` timer (`signal.setitimer`) armed for the call (18 us per guarded
  call, against milliseconds per case), whose handler raises in the hook, so an
  endless Python loop or a sleep is stopped after `timeout()` seconds. A plugin's in its isolated worker
  instead (`answered_by`, `IsolatedExecutor.hook`: a round trip, about 0.1 ms): this process
  waits `timeout()` seconds for the answer and then kills the worker, so that a hook spinning in C code
  (which holds the interpreter: no signal handler of its process runs) is stopped too, and SIGTERM still
  stops the run meanwhile. In the forked draw-ahead drawer, a plugin's hook runs there with its own bound
  (`parity.exec.draw_ahead`);
- `expected_calls(case)`, `kernel_families(case)`: inside `run_case`, in the case worker, under the same
  watchdog (and the case timeout, and the worker's crash isolation behind it).

An answer of the wrong type (`supports()` returning True, `expected_calls()` None, ...) fails the lowering
the same way: `call(..., expect=checker)` with a checker of `parity.engine.answers`.

A hook that raises (any exception, `SystemExit` included), or does not answer in time, raises
`HookFailure`: a `BaseException`, so that hypothesis does not catch it to shrink (a hook's failure is a
broken adapter, not a numerical finding, and shrinking a hang costs a timeout per attempt) and a
plugin's own `except Exception` cannot swallow it. `check_lowering` catches it: that lowering fails, the
hook, the case and the time are named, and the run goes on with the next lowering. A crash of the whole
process in a hook that runs here (`supports` in C code that segfaults: not seen, but possible) cannot be
contained in process; `dflash-parity check` writes each finished lowering's results to disk before the
next one starts (`parity.report.files.write_progress`), and under `--jobs` each lowering has its process.

Limits: the watchdog needs the main thread (elsewhere the hooks run unbounded, exceptions still
contained) and Python code or an interruptible call to stop (a loop in C code holding the GIL is not
interrupted: a built-in's hook, or any hook under `--no-isolate`, runs on; in the worker, the case timeout
still ends it).

Public: `watchdog` (the `lowerings.calls.Runner` the front ends install: `install()`), `call_here`, `answered_by`,
`answer_with`, `Answer`, `timeout()`, `set_timeout(seconds)`, `timeout_set(seconds)`, `load_plugin(path)`,
`deadline(seconds)`, `HookTimeout`; `HookFailure`, `call`, `call_optional`, `shown`, `first_line`,
`exception_origin`, `describe_exception` are `lowerings.calls`' (re-exported).
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
from typing import Any, Callable, Iterable, Iterator

from lowerings import calls
from lowerings.calls import (  # noqa: F401  (public here too, for one release: parity.hooks' names)
    HookFailure, call, call_optional, describe_exception, exception_origin, first_line, shown)
from oracle.errors import InvalidInput
from parity.engine import ranges

DEFAULT_TIMEOUT = 60.0  # seconds; available() may import a JIT library (flashinfer: seconds, cold)
TIMEOUT_ENV = "DFLASH_PARITY_HOOK_TIMEOUT"

_timeout: float | None = None  # set by timeout_set (the CLI's --hook-timeout); None: the environment/default


class HookTimeout(BaseException):
    """Raised inside a hook by the watchdog's SIGALRM handler (a BaseException: `except Exception` in the
    plugin does not stop it)."""


def _parse_timeout(text: str, where: str) -> float:
    """Seconds in `parity.engine.ranges`' range (more than 0, at most a day: the SIGALRM timer overflows far below
    1e12 s); InvalidInput naming `where` otherwise."""
    try:
        v = float(text)
    except ValueError:
        v = float("nan")
    problem = ranges.seconds_problem(v)
    if problem is not None:
        raise InvalidInput(where, f"{problem}, got {text!r}")
    return v


def timeout() -> float:
    """Seconds a hook may take: `timeout_set`'s, else `$DFLASH_PARITY_HOOK_TIMEOUT`, else 60."""
    if _timeout is not None:
        return _timeout
    env = os.environ.get(TIMEOUT_ENV)
    return _parse_timeout(env, TIMEOUT_ENV) if env else DEFAULT_TIMEOUT


def set_timeout(seconds: float | None) -> None:
    """Hooks called from now on get `seconds` (None: back to the environment/default)."""
    global _timeout
    _timeout = None if seconds is None else float(seconds)


@contextlib.contextmanager
def timeout_set(seconds: float | None) -> Iterator[None]:
    """Hooks called in the block get `seconds` (None: leave the current setting, `$DFLASH_PARITY_HOOK_TIMEOUT`
    checked now: a bad one is InvalidInput naming it before any hook runs)."""
    global _timeout
    if seconds is None:
        timeout()
    saved = _timeout
    if seconds is not None:
        _timeout = float(seconds)
    try:
        yield
    finally:
        _timeout = saved


@contextlib.contextmanager
def deadline(seconds: float) -> Iterator[None]:
    """Raise `HookTimeout` in the block after `seconds` (a SIGALRM timer; only in the main thread, else no
    bound). An outer timer that would fire first is left alone; a later one is re-armed afterwards."""
    if (threading.current_thread() is not threading.main_thread() or not hasattr(signal, "setitimer")
            or not seconds > 0):
        yield
        return
    armed = [True]

    def on_alarm(signum, frame) -> None:
        if armed[0]:
            raise HookTimeout(seconds)

    prev_delay, prev_interval = signal.getitimer(signal.ITIMER_REAL)
    if prev_delay and prev_delay <= seconds:  # an outer deadline comes first: it bounds this block
        yield
        return
    prev_handler = signal.signal(signal.SIGALRM, on_alarm)
    t0 = time.monotonic()
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        armed[0] = False
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, prev_handler)
        if prev_delay:
            signal.setitimer(signal.ITIMER_REAL, max(prev_delay - (time.monotonic() - t0), 1e-3), prev_interval)


Answer = Callable[[Any, str, tuple, float, Any], Any]
"""Who answers a hook call instead of this process: `answer(lowering, hook, args, limit, case)` returns what
`lowering.<hook>(*args)` returned, or raises `HookFailure` (it raised, exited, or did not answer within `limit`
seconds)."""

_elsewhere: tuple[int, frozenset[str], Answer] | None = None  # (the process it is for, the lowerings, the answer)


@contextlib.contextmanager
def answered_by(answer: Answer | None, lowerings: Iterable[str]) -> Iterator[None]:
    """Hooks of the lowerings named `lowerings` called in the block, in this process, are answered by `answer`
    (`check`, isolated: a plugin's hooks go to its isolated worker, a process that can be killed when a hook
    spins in C code, `parity.exec.isolation.IsolatedExecutor.hook`). A process forked in the block (the draw-ahead
    drawer) calls them itself unless it sets its own (`answer_with`). None: nothing changes."""
    global _elsewhere
    saved = _elsewhere
    if answer is not None:
        _elsewhere = (os.getpid(), frozenset(lowerings), answer)
    try:
        yield
    finally:
        _elsewhere = saved


def answer_with(answer: Answer, lowerings: Iterable[str] | None = None) -> None:
    """From now on in this process, hooks of `lowerings` (None: those `answered_by` named here or in the
    process this one was forked from) are answered by `answer` (a forked drawer's own bound, `parity.exec.draw_ahead`)."""
    global _elsewhere
    names = frozenset(lowerings) if lowerings is not None else (_elsewhere[1] if _elsewhere else frozenset())
    _elsewhere = (os.getpid(), names, answer)


def _answer_for(name: str) -> Answer | None:
    if _elsewhere is not None and name in _elsewhere[1] and _elsewhere[0] == os.getpid():
        return _elsewhere[2]
    return None


def watchdog(lowering: Any, hook: str, args: tuple, seconds: float | None = None, case: Any = None) -> Any:
    """The process machinery's `lowerings.calls.Runner`: `lowering.<hook>(*args)` bounded by `seconds` (default
    `timeout()`): here under the watchdog (`call_here`), or by whoever `answered_by` names for the lowering."""
    limit = timeout() if seconds is None else seconds
    name = getattr(lowering, "name", repr(lowering))
    return (_answer_for(name) or call_here)(lowering, hook, args, limit, case)


def install() -> None:
    """Every hook called in this process from now on goes through `watchdog` (`parity.exec.ports_impl.install`: the
    front ends' start-up, `parity.front.startup`, and each process they start that calls hooks)."""
    calls.set_runner(watchdog)


def call_here(lowering: Any, hook: str, args: tuple, limit: float, case: Any = None) -> Any:
    """`lowering.<hook>(*args)` in this process under the watchdog (`deadline(limit)`; 0: unbounded): any
    exception, an exit or the deadline raise `HookFailure`."""
    fn = getattr(lowering, hook)
    name = getattr(lowering, "name", repr(lowering))
    try:
        with deadline(limit):
            return fn(*args)
    except (KeyboardInterrupt, HookFailure):
        raise
    except HookTimeout:
        raise HookFailure(name, hook, f"{hook}() did not answer within {limit:g} s (stopped; an endless "
                                      f"loop? --hook-timeout sets the bound)", case) from None
    except BaseException as err:  # noqa: BLE001  (the lowering's own code: any exception, an exit)
        raise HookFailure(name, hook, f"{hook}() raised {describe_exception(err, lowering)}", case) from None


def load_plugin(path: str, seconds: float | None = None) -> list[str]:
    """`lowerings.load_plugin(path)` bounded by the hook timeout; an exit at import (`sys.exit(0)` at the
    top of the file) or the deadline is `InvalidInput("--plugin FILE", ...)`, like any import error."""
    from lowerings import registry

    limit = timeout() if seconds is None else seconds
    try:
        with deadline(limit):
            return registry.load_plugin(path)
    except HookTimeout:
        raise InvalidInput(f"--plugin {path}", f"did not finish importing within {limit:g} s (an endless loop "
                                               f"at import? --hook-timeout sets the bound)") from None
    except SystemExit as err:
        raise InvalidInput(f"--plugin {path}", f"exited at import (SystemExit {err.code!r})") from None

