"""`dflash-parity check --jobs N`: check several lowerings at once, one child process each.

The cost of a sweep on a GPU is mostly per-case host work (drawing a case with hypothesis, building its
tensors, planning, launching a handful of small kernels, reading the verdict back), not GPU time, so the
lowerings of one run are checked side by side: up to N child processes (`python -m parity.front.session --part
SPEC`, the run's `CheckConfig` as JSON and the lowering: `child_argv`), each drawing exactly the cases a
serial run draws for its lowering (a derandomized profile seeds each lowering's draws the same way in any
process). On cuda with several visible GPUs each child gets one of them (`CUDA_VISIBLE_DEVICES`, the
least busy when it starts: `parity.exec.gpus.GpuSlots`); with one GPU they share it.

Each child writes its lowering's entry to `<report>/parts/<lowering>.json` and its failure files to
`<report>/failures/` (named by lowering, so children never write the same file) and replays that
lowering's saved failures first, as a serial run does. Its terminal table goes to
`<report>/parts/<lowering>.log`; its progress lines (each naming the lowering) go to this process's
stderr. When all are done, `merge_parts` puts the entries back in the order asked for; the run's
`parity.json`, `junit.xml` and `summary.md` are written from them. A child that dies without writing its
part (killed, out of memory, a crash outside any case) becomes a failed entry that says how it exited and
where its log is: nothing is silently missing from the report.

Children never outlive this process (`parity.exec.pool`: the one process pool of jobs and warm-up). On
KeyboardInterrupt (SIGINT, SIGTERM or SIGHUP: `parity.exec.interrupt`) each running child gets SIGINT and up
to a grace period to write its partial part.

With `shards={name: S}` a lowering is checked by S children, each running a 1/S share of the cases a
serial run draws (every S-th draw, or every S-th compile family of a lowering that compiles:
`parity.exec.shards`); their parts merge into the lowering's one entry (`merge_lowering`, also the pytest
plugin's merge of its xdist workers' parts).

Each child's CPU seconds (its isolated workers' included: `workers_cpu_path`) end its "done" line, and their
sum ends the run (`cpu_line`). On session 18's H200 every child of run 11's command was bound by its CPU (its CPU
seconds 97-99% of its wall, run 62), so their sum over the cores is the wall's floor.

Public: `child_argv(config, part)`, `child_env`, `cpu_line`, `workers_cpu_path`, `shared_draws_path`,
`run_jobs(session, names, shards=None) -> (data, interrupted)`, `merge_parts(...)`, `merge_lowering(...)`,
`part_path(report_dir, name, shard=None)`.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Sequence

from parity.exec import pool
from parity.exec.pool import child_env  # noqa: F401  (public here too: the children's environment)
from parity.exec.prefork import Prefork, PreforkError
from parity.exec import shards as shards_mod
from parity.engine.outcome import FAMILY_KEYS
from parity.report.files import lowering_stem

Shard = tuple[int, int]  # (i, S): the i-th of S shards, 0-based


def part_path(report_dir: Path, name: str, shard: Shard | None = None) -> Path:
    """Where the child checking `name` (or one shard of it) writes its report entry."""
    suffix = "" if shard is None else f".shard-{shard[0]}-of-{shard[1]}"
    return Path(report_dir) / "parts" / f"{lowering_stem(name)}{suffix}.json"


def shared_draws_path(report_dir: Path, name: str, shards: int) -> Path:
    """The file through which the `shards` shard processes of lowering `name` share one drawer
    (`parity.exec.draw_ahead.SharedDraws`); removed before the shards start, so that one is never an earlier run's."""
    return Path(report_dir) / "parts" / f"{lowering_stem(name)}.draws-of-{shards}"


def workers_cpu_path(report_dir: Path, name: str, shard: Shard | None = None) -> Path:
    """Where that child writes the CPU seconds of its isolated workers (one number), which run outside its
    process tree (a fork server's children), so its own CPU seconds do not hold them."""
    return part_path(report_dir, name, shard).with_suffix(".workers-cpu")


