"""`dflash-parity check --jobs N`: check several lowerings at once, one child `check` process each.

The cost of a sweep on a GPU is mostly per-case host work (drawing a case with hypothesis, building its
tensors, planning, launching a handful of small kernels, reading the verdict back), not GPU time, so the
lowerings of one run are checked side by side: up to N child processes (`python -m parity.cli check
--lowering NAME --part ...`), each drawing exactly the cases a serial run draws for its lowering (a
derandomized profile seeds each lowering's draws the same way in any process), each on the same device.

Each child writes its lowering's entry to `<report>/parts/<lowering>.json` and its failure files to
`<report>/failures/` (named by lowering, so children never write the same file) and replays that
lowering's saved failures first, as a serial run does. Its terminal table goes to
`<report>/parts/<lowering>.log`; its progress lines (each naming the lowering) go to this process's
stderr. When all are done, `merge_parts` puts the entries back in the order asked for; the run's
`parity.json`, `junit.xml` and `summary.md` are written from them. A child that dies without writing its
part (killed, out of memory, a crash outside any case) becomes a failed entry that says how it exited and
where its log is: nothing is silently missing from the report.

Children never outlive this process: however it ends (an exception, SIGINT, SIGTERM or SIGHUP with or
without a handler, even SIGKILL), each child gets SIGKILL from the kernel (Linux `PR_SET_PDEATHSIG`, set
in the child before it runs Python), and on every exit path through `run_jobs` its whole process group (the
child, its fork server, its isolated workers) is killed in a `finally`.

With `shards={name: S}` a lowering is checked by S children, each running every S-th of the cases a
serial run draws (`parity.shards`); their parts merge into the lowering's one entry.

Public: `child_argv(args, name, device, shard=None)`, `run_jobs(args, names, device, report_dir, jobs,
tolerances, say, shards=None) -> (data, interrupted)`, `merge_parts(...)`, `part_path(report_dir, name, shard=None)`.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable, Sequence

from parity import shards as shards_mod
from parity.interrupt import raise_if_requested
from parity.report import lowering_stem

Shard = tuple[int, int]  # (i, S): the i-th of S shards, 0-based


def part_path(report_dir: Path, name: str, shard: Shard | None = None) -> Path:
    """Where the child checking `name` (or one shard of it) writes its report entry."""
    suffix = "" if shard is None else f".shard-{shard[0]}-of-{shard[1]}"
    return Path(report_dir) / "parts" / f"{lowering_stem(name)}{suffix}.json"


def child_argv(args: Any, name: str, device: str, shard: Shard | None = None) -> list[str]:
    """The child's command line: this run's options for one lowering, writing a part (not a report)."""
    argv = [sys.executable, "-m", "parity.cli", "check", "--lowering", name, "--device", device,
            "--profile", args.profile, "--report", str(args.report), "--part",
            "--kernel-names-every", str(args.kernel_names_every)]
    if shard is not None:
        argv += ["--shard", f"{shard[0]}/{shard[1]}"]
    for p in args.plugin:
        argv += ["--plugin", str(Path(p).resolve())]
    for text in getattr(args, "limit", []):
        argv += ["--limit", text]
    for flag, value in (("--tolerances", args.tolerances), ("--max-examples", args.max_examples),
                        ("--seed", args.seed), ("--database", args.database), ("--case-timeout", args.case_timeout),
                        ("--hook-timeout", getattr(args, "hook_timeout", None))):
        if value is not None:
            argv += [flag, str(value)]
    for flag, on in (("--no-hardening", args.no_hardening), ("--no-isolate", args.no_isolate),
                     ("--allow-loose-bounds", getattr(args, "allow_loose_bounds", False)),
                     ("--warm-up", getattr(args, "warm_up", False)), ("--quiet", args.quiet)):
        if on:
            argv.append(flag)
    return argv


def child_env(jobs: int, environ: dict[str, str] | None = None, cpus: int | None = None) -> dict[str, str]:
    """The children's environment: this one, with each child's CPU threads (OpenMP, MKL) capped at its
    share of the cores unless the user set them; `jobs` processes of a full-width thread pool each
    oversubscribe the cores (measured on 2 cores: 3 jobs took twice as long as one after another)."""
    env = dict(os.environ if environ is None else environ)
    share = str(max(1, (cpus or os.cpu_count() or 1) // jobs))
    for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        env.setdefault(var, share)
    return env


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


def _stop_group(proc: subprocess.Popen) -> None:
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


def _lost_entry(name: str, device: str, why: str) -> dict[str, Any]:
    """The report entry of a lowering whose child wrote no part: a failure that says why."""
    from parity.report import to_json
    from parity.runner import LoweringReport

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


def merge_parts(report_dir: Path, names: Sequence[str], exits: dict[str, int | None], header: dict[str, Any],
                shards: dict[str, int] | None = None) -> dict[str, Any]:
    """One report from the children's parts, in the order of `names` (a missing part: a failed entry).
    `exits` is keyed by `shard_label`; a sharded lowering's parts merge into one entry (`parity.shards`)."""
    data = dict(header)
    data["lowerings"] = {}
    device = header.get("device", "?")
    for name in names:
        n = (shards or {}).get(name, 1)
        if n == 1:
            data["lowerings"][name] = _read_part(report_dir, name, None, exits, device)
            continue
        entries = [_read_part(report_dir, name, (i, n), exits, device) for i in range(n)]
        entry = shards_mod.merge_entries(entries)
        stem = lowering_stem(name)
        shards_mod.collect_failures(report_dir, stem, entry,
                                    [shards_mod.shard_dir(report_dir, stem, (i, n)) for i in range(n)])
        data["lowerings"][name] = entry
    return data


