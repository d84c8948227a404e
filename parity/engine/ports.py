"""What the engine needs of processes and devices, behind ports: one `typing.Protocol` each, a pure default here,
the process machinery's implementation in `parity.exec`.

| port              | asked by                                  | pure default (engine)          | process machinery (`parity.exec`)  |
|-------------------|-------------------------------------------|--------------------------------|------------------------------------|
| `DeviceMemory`    | `run_case`, the hardening, `call_lowering` | `device_memory.InProcessMemory` | `memory.SharedDeviceMemory`       |
| `DrawAhead`       | the sweep's search (`--draw-ahead`)        | `draws.DrawHere`               | `draw_ahead.ForkedDrawAhead`       |
| `StopRequest`     | the sweep, between two cases               | `StopFlag`                     | `interrupt.SignalStop`             |
| `CaseExecutor`    | `check_lowering(executor=...)`             | None: `run_case` in process    | `isolation.IsolatedExecutor`       |
| `SanitizerReplay` | `check_lowering(sanitizer=...)`            | None: no replay                | `sanitizer.replay` (plugins bound) |

How the engine reaches an implementation: the first three are facts of the process (its device, whether it may
fork, the signals it handles), asked deep inside `run_case` and between any two cases, so they sit in a registry
here: `current()` answers the `Ports` installed now (a frozen value, one field per port), `install(**ports)`
replaces some of them for the whole process, `installed(**ports)` for a block (tests). The defaults are pure (one
process, in process, CPU or GPU alike, no fork, signal or file lock). `parity.exec.ports_impl.install()`
installs the process machinery's implementations; the front ends' start-up runs it once, in each process that
judges cases, before that process forks workers (a forked child inherits the registry; a fresh interpreter
starts from the defaults). The last two are per check (a worker per lowering; the session's plugins), so they
stay explicit arguments of `check_lowering` (`parity.engine.sweep_state.SweepSpec`).

Public: `DeviceMemory`, `Lease`, `DrawAhead`, `StopRequest`, `CaseExecutor`, `SanitizerReplay`, `StopFlag`,
`Ports`, `current`, `install`, `installed`, `stop_requested`, `raise_if_stop_requested`.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any, Callable, Iterator, Protocol, runtime_checkable

from oracle.case import Case
from parity.engine.case_outcome import CaseOutcome
from parity.engine.device_memory import InProcessMemory
from parity.engine.draws import DrawHere


@runtime_checkable
class Lease(Protocol):
    """`with memory.lease(case, opts) as held:` around one case; `held.waited`: seconds it waited for room."""

    waited: float

    def __enter__(self) -> "Lease": ...

    def __exit__(self, *exc: Any) -> Any: ...


@runtime_checkable
class DeviceMemory(Protocol):
    """The device's memory as a case's steps ask for it (`parity.engine.device_memory` gives the contract).

    `fits(outcome, check, case, opts, need, what)`: whether `need` bytes fit now, else False with why under
    `outcome.skipped[check]`; `lease(case, opts, alone=False)`: a context manager a case runs inside (a large case
    waits there for room beside other processes; `alone`: for all of it); `release_cached(opts)`: the allocator's
    cached blocks back to the device; `is_out_of_memory(err)`: whether an exception is the device running out."""

    def fits(self, outcome: Any, check: str, case: Case, opts: Any, need: int, what: str) -> bool: ...

    def lease(self, case: Case, opts: Any, *, alone: bool = False) -> Lease: ...

    def release_cached(self, opts: Any) -> None: ...

    def is_out_of_memory(self, err: BaseException) -> bool: ...


@runtime_checkable
class DrawAhead(Protocol):
    """Where hypothesis's draws happen while this process judges (`parity.engine.draws` gives the contract).

    `search(prop, enabled=, draw=, judge=, resume=, shared=)`: run hypothesis's test function `prop` (where
    nothing can draw elsewhere, or not `enabled`: `prop()` itself), or have a drawer run `draw(send)` elsewhere
    and judge each case it sends with `judge(case)` while every case passes, then `resume(judged, last)`
    (hypothesis's own search over `draws.replaying`) when one fails or raises, or the drawer ends. `shared`: the
    file through which the shards of one lowering share one drawer (None: a drawer of its own)."""

    def search(self, prop: Callable[[], None], *, enabled: bool, draw: Callable[..., None],
               judge: Callable[[Case], CaseOutcome], resume: Callable[..., None],
               shared: Path | None = None) -> None: ...


@runtime_checkable
class StopRequest(Protocol):
    """Whether the run was asked to stop (SIGINT, SIGTERM, SIGHUP seen by the process machinery) though no
    KeyboardInterrupt reached the sweep (one raised inside a garbage-collector callback is dropped by Python):
    the sweep asks before each case and raises KeyboardInterrupt, so the report of what ran is kept."""

    def requested(self) -> bool: ...


class CaseExecutor(Protocol):
    """Where `check_lowering` runs a case: `run(lowering_name, case) -> CaseOutcome`, the case judged there as
    `run_case` judges it (None instead of an executor: in this process). An executor may also answer
    `available(lowering_name, device) -> (ok, why)`, `leave_state(lowering_name, case)` and
    `probe(lowering_name, case, runs, history)` (`parity.engine.flakiness.Reruns`), asked there."""

    def run(self, lowering_name: str, case: Case) -> CaseOutcome: ...


class SanitizerReplay(Protocol):
    """`replay(lowering_name, case, history) -> text`: the stream sanitizer's report on `case` (after `history`,
    a case that ran before it, when the failure depends on one), in `parity.engine.sanitizer_report`'s format."""

    def __call__(self, lowering_name: str, case: Case, history: Case | None) -> str: ...