def _workers_cpu(path: Path) -> float:
    try:
        return max(0.0, float(path.read_text().strip()))
    except (OSError, ValueError):
        return 0.0


def child_argv(config: Any, part: Any) -> list[str]:
    """The child's command line: this run's config (as JSON) for one part (`parity.front.session.Part`), its
    plugin files made absolute."""
    from parity.front.session import part_spec

    child = config.replace(lowerings=(part.lowering,), plugins=tuple(str(Path(p).resolve()) for p in config.plugins),
                           jobs=1, threads=config.threads_per_process(), shards=(), gate_baseline=None, gate_accept=())
    return [sys.executable, "-m", "parity.front.session", "--part", part_spec(child, part)]


def _lost_entry(name: str, device: str, why: str) -> dict[str, Any]:
    """The report entry of a lowering whose child wrote no part: a failure that says why."""
    from parity.report.files import to_json
    from parity.engine.outcome import LoweringReport

    return to_json([LoweringReport(name, device, "fail", extra=[why])], device=device, profile="",
                   tolerances="")["lowerings"][name]


def _tail(path: Path, n: int = 6) -> str:
    try:
        lines = path.read_text(errors="replace").strip().splitlines()
    except OSError:
        return ""
    return " | ".join(lines[-n:])


def _read_part(report_dir: Path, name: str, shard: Shard | None, exits: dict[str, int | None],
               device: str) -> dict[str, Any]:
    """One child's entry, or a failed entry saying why there is none."""
    path, label = part_path(report_dir, name, shard), shards_mod.shard_label(name, shard)
    if path.is_file():
        try:
            return json.loads(path.read_text())["lowerings"][name]
        except (OSError, ValueError, KeyError) as err:
            return _lost_entry(name, device, f"the check process wrote an unreadable part {path}: "
                                             f"{type(err).__name__}: {err}")
    log = path.with_suffix(".log")
    if label not in exits:
        why = "the check process for this lowering was never started (the run was interrupted first)"
    else:
        code = exits[label]
        how = f"exited with code {code}" if code is not None and code >= 0 else f"was killed by signal {-(code or 0)}"
        why = (f"the check process for this lowering {how} without writing its report "
               f"(log {log}: {_tail(log)[:400]})")
    return _lost_entry(name, device, why)


def merge_lowering(report_dir: Path | None, name: str, entries: Sequence[dict[str, Any]], dirs: Sequence[Path],
                   *, sharded: bool, keep_families: bool = False) -> dict[str, Any]:
    """One lowering's entry from its parts' (in shard order; `sharded`: they are shards to merge, else the
    one entry): the parts' failure files moved from `dirs` into `<report>/failures/` (numbered as a serial
    run numbers them); the per-family compile counts kept only with `keep_families` (a report that is
    itself one shard of a run over several machines)."""
    entry = shards_mod.merge_entries(entries, name) if sharded else dict(entries[0])
    if report_dir is not None and dirs:
        shards_mod.collect_failures(report_dir, lowering_stem(name), entry, dirs)
    if keep_families:
        entry.setdefault(FAMILY_KEYS, {})
    else:
        entry.pop(FAMILY_KEYS, None)
    return entry


def merge_parts(report_dir: Path, names: Sequence[str], exits: dict[str, int | None], header: dict[str, Any],
                shards: dict[str, int] | None = None, keep_families: bool = False) -> dict[str, Any]:
    """One report from the children's parts, in the order of `names` (a missing part: a failed entry).
    `exits` is keyed by `shard_label`; a sharded lowering's parts merge into one entry (`merge_lowering`)."""
    data = dict(header)
    data["lowerings"] = {}
    device = header.get("device", "?")
    for name in names:
        n = (shards or {}).get(name, 1)
        if n == 1:
            entry = _read_part(report_dir, name, None, exits, device)
            data["lowerings"][name] = merge_lowering(report_dir, name, [entry], [], sharded=False,
                                                     keep_families=keep_families)
            continue
        entries = [_read_part(report_dir, name, (i, n), exits, device) for i in range(n)]
        stem = lowering_stem(name)
        data["lowerings"][name] = merge_lowering(report_dir, name, entries,
                                                 [shards_mod.shard_dir(report_dir, stem, (i, n)) for i in range(n)],
                                                 sharded=True, keep_families=keep_families)
    return data


