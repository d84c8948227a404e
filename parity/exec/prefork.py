"""Start `check --jobs` children by forking one process that has imported everything once (`--jobs-start prefork`).

A fresh interpreter per `--jobs` child imports torch, triton, hypothesis and this project before its first case, and
its profiler's first start imports hundreds more modules (`torch._dynamo`, ...), each child paying that while every
core is busy. Here one process (`python -m parity.exec.prefork`, the "prefork": `parity.exec.prefork_server`)
imports them once, checks that the imports left CUDA untouched, and forks each child on request; a child then runs
`MODULE.main(ARGS)` as `python -m MODULE ARGS...` would (the front end's `--jobs` child), with its own environment
(`CUDA_VISIBLE_DEVICES`, the MPS pipe), its own session and process group, its stdout in its log, and initializes
CUDA itself. The modules to import are the caller's (`Prefork(preload=...)`, default
`parity.exec.prefork_server.PRELOAD`): a front end adds its own.

Forking is only safe while CUDA is untouched: the CUDA driver cannot be used in a child forked after `cuInit`.
The prefork asks the driver (`cuDeviceGetCount` answers CUDA_ERROR_NOT_INITIALIZED until something calls
`cuInit`) after each module it imports; a module that initialized CUDA ends the prefork with a reply that
names it (`PreforkError.module`), and the run starts one more prefork without it (each child imports it itself),
and only if that one is refused too starts its children as fresh interpreters, saying why.

Protocol (one JSON object per line): the prefork writes `{"ready": ..., "seconds", "cpu", "modules",
"skipped"}` (or `{"refused": why}`) on its stdout; the parent writes `{"id", "module", "args", "env", "log", "cwd"}`
requests on its stdin and reads `{"started": id, "pid"}`, then `{"exited": pid, "code", "cpu"}` when the
child is reaped (its CPU seconds, user + system, its reaped descendants included). The prefork leaves when
its stdin closes or its parent dies (`parity.exec.pool.child_kwargs`); its children die with it
(`PR_SET_PDEATHSIG`), so none outlives the run.

Public: `Prefork` (the parent's handle: `launch`, `start`, `spawn`, `close`, `kill`), `PreforkError`, `PRELOAD`,
`OPTIONAL`, `start_early`, `adopt_early`, `discard_early`; `cuda_initialized`, `preload`, `serve` are
`parity.exec.prefork_server`'s.
"""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import threading
import time
import types
from typing import Sequence

from parity.exec import pool
from parity.exec.prefork_server import OPTIONAL, PRELOAD, cuda_initialized, preload, serve  # noqa: F401

READY_TIMEOUT = 300.0  # the imports, on a loaded machine


class PreforkError(RuntimeError):
    """The prefork could not start, refused to fork (CUDA was initialized by an import: `module` names it) or
    died."""

    def __init__(self, why: str, module: str | None = None):
        super().__init__(why)
        self.module = module


# ---- the parent's handle --------------------------------------------------------------------------------
class _Child:
    """A forked child as `parity.exec.pool.run_pool` sees a `subprocess.Popen`: `pid`, `returncode`, `poll()`,
    `wait()`, `send_signal()`, `kill()`; its CPU seconds as `dflash_rusage` once reaped."""

    def __init__(self, owner: "Prefork", pid: int):
        self.owner, self.pid, self.returncode = owner, pid, None

    def poll(self) -> int | None:
        return self.owner.exit_of(self)

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            if deadline is not None and time.monotonic() > deadline:
                raise subprocess.TimeoutExpired(f"pid {self.pid}", timeout)
            time.sleep(0.02)
        return self.returncode  # type: ignore[return-value]

    def send_signal(self, sig: int) -> None:
        if self.returncode is None:
            try:
                os.kill(self.pid, sig)
            except ProcessLookupError:
                pass

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


