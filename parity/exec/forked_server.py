"""The isolated workers' fork server started by forking this process, not as a fresh interpreter, where that is safe.

`multiprocessing`'s fork server is a fresh interpreter (`python -c "from multiprocessing.forkserver import main;
main(...)"`) that imports `parity.exec.isolation._PRELOAD` (torch and the framework) before it forks the first worker.
A `check --jobs` child (forked from `parity.exec.prefork`) and a plain `check` have already imported all of it: the
fresh interpreter imported it again, once per lowering's check, 16 times at the start of run 8's command on the
H200, beside the children's Triton compiles. `start(ctx)` runs `ensure_running()` with the launch of that one
command replaced by a fork of this process that runs the same command (`exec` of its `-c` text): the same server
code, the same arguments, over imports already done.

Forking is only safe (`forkable` says why not) while this process:
- has not initialized CUDA (`parity.exec.prefork.cuda_initialized`: a process forked after `cuInit` cannot use the
  GPU; the workers initialize their own device);
- runs one thread (another thread may hold a lock, the import lock or a stream's, that the fork keeps held);
- holds the built-in lowerings alone (a worker loads the plugin files itself: a lowering already registered would
  be registered twice; a built-in a test replaced would run in its place).
Otherwise, or where `DFLASH_PARITY_FORKED_SERVER=0`, the fresh interpreter starts as before. In the forked server,
as `exec` would: every descriptor but the standard ones and those the command is passed is closed (the server exits
when its clients' end of the "alive" pipe closes: it must not hold one), the signal handlers are a fresh
interpreter's, no profiler or tracer runs, the objects inherited are frozen out of the collector (a collected file
object would close a descriptor number the server reuses), and it leaves with `os._exit` (this process's `atexit`
handlers are not its own).

H200, run 8's command cold on one host (docs/gpu/2026-12-04-h200-session27.md run 96, the variable set then not):
the precompile of each child 0.6 s shorter, the lowerings' cold rates -1% to +20%, 351 against 371 CPU-s in all.

Public: `start(ctx) -> str` (how the server was started: "forked", "fresh: <why>" or "running"), `forkable() -> str |
None`, `describe()`, `how`, `ENV`.
"""

from __future__ import annotations

import contextlib
import gc
import os
import signal
import sys
import threading
from typing import Any, Callable

_COMMAND = "multiprocessing.forkserver import main"
ENV = "DFLASH_PARITY_FORKED_SERVER"  # "0": always the fresh interpreter (an escape hatch, and the A/B of run 96)
how: str | None = None  # how this process's fork server was last started ("forked", "fresh: <why>")


def describe() -> str:
    """How this process's fork server started, in words (`how`)."""
    if how == "forked":
        return "the isolated workers' fork server: forked from this process (its imports shared)"
    return f"the isolated workers' fork server: a fresh interpreter ({(how or 'not started').partition(': ')[2]})"


def forkable() -> str | None:
    """Why this process must not fork the fork server (None: it may)."""
    from parity.exec.prefork import cuda_initialized

    if os.environ.get(ENV, "") == "0":
        return f"{ENV}=0"
    if threading.active_count() > 1:
        return f"{threading.active_count()} threads run in this process"
    if cuda_initialized():
        return "this process has initialized CUDA"
    from lowerings import registry

    changed = registry.changed_here()
    if changed:
        return f"the registry differs from the built-ins here ({', '.join(changed[:3])})"
    return None


def start(ctx: Any) -> str:
    """Make sure `ctx`'s (a forkserver context's) fork server runs, forked from this process where `forkable()`
    when it has to be launched; returns how it was started this time ("running": it already was). Whether it runs
    is `ensure_running`'s own question (it reaps a dead server and launches another); only its launch is replaced."""
    global how
    from multiprocessing import forkserver, util

    server = forkserver._forkserver
    before = getattr(server, "_forkserver_pid", None)
    real, launched = util.spawnv_passfds, []
    util.spawnv_passfds = _launching(real, launched)
    try:
        forkserver.ensure_running()
    finally:
        util.spawnv_passfds = real
    if launched:
        how = launched[0]
    elif getattr(server, "_forkserver_pid", None) != before:
        how = "fresh: this Python launches its fork server another way"
    else:
        return "running"
    return how


def _launching(real: Callable, launched: list[str]) -> Callable:
    """`util.spawnv_passfds` that, for the fork server's command, forks this process where `forkable()` and runs
    `real` (the fresh interpreter) where not, appending how to `launched`; any other command (the resource
    tracker's) goes to `real`."""

    def spawnv_passfds(path: str, args: list[str], passfds: Any) -> int:
        code = args[-1] if len(args) >= 2 and args[-2] == "-c" else ""
        if _COMMAND not in code:
            return real(path, args, passfds)
        why = forkable()
        if why is not None:
            launched.append(f"fresh: {why}")
            return real(path, args, passfds)
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid:
            launched.append("forked")
            return pid
        _become_server(code, passfds)  # never returns
        return 0  # pragma: no cover

    return spawnv_passfds


def _become_server(code: str, passfds: Any) -> None:
    status = 0
    try:
        sys.setprofile(None)
        sys.settrace(None)
        threading.setprofile(None)
        threading.settrace(None)
        gc.freeze()
        _close_all_but({0, 1, 2, *(int(fd) for fd in passfds)})
        _fresh_signals()
        from multiprocessing import forkserver

        forkserver._forkserver._lock = threading.Lock()  # held by the `ensure_running` this fork came from
        exec(compile(code, "<forkserver>", "exec"), {"__name__": "__forkserver__"})
    except SystemExit as exc:  # the server's way out: its clients are gone
        status = exc.code if isinstance(exc.code, int) else 0
    except BaseException:  # noqa: BLE001
        import traceback

        traceback.print_exc()
        status = 1
    finally:
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                stream.flush()
        os._exit(status)


def _close_all_but(keep: set[int]) -> None:
    """Close every descriptor of this process not in `keep` (what `exec` with `close_fds` does)."""
    top = os.sysconf("SC_OPEN_MAX") if hasattr(os, "sysconf") else 1 << 16
    lo = 0
    for fd in sorted(keep):
        if fd > lo:
            os.closerange(lo, fd)
        lo = fd + 1
    os.closerange(lo, max(lo, top))


def _fresh_signals() -> None:
    """The handlers a fresh interpreter starts with: SIGINT raises KeyboardInterrupt, SIGPIPE (and SIGXFSZ)
    ignored, every other signal this process handles in Python back to its default; no wakeup descriptor."""
    with contextlib.suppress(ValueError):
        signal.set_wakeup_fd(-1)
    fresh = {signal.SIGINT: signal.default_int_handler, signal.SIGPIPE: signal.SIG_IGN}
    if hasattr(signal, "SIGXFSZ"):
        fresh[signal.SIGXFSZ] = signal.SIG_IGN
    for sig in signal.valid_signals():
        try:
            current = signal.getsignal(sig)
        except (OSError, ValueError):
            continue
        want = fresh.get(sig, signal.SIG_DFL)
        if current is None or current == want:
            continue
        with contextlib.suppress(OSError, ValueError, RuntimeError):
            signal.signal(sig, want)
