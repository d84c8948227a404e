"""The process machinery's implementations of the engine's ports, installed once by the front ends' start-up.

`install()`: every port the engine and the strategies ask through gets its process-aware implementation:

- the hook runner (`lowerings.calls.Runner`): the watchdog, `parity.exec.hooks.watchdog`;
- the device memory (`parity.engine.ports.DeviceMemory`): `parity.exec.memory.SharedDeviceMemory` (a large case
  leases its bytes from the other processes on its GPU);
- the draw-ahead search (`DrawAhead`): `parity.exec.draw_ahead.ForkedDrawAhead` (a forked drawer);
- the stop request (`StopRequest`): `parity.exec.interrupt.SignalStop` (a signal the handler saw).

Run it in every process that judges cases (`check`, `repro`, a pytest session, a `--jobs` child, an isolated
worker started as a fresh interpreter), before it forks workers: a forked child inherits what is installed.
Idempotent: a second call installs the same implementations again. The case executor and the sanitizer replay
are per check, given to `check_lowering` by the session (`parity.engine.ports`).
"""

from __future__ import annotations

from lowerings import calls
from parity.engine import ports
from parity.exec import hooks
from parity.exec.draw_ahead import ForkedDrawAhead
from parity.exec.interrupt import SignalStop
from parity.exec.memory import SharedDeviceMemory


def implementations() -> dict[str, object]:
    """The process machinery's implementation of each engine port, by `parity.engine.ports.Ports` field (for
    `ports.install(**...)`, or `ports.installed(**...)` around a block)."""
    return {"memory": SharedDeviceMemory(), "draw_ahead": ForkedDrawAhead(), "stop": SignalStop()}


def install() -> None:
    """Install every port's process-aware implementation in this process (idempotent)."""
    hooks.install()
    ports.install(**implementations())


def installed() -> bool:
    """Whether this process asks the process machinery's implementations now (`install()` ran, and nothing
    replaced one since: a block of `parity.engine.ports.installed`, `lowerings.calls.runner_set`)."""
    now = ports.current()
    return (calls.runner() is hooks.watchdog and isinstance(now.memory, SharedDeviceMemory)
            and isinstance(now.draw_ahead, ForkedDrawAhead) and isinstance(now.stop, SignalStop))