class Prefork:
    """The parent's handle on one prefork process (see the module docstring).

    `start(env)` starts it with the environment every child shares (`parity.exec.pool.child_env`: the thread caps
    are read by the libraries it imports) and waits until it has imported `preload` (`ready_seconds`, `ready_cpu`)
    or raises `PreforkError` saying why it cannot serve. `spawn(argv, env, log)` forks a child running `argv`
    (`[python, "-m", MODULE, *ARGS]`: `MODULE.main(ARGS)`) with `env`, its stdout appended to `log` (which must
    exist). `close()` ends the prefork. `exclude`: modules of `preload` and `OPTIONAL` not to import (one that
    initialized CUDA in an earlier try)."""

    def __init__(self, preload: Sequence[str] = PRELOAD) -> None:
        self.preload = tuple(preload)
        self.proc: subprocess.Popen | None = None
        self.env: dict[str, str] = {}
        self.ready_seconds = self.ready_cpu = self.launched = self.waited = 0.0
        self.early = False  # launched by `start_early` before this run knew it would need it
        self._lock = threading.Condition()
        self._started: dict[int, int] = {}
        self._exited: dict[int, tuple[int, float]] = {}
        self._ended: str | None = None
        self._next = 0

    def launch(self, env: dict[str, str], exclude: Sequence[str] = ()) -> "Prefork":
        """Start the process without waiting for its imports (`start` waits; `start_early` launches)."""
        argv = [sys.executable, "-m", "parity.exec.prefork", "--preload", ",".join(self.preload),
                *(["--exclude", ",".join(exclude)] if exclude else [])]
        self.env, self.launched = dict(env), time.perf_counter()
        self.proc = subprocess.Popen(argv, stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, env=env, **pool.child_kwargs())
        return self

    def start(self, env: dict[str, str], timeout: float = READY_TIMEOUT, exclude: Sequence[str] = ()) -> "Prefork":
        early = None if exclude else adopt_early(env, self.preload)
        if early is not None:
            self.proc, self.env, self.launched, self.early = early.proc, early.env, early.launched, True
        else:
            self.launch(env, exclude)
        waited = time.perf_counter()
        line = self._read_line(timeout)
        self.waited = time.perf_counter() - waited
        try:
            msg = json.loads(line)
        except ValueError:
            msg = {}
        if not msg.get("ready"):
            self.close()
            why = msg.get("refused") or (f"it ended before it was ready (exit {self.proc.returncode})" if not line
                                         else f"it answered {line[:200]!r}")
            raise PreforkError(why, msg.get("module"))
        self.ready_seconds, self.ready_cpu = float(msg["seconds"]), float(msg["cpu"])
        self.modules, self.skipped = list(msg.get("modules", [])), list(msg.get("skipped", []))
        threading.Thread(target=self._read_replies, args=(self.proc,), name="prefork-replies", daemon=True).start()
        return self

    def _read_line(self, timeout: float) -> str:
        assert self.proc is not None and self.proc.stdout is not None
        fd = self.proc.stdout.fileno()
        ready, _, _ = select.select([fd], [], [], timeout)
        if not ready:
            return ""
        return self.proc.stdout.readline().decode(errors="replace").strip()

    def _read_replies(self, proc: subprocess.Popen) -> None:
        assert proc.stdout is not None
        for raw in proc.stdout:
            try:
                msg = json.loads(raw)
            except ValueError:
                continue
            with self._lock:
                if "started" in msg:
                    self._started[int(msg["started"])] = int(msg["pid"])
                elif "exited" in msg:
                    self._exited[int(msg["exited"])] = (int(msg["code"]), float(msg["cpu"]))
                self._lock.notify_all()
        with self._lock:
            self._ended = f"the prefork process ended (exit {proc.wait()})"
            self._lock.notify_all()

    def spawn(self, argv: Sequence[str], env: dict[str, str], log: str | os.PathLike,
              timeout: float = 60.0) -> _Child:
        if self.proc is None or self.proc.stdin is None:
            raise PreforkError("the prefork process was not started")
        with self._lock:
            if self._ended:
                raise PreforkError(self._ended)
            self._next += 1
            ident = self._next
        args = list(argv)
        if "-m" not in args[:-1]:
            raise PreforkError(f"a prefork child runs a module (python -m MODULE ...), not {args[:3]}")
        i = args.index("-m")
        req = {"id": ident, "module": args[i + 1], "args": args[i + 2:], "env": dict(env), "log": os.fspath(log),
               "cwd": os.getcwd()}
        try:
            self.proc.stdin.write((json.dumps(req) + "\n").encode())
            self.proc.stdin.flush()
        except OSError as err:
            raise PreforkError(f"the prefork process took no request: {err}") from None
        deadline = time.monotonic() + timeout
        with self._lock:
            while ident not in self._started:
                if self._ended:
                    raise PreforkError(self._ended)
                left = deadline - time.monotonic()
                if left <= 0:
                    raise PreforkError(f"the prefork process forked nothing within {timeout:g} s")
                self._lock.wait(left)
            return _Child(self, self._started.pop(ident))

    def exit_of(self, child: _Child) -> int | None:
        if child.returncode is not None:
            return child.returncode
        with self._lock:
            got = self._exited.pop(child.pid, None)
            if got is None and self._ended:  # the prefork died: its children were killed with it
                got = (-signal.SIGKILL, 0.0)
        if got is None:
            return None
        child.returncode = got[0]
        child.dflash_rusage = types.SimpleNamespace(ru_utime=got[1], ru_stime=0.0)  # type: ignore[attr-defined]
        return child.returncode

    def kill(self) -> None:
        """Stop it at once, its imports unfinished or not (one launched early that no run adopted)."""
        proc, self.proc = self.proc, None
        if proc is not None:
            pool.stop_group(proc)
            proc.wait()
            for f in (proc.stdin, proc.stdout):
                try:
                    f.close() if f else None
                except OSError:
                    pass

    def close(self) -> None:
        """End the prefork: its stdin closed, then stopped if it does not leave within 5 s."""
        proc, self.proc = self.proc, None
        if proc is None:
            return
        try:
            if proc.stdin is not None:
                proc.stdin.close()
        except OSError:
            pass
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            pool.stop_group(proc)
            proc.wait()


