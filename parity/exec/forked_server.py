"""The isolated workers' fork server started by forking this process, not as a fresh interpreter, where that is safe.

`multiprocessing`'s fork server is a fresh interpreter (`python -c "from multiprocessing.forkserver import main;
main(...)"`) that imports the workers' preload (`parity.exec.worker_process.PRELOAD`: torch and the framework) before
it forks the first worker. A `check --jobs` child (forked from `parity.exec.prefork`) and a plain `check` have already
imported all of it: the fresh interpreter imported it again, once per lowering's check, beside the children's Triton
compiles. `start(ctx)` runs `ensure_running()` with the launch of that one command replaced by a fork of this process
that runs the same command (`exec` of its `-c` text): the same server code, the same arguments, over imports already
done. What it saved: docs/performance.md ("the workers' fork server forked").

Forking is only safe (`forkable` says why not) while this process:
- has not initialized CUDA (`parity.exec.prefork_server.cuda_initialized`: a process forked after `cuInit` cannot use
  the GPU; the workers initialize their own device);
- runs one thread (another thread may hold a lock, the import lock or a stream's, that the fork keeps held);
- holds the built-in lowerings alone (a worker loads the plugin files itself: a lowering already registered would
  be registered twice; a built-in a test replaced would run in its place).
Otherwise, or where `DFLASH_PARITY_FORKED_SERVER=0`, the fresh interpreter starts as before. In the forked server,
as `exec` would: every descriptor but the standard ones and those the command is passed is closed (the server exits
when its clients' end of the "alive" pipe closes: it must not hold one), the signal handlers are a fresh
interpreter's, no profiler or tracer runs, the objects inherited are frozen out of the collector (a collected file
object would close a descriptor number the server reuses), and it leaves with `os._exit` (this process's `atexit`
handlers are not its own).

The standard library's private names: `multiprocessing` has no public way to choose how its fork server is launched
(only `set_forkserver_preload` and `forkserver.ensure_running`, both used). So private names are used, all in
`_Stdlib` below and nowhere else: `multiprocessing.util.spawnv_passfds` (the one call that launches the server,
replaced for the duration of `ensure_running`), `multiprocessing.forkserver._forkserver` (the module's server object:
its `_forkserver_pid` tells whether `ensure_running` launched one, and its `_lock`, held by the `ensure_running` the
fork came from, is replaced by a fresh lock in the forked server). Where this Python lacks any of them,
`_Stdlib.missing()` names it and the fresh interpreter starts (`start` says so); `tests/parity/test_forked_server.py`
fails on a Python whose names changed.

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
from typing import Any, Callable, Iterator

_COMMAND = "multiprocessing.forkserver import main"
ENV = "DFLASH_PARITY_FORKED_SERVER"  # "0": always the fresh interpreter (an escape hatch, and an A/B switch)
how: str | None = None  # how this process's fork server was last started ("forked", "fresh: <why>")


def describe() -> str:
    """How this process's fork server started, in words (`how`)."""
    if how == "forked":
        return "the isolated workers' fork server: forked from this process (its imports shared)"
    return f"the isolated workers' fork server: a fresh interpreter ({(how or 'not started').partition(': ')[2]})"


def forkable() -> str | None:
    """Why this process must not fork the fork server (None: it may)."""
    from parity.exec.prefork_server import cuda_initialized

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


class _Stdlib:
    """Every private name of the standard library this module uses (see the module docstring), and nothing else."""

    @staticmethod
    def missing() -> str | None:
        """The private name this Python lacks (None: all are there)."""
        from multiprocessing import forkserver, util

        if not callable(getattr(util, "spawnv_passfds", None)):
            return "multiprocessing.util.spawnv_passfds"
        if getattr(forkserver, "_forkserver", None) is None:
            return "multiprocessing.forkserver._forkserver"
        return None

    @staticmethod
    def server_pid() -> int | None:
        """The pid of the fork server the module last launched (None: none)."""
        from multiprocessing import forkserver

        return getattr(forkserver._forkserver, "_forkserver_pid", None)

    @staticmethod
    @contextlib.contextmanager
    def launching_with(launch: Callable[[Callable], Callable]) -> Iterator[None]:
        """Within: `util.spawnv_passfds`, the call that launches the server, is `launch(the real one)`."""
        from multiprocessing import util

        real = util.spawnv_passfds
        util.spawnv_passfds = launch(real)
        try:
            yield
        finally:
            util.spawnv_passfds = real

    @staticmethod
    def fresh_lock() -> None:
        """In the forked server: the module's lock, held by the `ensure_running` this fork came from, replaced."""
        from multiprocessing import forkserver

        forkserver._forkserver._lock = threading.Lock()


def start(ctx: Any) -> str:
    """Make sure `ctx`'s (a forkserver context's) fork server runs, forked from this process where `forkable()`
    when it has to be launched; returns how it was started this time ("running": it already was). Whether it runs
    is `ensure_running`'s own question (it reaps a dead server and launches another); only its launch is replaced."""
    global how
    from multiprocessing import forkserver

    lacking = _Stdlib.missing()
    if lacking is not None:
        forkserver.ensure_running()
        how = f"fresh: this Python has no {lacking}"
        return how
    before = _Stdlib.server_pid()
    launched: list[str] = []
    with _Stdlib.launching_with(lambda real: _launching(real, launched)):
        forkserver.ensure_running()
    if launched:
        how = launched[0]
    elif _Stdlib.server_pid() != before:
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
        _Stdlib.fresh_lock()
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
