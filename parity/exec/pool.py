"""One process pool for the child processes of `check --jobs` and `python -m parity.exec.warmup --jobs`.

`run_pool(tasks, start, size, done)` keeps up to `size` children running (`start(task) -> Popen`), calls
`done(task, exit_code, seconds)` as each ends (the child's CPU seconds, user + system, its reaped
descendants included, are then `cpu_seconds(proc)`: a job whose CPU time is near its wall time waits on
nothing but the cores), and polls for a SIGINT the interpreter swallowed
(`parity.exec.interrupt.raise_if_requested`). On KeyboardInterrupt with a `grace`, each running child gets
SIGTERM and up to `grace` seconds to finish (to write its partial part); without one the interrupt goes
on up. SIGTERM, not SIGINT: a child handles both alike once it runs (`parity.exec.interrupt.installed(force=True)`),
but one still starting has no handler yet, and may have inherited SIGINT ignored (a background job, a pytest-xdist
worker): SIGINT was then lost and the child ran its cases to the end; SIGTERM's default ends it.
Children never outlive the pool: started with `child_kwargs()`, each leads its own process group and gets SIGKILL
from the kernel when this process ends, however it ends (Linux `PR_SET_PDEATHSIG`), and on every exit path through
`run_pool` its whole group is killed in a `finally`.

Public: `run_pool`, `child_kwargs`, `die_with_parent`, `stop_group`, `cpu_seconds`, `process_alive`.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from typing import Any, Callable, Hashable, Sequence, TypeVar

from parity.exec.interrupt import raise_if_requested

T = TypeVar("T", bound=Hashable)


def process_alive(pid: int | None) -> bool:
    """Whether process `pid` runs. A zombie does not (dead, not yet reaped by its parent): Linux's
    `/proc/PID/stat` says so; elsewhere a signal 0 answers, which takes a zombie for alive."""
    if pid is None:
        return False
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()[0] not in (b"Z", b"X")
    except FileNotFoundError:
        return False
    except (OSError, IndexError):
        pass
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _libc():
    """libc, loaded once here: the child's pre-exec hook must not load a library after the fork."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        import ctypes

        return ctypes.CDLL("libc.so.6", use_errno=True)
    except OSError:
        return None


def _dies_with_parent(libc, parent: int):
    """A `preexec_fn`: SIGKILL this child when the process that started it ends (`PR_SET_PDEATHSIG`); if
    that process already ended before the call, exit now."""
    def hook() -> None:
        if libc is not None:
            libc.prctl(1, int(signal.SIGKILL))  # PR_SET_PDEATHSIG
        if os.getppid() != parent:
            os._exit(1)
    return hook


def die_with_parent(parent: int) -> None:
    """In a child just forked by `parent` (not through `child_kwargs`: `parity.exec.prefork`): the same bond, now."""
    _dies_with_parent(_libc(), parent)()


def child_env(jobs: int, environ: dict[str, str] | None = None, cpus: int | None = None,
              mps: dict[str, str] | None = None) -> dict[str, str]:
    """The children's environment: this one, with each child's CPU threads (OpenMP, MKL, OpenBLAS) and inductor's
    compile workers (`TORCHINDUCTOR_COMPILE_THREADS`; torch's default is a pool of every core, started by a
    child's first `torch.compile`) capped at its share of the cores unless the user set them; `jobs`
    processes of a full-width pool each oversubscribe the cores (measured on 2 cores: 3 jobs took twice as
    long as one after another). `mps`: the CUDA MPS daemon's entries (`parity.exec.mps.MpsState.env`), set over
    this environment's."""
    env = dict(os.environ if environ is None else environ)
    share = str(max(1, (cpus or os.cpu_count() or 1) // jobs))
    for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS", "TORCHINDUCTOR_COMPILE_THREADS"):
        env.setdefault(var, share)
    env.update(mps or {})
    return env


def child_kwargs() -> dict[str, Any]:
    """`subprocess.Popen` keyword arguments of a pool child: its own process group (a terminal's Ctrl-C
    reaches this process only, which passes it on), killed when this process ends."""
    return {"start_new_session": True, "preexec_fn": _dies_with_parent(_libc(), os.getpid())}


def stop_group(proc: subprocess.Popen) -> None:
    """SIGKILL the child's process group (it leads its own session: the child, its fork server, its
    workers); the child itself at least."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError, OSError):
        pass
    try:
        proc.kill()
    except OSError:
        pass


def _poll(proc: subprocess.Popen) -> int | None:
    """`proc.poll()`, reaping through `os.wait4` where there is one, so the child's resource use is kept
    (`cpu_seconds`)."""
    if not isinstance(getattr(proc, "pid", None), int) or getattr(proc, "returncode", None) is not None \
            or not hasattr(os, "wait4"):
        return proc.poll()
    try:
        pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
    except ChildProcessError:  # reaped elsewhere: Popen knows what it can
        return proc.poll()
    if pid == 0:
        return None
    proc.returncode = os.waitstatus_to_exitcode(status)
    proc.dflash_rusage = usage  # type: ignore[attr-defined]
    return proc.returncode


def cpu_seconds(proc: subprocess.Popen) -> float | None:
    """The CPU seconds (user + system) an ended child of `run_pool` used, its reaped descendants included;
    None when unknown (no `os.wait4`, or the child was reaped otherwise)."""
    usage = getattr(proc, "dflash_rusage", None)
    return None if usage is None else usage.ru_utime + usage.ru_stime


def run_pool(tasks: Sequence[T], start: Callable[[T], subprocess.Popen], size: int,
             done: Callable[[T, int, float], None], *, poll: float = 0.2, grace: float | None = None,
             say: Callable[[str], None] = lambda line: None, what: str = "process(es)") -> bool:
    """Run `tasks` in up to `size` children (see the module docstring); True when interrupted (only with
    a `grace`: without one the KeyboardInterrupt propagates once the children are stopped)."""
    pending = list(tasks)
    running: dict[T, tuple[subprocess.Popen, float]] = {}
    interrupted = False

    def reap(task: T, code: int) -> None:
        _, t0 = running.pop(task)
        done(task, code, time.perf_counter() - t0)

    def reap_finished() -> None:
        """Reap every child that has exited; wait `poll` seconds if some still run."""
        for task in list(running):
            code = _poll(running[task][0])
            if code is not None:
                reap(task, code)
        if running:
            time.sleep(poll)

    try:
        while pending or running:
            while pending and len(running) < size:
                task = pending.pop(0)
                running[task] = (start(task), time.perf_counter())
            reap_finished()
            raise_if_requested()  # a SIGINT the interpreter swallowed (parity.exec.interrupt)
    except KeyboardInterrupt:
        if grace is None:
            raise
        interrupted = True
        say(f"interrupted: asking {len(running)} running {what} to write their partial reports (up to {grace:g} s); "
            f"{len(pending)} not started")
        for proc, _ in running.values():
            proc.send_signal(signal.SIGTERM)  # not SIGINT: see the module docstring
        deadline = time.perf_counter() + grace
        try:
            while running and time.perf_counter() < deadline:
                reap_finished()
            if running:
                say(f"{len(running)} {what} wrote nothing within {grace:g} s: stopping them")
        except KeyboardInterrupt:  # interrupted again: stop now, but still keep what was written
            say(f"interrupted again: stopping {len(running)} {what} now; what they wrote is kept")
    finally:
        for task in list(running):  # past the grace, a second interrupt, an error: stop them
            proc = running[task][0]
            stop_group(proc)
            reap(task, proc.wait())
    return interrupted