class StopFlag:
    """The stop request's pure default: a flag an embedding application may raise (`request()`); nothing here
    raises it (without the process machinery a SIGINT is Python's own KeyboardInterrupt)."""

    def __init__(self) -> None:
        self._requested = False

    def request(self) -> None:
        self._requested = True

    def clear(self) -> None:
        self._requested = False

    def requested(self) -> bool:
        return self._requested


_PROTOCOLS = {"memory": DeviceMemory, "draw_ahead": DrawAhead, "stop": StopRequest}


@dataclass(frozen=True)
class Ports:
    """The implementations the engine asks now (see the module docstring)."""

    memory: DeviceMemory = field(default_factory=InProcessMemory)
    draw_ahead: DrawAhead = field(default_factory=DrawHere)
    stop: StopRequest = field(default_factory=StopFlag)

    def __post_init__(self) -> None:
        for f in fields(self):
            impl = getattr(self, f.name)
            if not isinstance(impl, _PROTOCOLS[f.name]):
                raise TypeError(f"ports.{f.name}: {type(impl).__name__} does not implement "
                                f"{_PROTOCOLS[f.name].__name__}")


_current = Ports()


def current() -> Ports:
    """The ports installed in this process now."""
    return _current


def install(**ports: Any) -> Ports:
    """Install the given implementations (`memory=`, `draw_ahead=`, `stop=`) for the whole process; the others
    stay. Returns the `Ports` installed before. TypeError for an unknown port or an object that is not one."""
    global _current
    before, _current = _current, replace(_current, **ports)
    return before


@contextlib.contextmanager
def installed(**ports: Any) -> Iterator[Ports]:
    """`install(**ports)` for the block; after it, those ports as they were before it (the others as they are)."""
    global _current
    before = install(**ports)
    try:
        yield _current
    finally:
        _current = replace(_current, **{name: getattr(before, name) for name in ports})


def stop_requested() -> bool:
    """Whether the stop request port has seen a request to stop."""
    return _current.stop.requested()


def raise_if_stop_requested() -> None:
    """KeyboardInterrupt when a stop was requested (again, where the first KeyboardInterrupt was swallowed)."""
    if _current.stop.requested():
        raise KeyboardInterrupt
