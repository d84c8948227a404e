"""What plugin code leaves behind once its work is done (threads, processes), and a `check` process that ends all
the same.

A lowering's code may start a non-daemon thread (at import, or in `run()` under `--no-isolate`): the interpreter
waits for it at exit, so a `check` that printed its table and wrote its report never ended. It may start
processes (a `run()` that forks, or starts a `sleep`): they outlived `check` and held its output open, so a CI
step reading that pipe never ended. Here:

- `own_group()` / `stop_group(pgid)`: an isolated worker (and the plugin probe) leads a process group of its
  own (`parity.exec.isolation`); whatever its lowering starts there is in that group, and the whole group is killed
  when the worker is stopped or replaced (a hook past its timeout, a crash, the end of the run). A process
  that leaves the group on purpose (`setsid`) is not followed.
- `stop_stray_children()`: this process's own child processes that the framework did not start (its fork
  server, its resource tracker) are killed, with their process group where they lead one: what a plugin
  started at import, or a lowering under `--no-isolate`. A grandchild whose parent already exited has left
  this process's reach and is not followed.
- `finish(code)`: the end of a `check` process (`parity.front.cli.console`, `python -m parity.front.child`): the stray
  children stopped, then the interpreter's own exit, watched: if it is still waiting for non-daemon threads
  after `EXIT_GRACE` seconds, they are named on stderr and the process exits at once with `code` (unchanged;
  without the interpreter's remaining clean-up, the report being written already).

Public: `EXIT_GRACE`, `own_group`, `stop_group`, `stray_threads`, `describe_thread`, `stray_children`,
`stop_stray_children`, `finish`.
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import sys
import threading
import time
from multiprocessing import forkserver, resource_tracker
from pathlib import Path
from typing import Callable, NoReturn

EXIT_GRACE = 1.0  # seconds the interpreter may wait for threads at exit before they are dropped


def own_group() -> None:
    """Make this process the leader of a process group of its own (best effort)."""
    try:
        os.setpgid(0, 0)
    except OSError:
        pass


def stop_group(pgid: int | None) -> bool:
    """SIGKILL the process group `pgid` (an isolated worker's: the worker and what its lowering started); True
    when some process was in it. Never this process's own group."""
    if not pgid or pgid <= 1 or pgid == os.getpgrp():
        return False
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        return False
    return True


# ---- threads ------------------------------------------------------------------------------------------------

def stray_threads() -> list[threading.Thread]:
    """The live non-daemon threads other than the main one: those the interpreter waits for at exit."""
    main = threading.main_thread()
    return [t for t in threading.enumerate() if t is not main and not t.daemon and t.is_alive()]


def describe_thread(t: threading.Thread) -> str:
    """`'name' (at file.py:12 in fn)`: a thread and the innermost frame of its own code it is in now."""
    frame = sys._current_frames().get(t.ident) if t.ident is not None else None
    while frame is not None and frame.f_code.co_filename.endswith(("threading.py",)) and frame.f_back is not None:
        frame = frame.f_back
    where = (f" (at {Path(frame.f_code.co_filename).name}:{frame.f_lineno} in {frame.f_code.co_name})"
             if frame is not None else "")
    return f"{t.name!r}{where}"


# ---- child processes ----------------------------------------------------------------------------------------

def _framework_children() -> set[int]:
    """Children of this process the framework started and that end with it: the multiprocessing fork server
    and resource tracker, and multiprocessing's own children."""
    pids = {getattr(forkserver._forkserver, "_forkserver_pid", None),
            getattr(resource_tracker._resource_tracker, "_pid", None)}
    pids |= {p.pid for p in multiprocessing.active_children()}
    return {p for p in pids if isinstance(p, int)}


def _stat(pid: str) -> tuple[int, int, str] | None:
    """(ppid, pgid, command name) of `/proc/<pid>`, or None."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    name, _, rest = text.partition(" (")[2].rpartition(") ")
    fields = rest.split()
    return (int(fields[1]), int(fields[2]), name) if len(fields) > 2 else None


def stray_children() -> list[tuple[int, int, str]]:
    """This process's live child processes the framework did not start, as (pid, pgid, command name); none
    where there is no `/proc`."""
    if not Path("/proc/self/stat").exists():
        return []
    me, keep = os.getpid(), _framework_children()
    out = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) in keep:
            continue
        st = _stat(entry)
        if st is not None and st[0] == me:
            out.append((int(entry), st[1], st[2]))
    return out


def stop_stray_children() -> list[str]:
    """Kill `stray_children()` (each with its process group where it leads one, not this process's); their
    descriptions (`sleep (pid 123)`)."""
    said = []
    for pid, pgid, name in stray_children():
        if pgid == pid:
            stop_group(pgid)
        try:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
        except (ProcessLookupError, ChildProcessError, PermissionError):
            pass
        said.append(f"{name} (pid {pid})")
    return said


# ---- the end of the process ---------------------------------------------------------------------------------

def _stderr(line: str) -> None:
    try:
        print(line, file=sys.stderr, flush=True)
    except Exception:  # noqa: BLE001  (a closed stderr: the note is lost, the exit is not)
        pass


def _flush() -> None:
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:  # noqa: BLE001  (a closed pipe: nothing more to say)
            pass


def _exit_if_stuck(code: int, grace: float, say: Callable[[str], None]) -> None:
    """In a daemon thread while the interpreter exits: past `grace` seconds with non-daemon threads still
    running (it waits for them), name them and exit with `code` at once."""
    while True:
        time.sleep(grace)
        left = stray_threads()
        if left:
            say(f"dflash-parity: note: plugin code left {len(left)} thread(s) running after the report "
                f"({', '.join(describe_thread(t) for t in left)}); not waited for: the process exits with the "
                f"run's exit code {code}")
            _flush()
            os._exit(code)


def finish(code: int, *, grace: float = EXIT_GRACE, say: Callable[[str], None] = _stderr) -> NoReturn:
    """End this process with `code` (see the module docstring): the stray children stopped and named, then the
    interpreter's exit, which may not wait for non-daemon threads longer than `grace` seconds."""
    stopped = stop_stray_children()
    if stopped:
        say(f"dflash-parity: note: stopped {len(stopped)} process(es) a lowering's or plugin's code left running: "
            f"{', '.join(stopped[:5])}{', ...' if len(stopped) > 5 else ''}")
    _flush()
    threading.Thread(target=_exit_if_stuck, args=(code, grace, say), name="dflash-parity-exit", daemon=True).start()
    sys.exit(code)
