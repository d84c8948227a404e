"""Child processes run side by side: the process side of `dflash-parity check --jobs N`.

The cost of a sweep on a GPU is mostly per-case host work (drawing a case, building its tensors, planning,
launching a handful of small kernels, reading the verdict back), not GPU time, so the lowerings of one run are
checked side by side in child processes. The front end says what each child is (`Job`: its label, its command line
`python -m MODULE ARGS...`, its log, the file where it leaves the CPU seconds of processes outside its tree) and
merges what they wrote; here they are run: up to `processes` at once (`parity.exec.pool`: the one process pool of
jobs and warm-up), each on the least busy of the visible GPUs when there are several (`parity.exec.gpus.GpuSlots`:
`CUDA_VISIBLE_DEVICES`), forked from one prefork that imported everything once (`parity.exec.prefork`, when
`preload` is given) or started as fresh interpreters.

Children never outlive this process. On KeyboardInterrupt (SIGINT, SIGTERM or SIGHUP: `parity.exec.interrupt`) each
running child gets SIGTERM and up to a grace period to write what it has; jobs not yet started are never started.

Each child's CPU seconds (its isolated workers' included: `Job.workers_cpu`) end its "done" line, and their sum ends
the run (`cpu_line`): where every child is bound by its CPU, their sum over the cores is the wall's floor.

Public: `Job`, `run_jobs(jobs, ...) -> (exits, interrupted)`, `cpu_line`, `child_env` (`parity.exec.pool`'s).
"""

from __future__ import annotations

import os
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

from parity.exec import pool
from parity.exec.pool import child_env  # noqa: F401  (public here too: the children's environment)
from parity.exec.prefork import Prefork, PreforkError


@dataclass(frozen=True)
class Job:
    """One child process: `label` names it in the lines said and keys its exit code; `argv` is its command line
    (`[python, "-m", MODULE, *ARGS]`); `log` gets its stdout (created here; a link there is removed, never written
    through); `workers_cpu` (or None) is where it writes the CPU seconds of the processes it ran outside its own
    tree (a fork server's children), counted with its own."""

    label: str
    argv: tuple[str, ...]
    log: Path
    workers_cpu: Path | None = None


def _read_seconds(path: Path | None) -> float:
    if path is None:
        return 0.0
    try:
        return max(0.0, float(path.read_text().strip()))
    except (OSError, ValueError):
        return 0.0


def cpu_line(cpu_seconds: Sequence[float], wall: float, cores: int, prefork: float | None = None) -> str:
    """What the children's CPU seconds say about the run: their sum (with `prefork`, the CPU seconds of the
    process they were forked from: `parity.exec.prefork`), the share of the cores they kept busy over `wall`, and
    the wall a perfect balance over `cores` would need (their sum over the cores). When that floor is near the
    wall, the host's CPU, not the GPU, sets the pace: less host work per case, not more overlap, makes the run
    faster ('' without figures)."""
    if not cpu_seconds or wall <= 0:
        return ""
    total = sum(cpu_seconds) + (prefork or 0.0)
    who = f"{len(cpu_seconds)} process(es)" + ("" if prefork is None else " and their prefork")
    return (f"{who} used {total:.1f} s of CPU in {wall:.1f} s: {100 * total / (wall * cores):.0f}% "
            f"of {cores} cores; {total / cores:.1f} s at best on these cores")


class _Forks:
    """The prefork the children are forked from (`parity.exec.prefork`, importing `preload`), or None where none
    was asked for (`preload` None), it could not start or it failed (the children then start as fresh interpreters;
    `say` tells why, once). `cpu`: the prefork's own CPU seconds (its imports; None without one), counted with the
    children's."""

    def __init__(self, preload: Sequence[str] | None, env: dict[str, str], say: Callable[[str], None]) -> None:
        self.prefork, self.cpu, self.say, self._held = None, None, say, []
        if preload is None:
            return
        excluded: list[str] = []
        while self.prefork is None:
            try:
                self.prefork = Prefork(preload).start(env, exclude=excluded)
            except PreforkError as err:
                if err.module is None or excluded:
                    self.give_up(f"the prefork process cannot fork them: {err}")
                    return
                say(f"[jobs] the prefork process starts again without {err.module}: {err}")
                excluded.append(err.module)
        self._held.append(self.prefork)
        self.cpu = self.prefork.ready_cpu
        skipped = f"; not installed: {', '.join(self.prefork.skipped)}" if self.prefork.skipped else ""
        p = self.prefork
        waited = (f"; launched when the command started, so the run waited {p.waited:.1f} s for it" if p.early
                  else "")
        say(f"[jobs] children forked from one process that imported {len(p.modules)} modules once "
            f"({p.ready_seconds:.1f} s, {p.ready_cpu:.1f} s of CPU{skipped}{waited})")

    def give_up(self, why: str) -> None:
        """Start the next children as fresh interpreters; the ones it forked run on (it is closed at the end)."""
        self.say(f"[jobs] children start as fresh interpreters (--jobs-start spawn): {why}")
        self.prefork = None

    def close(self) -> None:
        self.prefork = None
        while self._held:
            self._held.pop().close()