# ---- launched early -------------------------------------------------------------------------------------
# `dflash-parity check --jobs N` launches the prefork first thing (`start_early`, from the front end's start-up,
# before the command line is parsed: parsing imports torch), so its imports overlap the parent's own instead of
# following them; `Prefork.start` adopts it when the children's environment and modules are the ones it was
# launched with.
_EARLY: list[Prefork] = []
# what may differ between the environment launched with and the children's: set per child (the MPS daemon's
# pipe, started later), or set by importing this project, which the prefork does itself (TRITON_INTERPRET,
# `lowerings.interpret_where_no_gpu`, where there is no GPU)
_SET_LATER = ("CUDA_MPS_", "TRITON_INTERPRET")


def _comparable(env: dict[str, str]) -> dict[str, str]:
    return {k: v for k, v in env.items() if not k.startswith(_SET_LATER)}


def start_early(env: dict[str, str], preload: Sequence[str] = PRELOAD) -> Prefork | None:
    """Launch the prefork now, for a later `Prefork.start` with the same environment and modules to adopt (None
    where it cannot be launched: the run then launches its own, or starts fresh interpreters, and says why)."""
    discard_early()
    try:
        _EARLY.append(Prefork(preload).launch(env))
    except OSError:
        return None
    return _EARLY[0]


def adopt_early(env: dict[str, str], preload: Sequence[str] | None = None) -> Prefork | None:
    """The prefork `start_early` launched, if its environment is `env`'s and (given `preload`) its modules those
    (else it is discarded)."""
    if not _EARLY:
        return None
    early = _EARLY.pop()
    if _comparable(early.env) != _comparable(env) or (preload is not None and early.preload != tuple(preload)):
        early.kill()
        return None
    return early


def discard_early() -> None:
    """Stop a prefork launched early that no run adopted (a usage error, one lowering, `--jobs 1` after all)."""
    while _EARLY:
        _EARLY.pop().kill()


if __name__ == "__main__":  # pragma: no cover
    from parity.exec.prefork_server import serve as _serve  # the module proper

    _code = _serve()
    sys.stderr.flush()
    os._exit(_code)  # no interpreter teardown: its leak reports (nanobind's) are noise here
