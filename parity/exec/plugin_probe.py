"""The plugin files imported first in a throwaway worker process, before `check` (or `repro`) imports them.

A plugin that crashes the process importing it, raises, exits (`sys.exit(0)` at its top) or does not finish
importing within the hook timeout is refused (`--plugin FILE: ...`, exit 2) before anything runs: `probe_plugins`.
The probe leads a process group of its own, killed with it (`parity.exec.leftovers`): what a plugin starts at import
does not outlive the probe.

Public: `probe_plugins`.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from oracle.errors import InvalidInput
from parity.exec import hooks
from parity.exec.worker_process import (
    STARTUP_TIMEOUT, WorkerError, describe_exit, die_with_parent, start_process, worker_context)
from parity.exec.leftovers import own_group, stop_group


def probe_plugins(plugins: list[str], *, seconds: float | None = None,
                  startup_timeout: float = STARTUP_TIMEOUT) -> None:
    """Import each plugin file in a throwaway worker process, one after another, before this process
    imports them: a plugin that crashes the process, raises, exits (`sys.exit(0)` at its top) or does not
    finish importing within `seconds` (default: the hook timeout) raises `InvalidInput("--plugin FILE",
    ...)`. Costs a fork of the fork server (which the isolated run starts anyway) and the imports."""
    if not plugins:
        return
    limit = hooks.timeout() if seconds is None else float(seconds)
    init = {"plugins": [str(Path(p).resolve()) for p in plugins], "seconds": limit,
            "sys_path": [p for p in sys.path if p]}
    proc, conn = start_process(worker_context(), _probe_main, init, "dflash-parity-plugin-probe")

    def stop() -> int | None:
        if proc.is_alive():
            stop_group(proc.pid)
            proc.kill()
        proc.join(5)
        stop_group(proc.pid)  # what a plugin started at import
        code = proc.exitcode
        conn.close()
        return code

    try:
        try:
            started = conn.poll(startup_timeout) and conn.recv()
        except (EOFError, OSError):
            raise WorkerError(f"the plugin probe process died while starting: {describe_exit(stop())}") from None
        if not started:
            stop()
            raise WorkerError(f"the plugin probe process did not start within {startup_timeout:.0f} s")
        for path in plugins:
            where = f"--plugin {path}"
            try:
                answered = conn.poll(limit + 5.0)
                msg = conn.recv() if answered else None
            except (EOFError, OSError):
                raise InvalidInput(where, f"crashed the process importing it: {describe_exit(stop())}") from None
            if msg is None:
                stop()
                raise InvalidInput(where, f"did not finish importing within {limit:g} s (an endless loop at "
                                          f"import? --hook-timeout sets the bound)")
            if "ok" not in msg:
                raise InvalidInput(where, msg.get("error") or f"the import probe answered {msg!r:.100}")
    finally:
        stop()


def _probe_main(conn, init: dict[str, Any]) -> None:
    """The probe: `{"ok": path}` or `{"error": rule}` per plugin, in order (see `probe_plugins`)."""
    die_with_parent()
    own_group()
    for p in reversed(init.get("sys_path", [])):
        if p not in sys.path:
            sys.path.insert(0, p)
    conn.send({"ready": True})
    for path in init["plugins"]:
        try:
            hooks.load_plugin(path, init["seconds"])
            conn.send({"ok": path})
        except InvalidInput as err:
            conn.send({"error": err.rule})
            return
        except BaseException as err:  # noqa: BLE001  (reported to the parent)
            conn.send({"error": f"raised {type(err).__name__} on import: {err}"})
            return
