"""Crash isolation: run each case in a persistent worker process that may die without ending the run.

A lowering under test can kill its process (a segfault in a kernel, an abort, `os._exit`, a hang). In
process, that ends the whole `check`: no report, no shrunk case. `IsolatedExecutor.run(lowering, case)`
instead sends the case to a worker process, which imports the framework, loads the same plugin files,
runs `parity.engine.runner.run_case` and answers with the outcome as JSON (`CaseOutcome.to_json`). When the
worker dies (a signal, a nonzero exit) or gives no answer within `case_timeout` seconds, the case is a
failure of the lowering ("crashed: worker killed by SIGSEGV (signal 11) while running this case",
"hung: no result after 5 s; worker killed"), the worker is replaced and the run goes on. The failing
outcome is raised inside hypothesis's test function like any other, so a crashing case is shrunk too
(each replay in a fresh worker where the last one died).

Before each case is sent, it is written to `<inflight_dir>/<lowering>.json` (`parity.exec.inflight`); the file is
removed when the worker answers and kept when the worker died on it (`dflash-parity check` replays it first next
time).

The worker also answers a lowering's hooks (`IsolatedExecutor.hook`: `available(device)` for every lowering,
and, for a plugin's lowering, every hook `check` would otherwise call in its own process, `parity.exec.hooks.answered_by`):
the worker calls the hook unbounded and this process waits the hook timeout for the answer, then kills the worker,
so that a hook spinning in C code is stopped too. The hooks it calls inside `run_case` (`expected_calls`, ...) it
bounds itself by the hook timeout (`parity.exec.hooks`; a loop in C code there runs to the case timeout). A hook that
raises, exits or loops comes back as `HookFailure` (that lowering's failure, named), a crash or a hang of the whole
worker while answering one too. (`parity.exec.plugin_probe` imports the plugin files in a throwaway worker first.)

Each worker leads a process group of its own (`parity.exec.leftovers.own_group`): whatever a lowering starts there (a
`run()` that forks, a `sleep`) is killed with the worker when it is stopped or replaced, and does not outlive the
check holding its output open.

The worker's side is `parity.exec.worker`; how it is started (a fork server that imported the framework once),
`parity.exec.worker_process`.

Public: `IsolatedExecutor`, `DEFAULT_CASE_TIMEOUT`; `WorkerError`, `STARTUP_TIMEOUT`, `describe_exit` and
`start_fork_server` are `parity.exec.worker_process`'s (re-exported).
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any, Sequence

from oracle.case import Case
from parity.exec import hooks
from parity.exec.hooks import HookFailure
from parity.exec.inflight import remove_inflight, write_inflight
from parity.exec.leftovers import stop_group
from parity.exec.worker import worker_main
from parity.exec.worker_process import (  # noqa: F401  (public here too)
    STARTUP_TIMEOUT, WorkerError, describe_exit, start_fork_server, start_process, worker_context)
from parity.engine.answers import availability
from parity.engine.invocation import RunOptions
from parity.engine.outcome import CaseOutcome
from parity.engine.yardstick import DEFAULT as DEFAULT_YARDSTICK

DEFAULT_CASE_TIMEOUT = 120.0


class IsolatedExecutor:
    """Runs cases in a persistent worker process (see the module docstring).

    - `plugins`: plugin files the worker loads (the same `--plugin` files as the parent);
    - `tolerances`: the tolerance file (None: the packaged one);
    - `opts`: the `RunOptions` of every case; `yardstick`: the yardstick's name (`parity.engine.yardstick.get`; None: none);
    - `case_timeout`: seconds a case may take, from sending it to the answer, before the worker is killed;
    - `inflight_dir`: where the case in flight is written (None: nowhere);
    - `num_threads`: torch's intra-op threads in the worker (default: the parent's);
    - `hook_timeout`: seconds a lowering's hook (`available`, `supports`, `expected_calls`) or a plugin's
      import may take in the worker (default: `parity.exec.hooks.timeout()`).
    """

    def __init__(self, *, plugins: list[str] = (), tolerances: str | None = None, opts: RunOptions = RunOptions(),
                 yardstick: str | None = DEFAULT_YARDSTICK, case_timeout: float = DEFAULT_CASE_TIMEOUT,
                 inflight_dir: str | Path | None = None, num_threads: int | None = None,
                 startup_timeout: float = STARTUP_TIMEOUT, hook_timeout: float | None = None):
        import torch

        if not case_timeout > 0:
            raise ValueError(f"--case-timeout: a positive number of seconds, got {case_timeout!r}")
        self.plugins = [str(Path(p).resolve()) for p in plugins]
        self.tolerances = str(Path(tolerances).resolve()) if tolerances else None
        self.opts = opts
        self.yardstick = yardstick
        self.case_timeout = float(case_timeout)
        self.startup_timeout = float(startup_timeout)
        self.hook_timeout = float(hook_timeout) if hook_timeout is not None else hooks.timeout()
        self.inflight_dir = Path(inflight_dir) if inflight_dir is not None else None
        self.num_threads = num_threads or torch.get_num_threads()
        cuda_device = None
        if opts.device == "cuda" and torch.cuda.is_available():
            cuda_device = torch.cuda.current_device()
        self.cuda_device = cuda_device
        self._ctx = worker_context()
        self._proc = None
        self._conn = None
        self.workers_started = 0
        self.crashes = 0  # cases that crashed or hung their worker
        self._cpu_done = 0.0  # CPU seconds of the workers that are gone
        self._cpu_now = 0.0  # the current worker's, as of its last answer

    # ---- the worker's life ----------------------------------------------------------------------------
    def _init_message(self) -> dict[str, Any]:
        return {"plugins": self.plugins, "tolerances": self.tolerances, "opts": self.opts.to_dict(),
                "yardstick": self.yardstick, "num_threads": self.num_threads, "cuda_device": self.cuda_device,
                "sys_path": [p for p in sys.path if p], "hook_timeout": self.hook_timeout}

    def _start(self) -> None:
        proc, parent_conn = start_process(self._ctx, worker_main, self._init_message(), "dflash-parity-worker")
        self._proc, self._conn = proc, parent_conn
        self.workers_started += 1
        if not parent_conn.poll(self.startup_timeout):
            self._kill()
            raise WorkerError(f"the isolated worker did not start within {self.startup_timeout:.0f} s")
        try:
            msg = parent_conn.recv()
        except (EOFError, OSError):
            code = self._reap()
            raise WorkerError(f"the isolated worker died while starting: {describe_exit(code)}") from None
        if "error" in msg:
            self._kill()
            raise WorkerError(msg["error"])

    def _alive(self) -> bool:
        return self._proc is not None and self._proc.is_alive()

    def _reap(self, wait: float = 5.0) -> int | None:
        """Wait for a dying worker; kill it if it lingers. Returns its exit code."""
        proc = self._proc
        if proc is None:
            return None
        proc.join(wait)
        if proc.exitcode is None:
            proc.kill()
            proc.join(wait)
            code = None
        else:
            code = proc.exitcode
        stop_group(proc.pid)  # its process group (`parity.exec.leftovers.own_group`): what its lowering left running
        self._drop()
        return code

    def _kill(self) -> None:
        """Kill the worker with everything in its process group, and reap it."""
        if self._proc is not None and self._proc.is_alive():
            stop_group(self._proc.pid)
            self._proc.kill()
        self._reap()

    @property
    def worker_cpu_seconds(self) -> float:
        """CPU seconds the workers spent (as of their last answers; a worker's time on the case that killed
        it is not counted). `time dflash-parity check` does not see it: workers are not its children."""
        return self._cpu_done + self._cpu_now

    def _drop(self) -> None:
        self._cpu_done += self._cpu_now
        self._cpu_now = 0.0
        if self._conn is not None:
            try:
                self._conn.close()
            except OSError:
                pass
        if self._proc is not None:
            try:
                self._proc.close()
            except ValueError:  # still running: it was killed above, close() is best effort
                pass
        self._proc, self._conn = None, None

    def close(self) -> None:
        """Stop the worker (politely, then by force), and whatever its lowerings left in its process group."""
        if self._conn is not None and self._alive():
            try:
                self._conn.send(None)
            except OSError:
                pass
            self._proc.join(5)
        if self._proc is not None:
            self._kill()

    def __enter__(self) -> "IsolatedExecutor":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # ---- the in-flight file ---------------------------------------------------------------------------
    def _write_inflight(self, lowering: str, case: Case) -> Path | None:
        return None if self.inflight_dir is None else write_inflight(self.inflight_dir, lowering, case)

    _remove = staticmethod(remove_inflight)

    def _ensure_started(self, lowering_name: str) -> None:
        """A live worker; one that cannot start fails the lowering at hand (HookFailure), not the run."""
        if self._alive():
            return
        if self._proc is not None:  # died between cases (a thread the lowering left behind?)
            self._reap()
        try:
            self._start()
        except WorkerError as err:
            raise HookFailure(lowering_name, "worker", f"the isolated worker could not start: {err}") from None

    # ---- a lowering's hooks ------------------------------------------------------------------------------
    def hook(self, lowering: Any, hook: str, args: tuple, limit: float, case: Any = None) -> Any:
        """`lowering.<hook>(*args)` asked in the worker (a `parity.exec.hooks.Answer`: `check`, isolated, asks a
        plugin's hooks here). The worker calls it unbounded; this process waits `limit` seconds for the answer,
        then kills the worker and its process group: a hook spinning in C code, which no signal handler of its
        own process can stop, is stopped all the same, and that is `HookFailure` (the lowering's failure), as
        are an exception in the hook, an exit, or a crash of the worker. A KeyboardInterrupt (SIGINT, SIGTERM)
        while waiting kills the worker and goes on."""
        name = lowering if isinstance(lowering, str) else lowering.name
        self._ensure_started(name)
        try:
            self._conn.send({"hook": hook, "lowering": name, "args": list(args)})
            answered = self._conn.poll(limit)
            msg = self._conn.recv() if answered else None
        except KeyboardInterrupt:
            self._kill()
            raise
        except (EOFError, OSError):
            raise HookFailure(name, hook, f"{hook}() crashed the isolated worker: {describe_exit(self._reap())}",
                              case) from None
        if msg is None:
            self._kill()
            raise HookFailure(name, hook, f"{hook}() did not answer within {limit:g} s (stopped: its isolated worker "
                                          f"was killed; an endless loop, in Python or in C code? --hook-timeout sets "
                                          f"the bound)", case)
        self._cpu_now = float(msg.get("cpu_s", self._cpu_now))
        if "hook_failure" in msg:
            raise HookFailure(name, hook, HookFailure.from_json(msg["hook_failure"]).message, case)
        if "error" in msg:
            raise HookFailure(name, hook, f"{hook}() could not be asked in the isolated worker: {msg['error']}", case)
        return msg["value"]

    def available(self, lowering_name: str, device: str) -> tuple[bool, str]:
        """The lowering's `available(device)`, asked in the worker (`hook`), as `(ok, why)`."""
        return availability(lowering_name, self.hook(lowering_name, "available", (device,), self.hook_timeout))

    # ---- one case ---------------------------------------------------------------------------------------
    def run(self, lowering_name: str, case: Case) -> CaseOutcome:
        """Run `case` through the lowering named `lowering_name` in the worker; see the module docstring."""
        msg, crash, seconds = self._exchange(lowering_name, case, {})
        if crash:
            return self._crash(lowering_name, case, crash, seconds)
        return CaseOutcome.from_json(msg["outcome"])

    def probe(self, lowering_name: str, case: Case, runs: int, history: Sequence[Case] = ()):
        """`parity.engine.flakiness.probe` in the worker (identical runs compared bit for bit, there where the
        tensors are); a worker that dies or hangs on it gives a probe with that error."""
        from parity.engine.flakiness import Probe

        extra = {"probe": {"runs": runs, "history": [h.to_json_dict() for h in history]}}
        msg, crash, _ = self._exchange(lowering_name, case, extra)
        if crash:
            return Probe(runs, errors=(crash,))
        return Probe.from_json(msg["probe"])

    def leave_state(self, lowering_name: str, case: Case) -> None:
        """`parity.engine.flakiness.leave_state` in the worker: one call, its result dropped (a history replay)."""
        self._exchange(lowering_name, case, {"leave_state": True})

    def _exchange(self, lowering_name: str, case: Case, extra: dict[str, Any]
                  ) -> tuple[dict[str, Any] | None, str | None, float]:
        """Send one request, wait for the answer: `(answer, None, seconds)`, or `(None, crash message, seconds)`
        when the worker died or hung on it."""
        self._ensure_started(lowering_name)
        path = self._write_inflight(lowering_name, case)
        t0 = time.perf_counter()
        try:
            self._conn.send({"lowering": lowering_name, "case": case.to_json_dict(), **extra})
            answered = self._conn.poll(self.case_timeout)
        except KeyboardInterrupt:
            self._remove(path)  # interrupted, not crashed: no case to replay
            self._kill()
            raise
        except OSError:  # the pipe broke: the worker is gone
            answered = True
        if not answered:
            self._kill()
            self.crashes += 1
            return None, f"hung: no result after {self.case_timeout:g} s; worker killed", time.perf_counter() - t0
        try:
            msg = self._conn.recv()
        except (EOFError, OSError):
            code = self._reap()
            self.crashes += 1
            return None, f"crashed: worker {describe_exit(code)} while running this case", time.perf_counter() - t0
        self._remove(path)
        self._cpu_now = float(msg.get("cpu_s", self._cpu_now))
        lost = msg.get("context_lost")
        if lost:  # a fault of this case, whatever it answered; the worker exits, the next case gets a new one
            self._reap()
            self.crashes += 1
            return None, f"crashed: the device faulted while running this case ({lost}); worker replaced", \
                time.perf_counter() - t0
        if "hook_failure" in msg:
            raise HookFailure.from_json(msg["hook_failure"])
        if "error" in msg:
            raise WorkerError(f"{lowering_name} on {case.short()}: {msg['error']}\n{msg.get('traceback', '')}")
        return msg, None, time.perf_counter() - t0

    @staticmethod
    def _crash(lowering: str, case: Case, message: str, seconds: float) -> CaseOutcome:
        return CaseOutcome(lowering, case, "fail", failures=[message], seconds=seconds)