class _Running:
    """The children of one `run_jobs`: started (`start`) and ended (`done`) by `parity.exec.pool.run_pool`."""

    def __init__(self, env: dict[str, str], gpus: Any, forks: _Forks, say: Callable[[str], None]) -> None:
        self.env, self.gpus, self.forks, self.say = env, gpus, forks, say
        self.exits: dict[str, int | None] = {}
        self.held: dict[Job, tuple[Any, int | None]] = {}  # job -> (its log file, its GPU)
        self.procs: dict[Job, Any] = {}
        self.cpu_used: list[float] = []  # the CPU seconds of each ended child that has them

    def start(self, job: Job):
        job.log.unlink(missing_ok=True)  # a planted link is removed, never written through
        if job.workers_cpu is not None:
            job.workers_cpu.unlink(missing_ok=True)  # an earlier run's
        log = open(job.log, "w")
        gpu = self.gpus.take()
        self.held[job] = (log, gpu)
        child = {**self.env, **self.gpus.env(gpu)}
        if self.forks.prefork is not None:
            try:
                self.procs[job] = self.forks.prefork.spawn(job.argv, child, job.log)
            except PreforkError as err:
                self.forks.give_up(f"the prefork process failed: {err}")
        if job not in self.procs:
            self.procs[job] = subprocess.Popen(list(job.argv), stdout=log, stderr=None, env=child,
                                               **pool.child_kwargs())
        on = f" on GPU {gpu}" if gpu is not None else ""
        running = sum(self.gpus.busy) if self.gpus.count > 1 else len(self.held)
        self.say(f"[jobs] {job.label}: started{on} ({running} running)")
        return self.procs[job]

    def done(self, job: Job, code: int, seconds: float) -> None:
        self.exits[job.label] = code  # first: whatever interrupts the rest, the report says how the child ended
        log, gpu = self.held.pop(job)
        log.close()
        self.gpus.give_back(gpu)
        cpu = pool.cpu_seconds(self.procs.pop(job))
        workers = _read_seconds(job.workers_cpu)
        used = ""
        if cpu is not None:
            cpu += workers
            self.cpu_used.append(cpu)
            used = f", {cpu:.1f} s of CPU" + (f" ({workers:.1f} s in isolated workers)" if workers else "")
        self.say(f"[jobs] {job.label}: done in {seconds:.1f} s{used} (exit {code}; {len(self.held)} running)")


def run_jobs(jobs: Sequence[Job], *, processes: int, env: dict[str, str], gpus: Any,
             preload: Sequence[str] | None, say: Callable[[str], None], poll: float = 0.2,
             grace: float = 60.0) -> tuple[dict[str, int | None], bool]:
    """Run `jobs` in order, up to `processes` at once, with `env` (`child_env`) and a GPU each from `gpus`
    (`parity.exec.gpus.GpuSlots`), forked from a prefork importing `preload` (None: fresh interpreters); `say`
    gets each start, end and the CPU line. Returns ({label: exit code} of the jobs that ran, interrupted).

    On KeyboardInterrupt each running child gets SIGTERM and up to `grace` seconds to end; the jobs not yet started
    have no exit code."""
    t0 = time.perf_counter()
    forks = _Forks(preload if len(jobs) > 1 else None, env, say)
    running = _Running(env, gpus, forks, say)
    try:
        interrupted = pool.run_pool(list(jobs), running.start, processes, running.done, poll=poll, grace=grace,
                                    say=lambda line: say(f"[jobs] {line}"), what="check(s)")
    finally:
        forks.close()
    line = cpu_line(running.cpu_used, time.perf_counter() - t0, os.cpu_count() or 1, forks.cpu)
    if line:
        say(f"[jobs] {line}")
    return running.exits, interrupted
