"""Starting the isolated workers (and the plugin probe): processes forked by `multiprocessing`'s fork server.

Workers are forked from a `multiprocessing` fork server that has imported torch and the framework once
(`forkserver` start method; `spawn` where there is none): replacing a dead worker costs a fork, not a torch import.
The fork server never touches CUDA; each worker initializes its own device. A lowering's check launches it first
thing (`start_fork_server`): a fork of that process where safe (`parity.exec.forked_server`).

Public: `STARTUP_TIMEOUT`, `PRELOAD`, `WorkerError`, `worker_context`, `start_process`, `start_fork_server`,
`describe_exit`, `die_with_parent`.
"""

from __future__ import annotations

import contextlib
import multiprocessing as mp
import signal
import sys
import types
from typing import Any

from parity.exec import forked_server

STARTUP_TIMEOUT = 300.0  # importing torch (and, on a GPU, initializing CUDA) on a loaded machine
PRELOAD = ["torch", "parity.engine.runner", "parity.engine.case_run", "parity.exec.worker", "lowerings.builtins"]


class WorkerError(RuntimeError):
    """The worker could not start, or the framework itself (not the lowering) raised in it."""


def worker_context() -> mp.context.BaseContext:
    if "forkserver" in mp.get_all_start_methods():
        ctx = mp.get_context("forkserver")
        ctx.set_forkserver_preload(PRELOAD)
        return ctx
    return mp.get_context("spawn")


def describe_exit(code: int | None) -> str:
    """`killed by SIGSEGV (signal 11)`, `exited with code 3`, ... for a worker's exit code."""
    if code is None:
        return "closed its connection without answering"
    if code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = f"signal {-code}"
        hint = " (the OOM killer or a SIGKILL from outside?)" if -code == signal.SIGKILL else ""
        return f"killed by {name} (signal {-code}){hint}"
    return f"exited with code {code} without answering"


def start_fork_server() -> str | None:
    """Launch the workers' fork server now rather than for the first worker (`available()`, after the planning and
    the JIT warm-up): its imports (`PRELOAD`) then overlap what the caller does meanwhile, or are not paid again
    (a fork of this process: `parity.exec.forked_server`). How it started ("forked", "fresh: <why>", "running"); None
    where this platform's start method has none (`spawn`)."""
    return _ensure_server(worker_context())


def _ensure_server(ctx) -> str | None:
    with _bare_main():  # as workers start
        return forked_server.start(ctx) if ctx.get_start_method() == "forkserver" else None


@contextlib.contextmanager
def _bare_main():
    """A bare `__main__` while a process (or the fork server) starts: multiprocessing re-runs the parent's main
    script in a spawned/forkserver child unless told otherwise; the worker needs nothing from it (and a script
    without a `__main__` guard would run again)."""
    main = sys.modules.get("__main__")
    sys.modules["__main__"] = types.ModuleType("__main__")
    try:
        yield
    finally:
        if main is not None:
            sys.modules["__main__"] = main


def start_process(ctx, target, init: dict[str, Any], name: str):
    """Start `target(conn, init)` in a process of `ctx`; returns (process, this side's connection)."""
    _ensure_server(ctx)
    parent_conn, child_conn = ctx.Pipe(duplex=True)
    proc = ctx.Process(target=target, args=(child_conn, init), name=name, daemon=True)
    with _bare_main():
        proc.start()
    child_conn.close()
    return proc, parent_conn


def die_with_parent() -> None:
    """Linux: get SIGKILL when the process that forked this one (the fork server) goes away."""
    if not sys.platform.startswith("linux"):
        return
    try:
        import ctypes

        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(1, int(signal.SIGKILL))  # PR_SET_PDEATHSIG
    except Exception:  # best effort
        pass