def run_jobs(session: Any, names: Sequence[str], shards: dict[str, int] | None = None, *, poll: float = 0.2,
             grace: float = 60.0) -> tuple[dict[str, Any], bool]:
    """Check `names` in up to `session.config.jobs` child processes (`shards[name]` of them for a sharded
    lowering, its shards started first: they are the slow ones); returns (merged report data, interrupted).

    On KeyboardInterrupt each running child gets SIGINT and up to `grace` seconds to write its partial part
    (its lowering then fails as "interrupted after N cases"); lowerings not yet started are reported as
    never started. The merged report is returned either way, with the session's header on top."""
    from parity.exec.gpus import GpuSlots, visible_gpus
    from parity.front.session import Part

    config, report_dir, say = session.config, Path(session.config.report), session.say
    parts = report_dir / "parts"
    parts.mkdir(parents=True, exist_ok=True)
    shards = {k: v for k, v in (shards or {}).items() if v > 1}
    tasks = [Part(n, (i, shards[n])) for n in names if n in shards for i in range(shards[n])]
    tasks += [Part(n) for n in names if n not in shards]
    for t in tasks:  # a part left by an earlier run must never pass for this run's
        part_path(report_dir, t.lowering, t.shard).unlink(missing_ok=True)
        if t.shard is not None:
            shutil.rmtree(shards_mod.shard_dir(report_dir, lowering_stem(t.lowering), t.shard), ignore_errors=True)
            shared_draws_path(report_dir, t.lowering, t.shard[1]).unlink(missing_ok=True)
    gpus = GpuSlots(visible_gpus() if session.device == "cuda" else 0, os.environ.get("CUDA_VISIBLE_DEVICES"))
    from parity.exec.mps import processes_per_gpu

    per_gpu = processes_per_gpu(min(config.jobs, len(tasks)), gpus.count)
    try:
        with _mps_for(session, per_gpu) as mps:
            return _run_tasks(session, names, tasks, shards, child_env(config.jobs, mps=mps.env), gpus, poll=poll,
                              grace=grace)
    finally:  # the shards' shared draws (parity.exec.draw_ahead.SharedDraws): read by now, or never to be
        for t in tasks:
            if t.shard is not None:
                shared_draws_path(report_dir, t.lowering, t.shard[1]).unlink(missing_ok=True)


def _mps_for(session: Any, per_gpu: int):
    """`parity.exec.mps.mps_session` under `--mps` (its status in the report's `settings.mps`); else a no-op, with
    the note that MPS exists when several processes share a GPU."""
    import contextlib

    from parity.exec import mps as mps_mod

    if not getattr(session.config, "mps", False):
        if session.device == "cuda":
            hint = mps_mod.mps_hint(per_gpu)
            if hint:
                session.say(f"[jobs] {hint}")
        return contextlib.nullcontext(mps_mod.MpsState())

    @contextlib.contextmanager
    def recorded():
        with mps_mod.mps_session(per_gpu, lambda line: session.say(line)) as state:
            session.mps_status = state.status
            if session.header is not None:  # written before the daemon was settled
                session.header.setdefault("settings", {})["mps"] = state.status
            yield state
    return recorded()


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
    """`--jobs-start prefork`: the prefork the children are forked from (`parity.exec.prefork`), or None where it
    could not start or failed (the children then start as fresh interpreters; `say` tells why, once). `cpu`:
    the prefork's own CPU seconds (its imports; None without one), counted with the children's."""

    def __init__(self, wanted: bool, env: dict[str, str], say) -> None:
        self.prefork, self.cpu, self.say, self._held = None, None, say, []
        if not wanted:
            return
        excluded: list[str] = []
        while self.prefork is None:
            try:
                self.prefork = Prefork().start(env, exclude=excluded)
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


