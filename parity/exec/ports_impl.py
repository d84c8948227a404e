"""The process machinery's implementations of the engine's ports, installed once by the front ends' start-up.

`install()`: every port the engine and the strategies ask through gets its process-aware implementation: the hook
watchdog (`lowerings.calls.Runner`: `parity.exec.hooks.watchdog`), and what `parity.engine.ports` declares.
"""

from __future__ import annotations

from parity.exec import hooks


def install() -> None:
    """Install every port's implementation in this process (idempotent)."""
    hooks.install()