def run_jobs(args: Any, names: Sequence[str], device: str, report_dir: Path, jobs: int, tolerances: str,
             say: Callable[[str], None], poll: float = 0.2, grace: float = 60.0,
             shards: dict[str, int] | None = None, header: dict[str, Any] | None = None) -> tuple[dict[str, Any], bool]:
    """Check `names` in up to `jobs` child processes (`shards[name]` of them for a sharded lowering, its
    shards started first: they are the slow ones); returns (merged report data, interrupted).

    On KeyboardInterrupt (SIGINT, SIGTERM or SIGHUP: `parity.interrupt`) each running child gets SIGINT
    and up to `grace` seconds to write its partial part (its lowering then fails as "interrupted after N
    cases"); lowerings not yet started are reported as never started. The merged report is returned
    either way; `header` (parity.provenance.run_header) is its top level."""
    parts = report_dir / "parts"
    parts.mkdir(parents=True, exist_ok=True)
    shards = {k: v for k, v in (shards or {}).items() if v > 1}
    tasks: list[tuple[str, Shard | None]] = [(n, (i, shards[n])) for n in names if n in shards for i in range(shards[n])]
    tasks += [(n, None) for n in names if n not in shards]
    for name, shard in tasks:  # a part left by an earlier run must never pass for this run's
        part_path(report_dir, name, shard).unlink(missing_ok=True)
        if shard is not None:
            shutil.rmtree(shards_mod.shard_dir(report_dir, lowering_stem(name), shard), ignore_errors=True)
    env = child_env(jobs)
    libc = _libc()
    pending = list(tasks)
    running: dict[str, tuple[subprocess.Popen, Any, float]] = {}
    exits: dict[str, int | None] = {}
    interrupted = False

    def reap(label: str, code: int) -> None:
        proc, log, t0 = running.pop(label)
        log.close()
        exits[label] = code
        say(f"[jobs] {label}: done in {time.perf_counter() - t0:.1f} s (exit {code}; "
            f"{len(running)} running, {len(pending)} waiting)")

    def reap_finished() -> None:
        """Reap every child that has exited; wait `poll` seconds if some still run."""
        for label in list(running):
            code = running[label][0].poll()
            if code is not None:
                reap(label, code)
        if running:
            time.sleep(poll)

    try:
        while pending or running:
            while pending and len(running) < jobs:
                name, shard = pending.pop(0)
                label = shards_mod.shard_label(name, shard)
                log_path = part_path(report_dir, name, shard).with_suffix(".log")
                log_path.unlink(missing_ok=True)  # a planted link is removed, never written through
                log = open(log_path, "w")
                # own process group: a terminal's Ctrl-C reaches this process only, which passes it on
                proc = subprocess.Popen(child_argv(args, name, device, shard), stdout=log, stderr=None, env=env,
                                        start_new_session=True, preexec_fn=_dies_with_parent(libc, os.getpid()))
                running[label] = (proc, log, time.perf_counter())
                say(f"[jobs] {label}: started ({len(running)} running, {len(pending)} waiting)")
            reap_finished()
            raise_if_requested()  # a SIGINT the interpreter swallowed (parity.interrupt)
    except KeyboardInterrupt:
        interrupted = True
        say(f"[jobs] interrupted: asking {len(running)} running check(s) to write their partial reports "
            f"(up to {grace:g} s); {len(pending)} not started")
        for proc, _, _ in running.values():
            proc.send_signal(signal.SIGINT)
        deadline = time.perf_counter() + grace
        try:
            while running and time.perf_counter() < deadline:
                reap_finished()
            if running:
                say(f"[jobs] {len(running)} check(s) wrote no part within {grace:g} s: stopping them")
        except KeyboardInterrupt:  # interrupted again: stop now, but still merge what was written
            say(f"[jobs] interrupted again: stopping {len(running)} check(s) now; the parts written are kept")
    finally:
        for name in list(running):  # past the grace, a second interrupt, an error: stop them, keep their parts
            proc = running[name][0]
            _stop_group(proc)
            reap(name, proc.wait())
    import datetime as _dt

    import torch

    from parity.report import SCHEMA, SCHEMA_VERSION
    top = {"schema": SCHEMA, "version": SCHEMA_VERSION,
           "created": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
           "device": device, "profile": args.profile, "torch": torch.__version__, "tolerances": tolerances}
    top.update(header or {})
    return merge_parts(report_dir, names, exits, top, shards), interrupted
