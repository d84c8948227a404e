"""Calling a lowering's own hooks (`available`, `supports`, `expected_calls`, ...): a hook that raises, exits,
answers the wrong type or does not answer in time is that lowering's failure (`HookFailure`), never the run's.

`call(lowering, hook, *args, case=..., expect=...)` is the one way the framework (strategies, engine, front ends)
asks a hook. Who runs it is a port, `Runner` (`runner_set`, `set_runner`): by default `plain_call` (in this
process, unbounded); the front ends install the process machinery's watchdog (`parity.exec.hooks.watchdog`: a
SIGALRM deadline here, or the isolated worker that answers a plugin's hooks and is killed when one spins in C
code). Pure: no signal, no process, no thread.

A hook that raises (any exception, `SystemExit` included) or does not answer in time raises `HookFailure`: a
`BaseException`, so that hypothesis does not catch it to shrink (a hook's failure is a broken adapter, not a
numerical finding) and a plugin's own `except Exception` cannot swallow it.

Public: `HookFailure`, `call`, `call_optional`, `Runner`, `plain_call`, `runner`, `set_runner`, `runner_set`,
`shown`, `first_line`, `exception_origin`, `describe_exception`.
"""

from __future__ import annotations

import contextlib
import os
import sys
import traceback
from typing import Any, Callable, Iterator

from lowerings.protocol import optional_hook

Runner = Callable[[Any, str, tuple, "float | None", Any], Any]
"""Who runs a hook: `runner(lowering, hook, args, seconds, case)` returns what `lowering.<hook>(*args)` returned, or
raises `HookFailure` (it raised, exited, or did not answer within `seconds`: None, the runner's own bound)."""


class HookFailure(BaseException):
    """A lowering's hook raised, exited or did not answer in time: that lowering's failure.

    `lowering`: its name; `hook`: `supports`, `available`, ...; `message`: one line starting with the hook,
    e.g. `supports() did not answer within 2 s (stopped; an endless loop?)`; `case`: the case it was
    asked about (None for `available`)."""

    def __init__(self, lowering: str, hook: str, message: str, case: Any = None):
        super().__init__(message)
        self.lowering, self.hook, self.message, self.case = lowering, hook, message, case

    def to_json(self) -> dict[str, Any]:
        return {"lowering": self.lowering, "hook": self.hook, "message": self.message,
                "case": self.case.to_json_dict() if self.case is not None else None}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> "HookFailure":
        from oracle.case import Case

        case = Case.from_json_dict(data["case"], source="worker answer") if data.get("case") else None
        return cls(data["lowering"], data["hook"], data["message"], case)


def _files_of(owner: Any) -> set[str]:
    """The source files of `owner`'s class and its bases (a lowering's own code: its plugin file, ...)."""
    files = set()
    for cls in type(owner).__mro__:
        mod = sys.modules.get(getattr(cls, "__module__", ""), None)
        f = getattr(mod, "__file__", None)
        if f and cls is not object:
            files.add(os.path.realpath(f))
    return files


def _frame_text(fr: traceback.FrameSummary, parts: int) -> str:
    path = fr.filename.replace(os.sep, "/").split("/")
    return f"{'/'.join(path[-parts:])}:{fr.lineno} in {fr.name}"


def exception_origin(err: BaseException, owner: Any) -> str:
    """`my_plugin.py:42 in run -> torch/functional.py:123 in einsum`: the innermost frame in `owner`'s own
    source files (its class's and its bases'), then the innermost frame overall when that is elsewhere
    ('' when there is no traceback)."""
    frames = traceback.extract_tb(err.__traceback__)
    if not frames:
        return ""
    own_files = _files_of(owner)
    own = next((fr for fr in reversed(frames) if os.path.realpath(fr.filename) in own_files), None)
    inner = frames[-1]
    if own is None:
        return _frame_text(inner, 2)
    if own is inner:
        return _frame_text(own, 1)
    return f"{_frame_text(own, 1)} -> {_frame_text(inner, 2)}"


def first_line(err: BaseException) -> str:
    """`"TypeName: the message's first line"`, at most 300 characters: an exception in one line of a report."""
    text = str(err).strip().splitlines()
    return f"{type(err).__name__}: {text[0] if text else ''}"[:300]


def describe_exception(err: BaseException, owner: Any) -> str:
    """`ValueError: boom (my_plugin.py:42 in run -> torch/functional.py:123 in einsum)`; a SystemExit as
    `SystemExit 0`."""
    what = f"SystemExit {err.code!r}" if isinstance(err, SystemExit) else f"{type(err).__name__}: {err}"
    where = exception_origin(err, owner)
    return f"{what} ({where})" if where else what


def shown(value: Any) -> str:
    """`repr(value)` cut to 200 characters (a hook's answer in one line of a report)."""
    try:
        text = repr(value)
    except Exception as err:  # noqa: BLE001  (a plugin's __repr__)
        text = f"<{type(value).__name__}: repr raised {type(err).__name__}>"
    return text if len(text) <= 200 else text[:197] + "..."


def plain_call(lowering: Any, hook: str, args: tuple, seconds: float | None = None, case: Any = None) -> Any:
    """The default `Runner`: `lowering.<hook>(*args)` in this process, unbounded (`seconds` ignored); any exception
    or an exit raises `HookFailure`."""
    fn = getattr(lowering, hook)
    name = getattr(lowering, "name", repr(lowering))
    try:
        return fn(*args)
    except (KeyboardInterrupt, HookFailure):
        raise
    except BaseException as err:  # noqa: BLE001  (the lowering's own code: any exception, an exit)
        raise HookFailure(name, hook, f"{hook}() raised {describe_exception(err, lowering)}", case) from None


_runner: Runner = plain_call


def runner() -> Runner:
    """The `Runner` hooks are called through now."""
    return _runner


def set_runner(new: Runner | None) -> None:
    """Hooks are called through `new` from now on (None: `plain_call`)."""
    global _runner
    _runner = new or plain_call


@contextlib.contextmanager
def runner_set(new: Runner | None) -> Iterator[None]:
    """Hooks called in the block go through `new` (None: leave the current runner)."""
    saved = _runner
    if new is not None:
        set_runner(new)
    try:
        yield
    finally:
        set_runner(saved)


def call(lowering: Any, hook: str, *args: Any, case: Any = None, seconds: float | None = None,
         expect: Callable[[Any], str | None] | None = None) -> Any:
    """`lowering.<hook>(*args)` through the installed `Runner` (bounded by `seconds`, or the runner's own bound).
    An exception, an exit or the deadline raise `HookFailure` naming the lowering, the hook and the case; so does
    an answer `expect` (a checker of `lowerings.answers`) finds wrong: "`hook() returned X, expected Y`"."""
    value = _runner(lowering, hook, args, seconds, case)
    if expect is not None:
        wanted = expect(value)
        if wanted is not None:
            name = getattr(lowering, "name", repr(lowering))
            raise HookFailure(name, hook, f"{hook}() returned {shown(value)}, expected {wanted}", case)
    return value


def call_optional(lowering: Any, hook: str, *args: Any, default: Any = None, case: Any = None,
                  expect: Callable[[Any], str | None] | None = None) -> Any:
    """`call(lowering, hook, *args)` for an optional hook (`lowerings.protocol.OptionalHooks`), or `default`
    when the lowering does not define it."""
    if optional_hook(lowering, hook) is None:
        return default
    return call(lowering, hook, *args, case=case, expect=expect)
