"""Start `check --jobs` children by forking one process that has imported everything once (`--jobs-start prefork`).

Each `--jobs` child used to be a fresh interpreter. Before its first case it imported torch, triton, hypothesis,
flashinfer and this project (3.3-4.5 s of CPU on the H200's host, session 18's run 62), and its profiler's first
start imported 893 more modules (`torch._dynamo`, ...: 5.8 s, run 65), paid by each of run 11's 15 children
while every core was busy. Here one process (`python -m parity.exec.prefork`, the "prefork") imports them once,
checks that the imports left CUDA untouched, and forks each child on request; a child then runs
`parity.front.session.part_main` as `python -m parity.front.session --part SPEC` would, with its own environment
(`CUDA_VISIBLE_DEVICES`, the MPS pipe), its own session and process group, its stdout in its log, and
initializes CUDA itself.

Forking is only safe while CUDA is untouched: the CUDA driver cannot be used in a child forked after `cuInit`.
The prefork asks the driver (`cuDeviceGetCount` answers CUDA_ERROR_NOT_INITIALIZED until something calls
`cuInit`) after each module it imports; a module that initialized CUDA ends the prefork with a reply that
names it, and the run starts its children as fresh interpreters instead, saying why. A module of `OPTIONAL` that
is not installed is skipped (none now: flashinfer, the one it held, initializes CUDA at import on the H200).

Protocol (one JSON object per line): the prefork writes `{"ready": ..., "seconds", "cpu", "modules",
"skipped"}` (or `{"refused": why}`) on its stdout; the parent writes `{"id", "argv", "env", "log", "cwd"}`
requests on its stdin and reads `{"started": id, "pid"}`, then `{"exited": pid, "code", "cpu"}` when the
child is reaped (its CPU seconds, user + system, its reaped descendants included). The prefork leaves when
its stdin closes or its parent dies (`parity.exec.pool.child_kwargs`); its children die with it
(`PR_SET_PDEATHSIG`), so none outlives the run.

A module that initialized CUDA is named in the refusal (`PreforkError.module`); `parity.exec.jobs` then starts one
more prefork without it (each child imports it itself), and only if that one is refused too starts fresh
interpreters.

Public: `Prefork` (the parent's handle: `launch`, `start`, `spawn`, `close`, `kill`), `PreforkError`, `PRELOAD`,
`OPTIONAL`, `start_early`, `adopt_early`, `discard_early`,
`cuda_initialized`, `preload`, `serve`.
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
from typing import Any, Callable, Sequence

# what every child imports before its first case; OPTIONAL ones are skipped where not installed
# (`torch._dynamo` and `triton_kernel_wrap`: the 893 modules the profiler's first start imports, 4-6 s of CPU on
# the H200's host, where torch's bytecode is not cached: run 65. `torch._inductor.compile_fx` initializes CUDA
# at import there, run 65: not preloaded.)
PRELOAD = ("numpy", "torch", "torch.profiler", "torch._dynamo", "torch._higher_order_ops.triton_kernel_wrap", "triton",
           "hypothesis", "oracle", "strategies", "lowerings", "lowerings.builtins", "parity.front.session", "parity.engine.sweep",
           "parity.engine.runner", "parity.engine.case_run", "parity.exec.isolation", "parity.front.cli")
OPTIONAL: tuple[str, ...] = ()  # flashinfer initializes CUDA at import on the H200 (run 66): each child imports it
READY_TIMEOUT = 300.0  # the imports, on a loaded machine
_CUDA_ERROR_NOT_INITIALIZED = 3


class PreforkError(RuntimeError):
    """The prefork could not start, refused to fork (CUDA was initialized by an import: `module` names it) or
    died."""

    def __init__(self, why: str, module: str | None = None):
        super().__init__(why)
        self.module = module


def cuda_initialized() -> bool | None:
    """Whether this process has initialized the CUDA driver (`cuInit`), asked without initializing it: True,
    False, or None where there is no driver (`libcuda` cannot be loaded: nothing to protect)."""
    import ctypes

    try:
        libcuda = ctypes.CDLL("libcuda.so.1")
    except OSError:
        return None
    count = ctypes.c_int(0)
    return int(libcuda.cuDeviceGetCount(ctypes.byref(count))) != _CUDA_ERROR_NOT_INITIALIZED


# ---- the prefork process ------------------------------------------------------------------------------
_REPLIES = 1  # the fd of the prefork's replies (`serve` moves them off fd 1, which then goes to stderr)


def _send(obj: dict[str, Any]) -> None:
    data = (json.dumps(obj) + "\n").encode()
    while data:
        data = data[os.write(_REPLIES, data):]


def _cpu() -> float:
    t = os.times()
    return t.user + t.system


def preload(modules: Sequence[str], optional: Sequence[str],
            initialized: Callable[[], bool | None] = cuda_initialized) -> tuple[list[str], list[str], str | None]:
    """Import `modules` then `optional` (skipped when not installed); (imported, skipped, refusal): the refusal
    names the first import after which CUDA was initialized (that module is the last of `imported`)."""
    import importlib

    done, skipped = [], []
    for name in [*modules, *optional]:
        try:
            importlib.import_module(name)
        except ImportError as err:
            if name not in optional:
                return done, skipped, f"importing {name} failed: {type(err).__name__}: {err}"
            skipped.append(name)
            continue
        done.append(name)
        if initialized():
            return done, skipped, (f"importing {name} initialized CUDA, and a process forked after that cannot use "
                                   f"the GPU")
    return done, skipped, None


def _child(req: dict[str, Any], server: int) -> None:
    """In the forked child: become what `python -m parity.front.session --part SPEC` would be, run it, exit."""
    code = 1
    try:
        os.close(_REPLIES)
        os.setsid()  # its own session and process group, as `parity.exec.pool.child_kwargs` gives a spawned child
        from parity.exec.pool import die_with_parent

        die_with_parent(server)
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.close(null)
        log = os.open(req["log"], os.O_WRONLY | os.O_APPEND | os.O_NOFOLLOW)
        os.dup2(log, 1)
        os.close(log)
        os.chdir(req["cwd"])
        os.environ.clear()
        os.environ.update(req["env"])
        for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGCHLD, signal.SIGPIPE):
            signal.signal(sig, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        from parity.front import session
        from parity.front.session import part_main

        sys.argv = [session.__file__, *req["argv"][1:]]
        code = part_main(req["argv"][1:])
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    except BaseException:  # noqa: BLE001  (anything: the log says what, the exit code says failed)
        import traceback

        traceback.print_exc()
        code = 1
    finally:
        from parity.exec.leftovers import stop_stray_children

        stop_stray_children()  # what plugin code started here (`--no-isolate`, an import) ends with the child
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except Exception:  # noqa: BLE001
                pass
        os._exit(code if isinstance(code, int) and 0 <= code < 256 else 1)


def _reap() -> None:
    while True:
        try:
            pid, status, usage = os.wait4(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        _send({"exited": pid, "code": os.waitstatus_to_exitcode(status), "cpu": usage.ru_utime + usage.ru_stime})


def serve() -> int:
    """`python -m parity.exec.prefork`: import, say ready (or refused), then fork a child per request line."""
    import gc

    global _REPLIES
    _REPLIES = os.dup(1)
    os.dup2(2, 1)  # what an import prints goes to stderr, never into the replies
    t0, c0 = time.perf_counter(), _cpu()
    from lowerings import interpret_where_no_gpu

    interpret_where_no_gpu()  # before torch._dynamo imports triton.language (no CUDA touched)
    exclude = set(sys.argv[sys.argv.index("--exclude") + 1].split(",")) if "--exclude" in sys.argv else set()
    done, skipped, refusal = preload([m for m in PRELOAD if m not in exclude], [m for m in OPTIONAL if m not in exclude])
    sys.stdout.flush()
    if refusal:
        _send({"refused": refusal, "module": done[-1] if "initialized CUDA" in refusal else None})
        return 0
    gc.collect()
    gc.freeze()  # the imports' objects stay out of the children's collections: fewer copied pages
    _send({"ready": True, "seconds": round(time.perf_counter() - t0, 3), "cpu": round(_cpu() - c0, 3),
           "modules": done, "skipped": skipped})
    server, buf = os.getpid(), b""
    while True:
        readable, _, _ = select.select([0], [], [], 0.05)
        if readable:
            chunk = os.read(0, 1 << 16)
            if not chunk:
                break  # the parent closed its end (or ended)
            buf += chunk
            while b"\n" in buf:
                line, buf = buf.split(b"\n", 1)
                req = json.loads(line)
                pid = os.fork()
                if pid == 0:
                    _child(req, server)
                _send({"started": req["id"], "pid": pid})
        _reap()
    while True:  # the parent is done: wait for any child still running (it was stopped), then leave
        try:
            os.wait4(-1, 0)
        except ChildProcessError:
            return 0


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

    `start(env)` starts it with the environment every child shares (`parity.exec.jobs.child_env`: the thread caps
    are read by the libraries it imports) and waits until it has imported (`ready_seconds`, `ready_cpu`) or
    raises `PreforkError` saying why it cannot serve. `spawn(argv, env, log)` forks a child running `argv`
    (`[python, "-m", "parity.front.session", "--part", SPEC]`; only what follows `-m parity.front.session` is used) with
    `env`, its stdout appended to `log` (which must exist). `close()` ends the prefork. `exclude`: modules of
    `PRELOAD` and `OPTIONAL` not to import (one that initialized CUDA in an earlier try)."""

    def __init__(self) -> None:
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
        from parity.exec import pool

        argv = [sys.executable, "-m", "parity.exec.prefork", *(["--exclude", ",".join(exclude)] if exclude else [])]
        self.env, self.launched = dict(env), time.perf_counter()
        self.proc = subprocess.Popen(argv, stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, env=env, **pool.child_kwargs())
        return self

    def start(self, env: dict[str, str], timeout: float = READY_TIMEOUT, exclude: Sequence[str] = ()) -> "Prefork":
        early = None if exclude else adopt_early(env)
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
        i = args.index("parity.front.session") if "parity.front.session" in args else 0
        req = {"id": ident, "argv": [args[0], *args[i + 1:]], "env": dict(env), "log": os.fspath(log),
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
            from parity.exec import pool

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
            from parity.exec import pool

            pool.stop_group(proc)
            proc.wait()


# ---- launched early -------------------------------------------------------------------------------------
# `dflash-parity check --jobs N` launches the prefork first thing (`start_early`, from `parity.front.cli.main`, before
# the command line is parsed: parsing imports torch), so its imports overlap the parent's own instead of
# following them; `Prefork.start` adopts it when the children's environment is the one it was launched with.
_EARLY: list[Prefork] = []
# what may differ between the environment launched with and the children's: set per child (the MPS daemon's
# pipe, started later), or set by importing this project, which the prefork does itself (TRITON_INTERPRET,
# `lowerings.interpret_where_no_gpu`, where there is no GPU)
_SET_LATER = ("CUDA_MPS_", "TRITON_INTERPRET")


def _comparable(env: dict[str, str]) -> dict[str, str]:
    return {k: v for k, v in env.items() if not k.startswith(_SET_LATER)}


def start_early(env: dict[str, str]) -> Prefork | None:
    """Launch the prefork now, for a later `Prefork.start` with the same environment to adopt (None where it
    cannot be launched: the run then launches its own, or starts fresh interpreters, and says why)."""
    discard_early()
    try:
        _EARLY.append(Prefork().launch(env))
    except OSError:
        return None
    return _EARLY[0]


def adopt_early(env: dict[str, str]) -> Prefork | None:
    """The prefork `start_early` launched, if its environment is `env`'s (else it is discarded)."""
    if not _EARLY:
        return None
    early = _EARLY.pop()
    if _comparable(early.env) != _comparable(env):
        early.kill()
        return None
    return early


def discard_early() -> None:
    """Stop a prefork launched early that no run adopted (a usage error, one lowering, `--jobs 1` after all)."""
    while _EARLY:
        _EARLY.pop().kill()


if __name__ == "__main__":  # pragma: no cover
    from parity.exec.prefork import serve as _serve  # the module proper, not this __main__ copy

    _code = _serve()
    sys.stderr.flush()
    os._exit(_code)  # no interpreter teardown: its leak reports (nanobind's) are noise here