def _run_tasks(session: Any, names: Sequence[str], tasks: list, shards: dict[str, int], env: dict[str, str], gpus,
               *, poll: float, grace: float) -> tuple[dict[str, Any], bool]:
    config, report_dir, say = session.config, Path(session.config.report), session.say
    exits: dict[str, int | None] = {}
    held: dict[Any, tuple[Any, int | None]] = {}  # task -> (its log file, its GPU)
    procs: dict[Any, subprocess.Popen] = {}
    cpu_used: list[float] = []  # the CPU seconds of each ended child that has them

    def label(t) -> str:
        return shards_mod.shard_label(t.lowering, t.shard)

    def start(t) -> subprocess.Popen:
        log_path = part_path(report_dir, t.lowering, t.shard).with_suffix(".log")
        log_path.unlink(missing_ok=True)  # a planted link is removed, never written through
        workers_cpu_path(report_dir, t.lowering, t.shard).unlink(missing_ok=True)  # an earlier run's
        log = open(log_path, "w")
        gpu = gpus.take()
        held[t] = (log, gpu)
        argv, child = child_argv(config, t), {**env, **gpus.env(gpu)}
        if forks.prefork is not None:
            try:
                procs[t] = forks.prefork.spawn(argv, child, log_path)
            except PreforkError as err:
                forks.give_up(f"the prefork process failed: {err}")
        if t not in procs:
            procs[t] = subprocess.Popen(argv, stdout=log, stderr=None, env=child, **pool.child_kwargs())
        proc = procs[t]
        on = f" on GPU {gpu}" if gpu is not None else ""
        say(f"[jobs] {label(t)}: started{on} ({sum(gpus.busy) if gpus.count > 1 else len(held)} running)")
        return proc

    def done(t, code: int, seconds: float) -> None:
        log, gpu = held.pop(t)
        log.close()
        gpus.give_back(gpu)
        exits[label(t)] = code
        cpu = pool.cpu_seconds(procs.pop(t))
        workers = _workers_cpu(workers_cpu_path(report_dir, t.lowering, t.shard))
        used = ""
        if cpu is not None:
            cpu += workers
            cpu_used.append(cpu)
            used = f", {cpu:.1f} s of CPU" + (f" ({workers:.1f} s in isolated workers)" if workers else "")
        say(f"[jobs] {label(t)}: done in {seconds:.1f} s{used} (exit {code}; {len(held)} running)")

    t0 = time.perf_counter()
    forks = _Forks(config.jobs_start == "prefork" and len(tasks) > 1, env, say)
    try:
        interrupted = pool.run_pool(tasks, start, config.jobs, done, poll=poll, grace=grace,
                                    say=lambda line: say(f"[jobs] {line}"), what="check(s)")
    finally:
        forks.close()
    line = cpu_line(cpu_used, time.perf_counter() - t0, os.cpu_count() or 1, forks.cpu)
    if line:
        say(f"[jobs] {line}")
    data = merge_parts(report_dir, names, exits, session.top(), shards, keep_families=config.shard is not None)
    return data, interrupted


def start_up_line(label: str, created: float, marks: list[tuple[str, float]]) -> str:
    """`"  NAME: its cases start 3.1 s after this process began: session 0.4 s, load 0.0 s, planning 1.2 s, ..."`:
    where a `--jobs` child's time went before its first case; `marks` are (the phase that starts, when), the last
    one unnamed (the cases)."""
    parts = [("session", marks[0][1] - created)] + [(n, t1 - t0) for (n, t0), (_, t1) in zip(marks, marks[1:])]
    return (f"  {label}: its cases start {marks[-1][1] - created:.1f} s after this process began: "
            + ", ".join(f"{n} {s:.1f} s" for n, s in parts))
