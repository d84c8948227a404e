"""A check session: one `CheckConfig` run, from the plugins it loads to the report files it writes.

Both front ends drive it. `dflash-parity check` calls `run()` (every lowering, serially or over `--jobs`
child processes, then the report); the pytest plugin calls `check()` once per parity test and writes the
session's report at its end (`write_parts`, the merge of pytest-xdist workers' parts included). Steps:

- `load()`: the plugin files (first imported in a throwaway worker when cases run isolated), the device,
  the tolerance policy; `selected()`: the lowerings asked for (every registered one by default);
- `start_run()`: the report directory marked in progress (`parity.report.rundir`; `holding_report_dir()`
  prepares and locks it first, `parity.report.directory`); `header_for(names)`: the report's header
  (`parity.report.provenance`);
- `check(lowering, shard=...)`: the lowering's saved failures replayed first (in shard 0), then its
  boundary cases and the drawn sweep (`parity.engine.sweep.check_lowering`), optionally after a JIT warm-up;
- `write(reports)` (one process) or `write_parts(data)` (parts of other processes, merged by
  `parity.exec.jobs.merge_lowering`): failure files, junit.xml, summary.md, then parity.json; `end()` unmarks
  the directory; `gate()` compares the written report with `gate_baseline`.

A `--jobs` child runs `python -m parity.front.session --part SPEC` (the config as JSON, the lowering and its
shard), `part_main`: it checks that one lowering and writes its part (`parity.exec.jobs`).

`--shard I/S` (several machines) and `--shards NAME=S` / pytest-xdist shard items (several processes of
one host) compose: part `j` of `n` of shard `I` of `S` runs shard `I + S*j` of `S*n` of the serial run's
cases (`compose`), so the parts of every machine together run each case once.

Public: `CheckSession`, `Part`, `compose`, `part_main`.
"""

from __future__ import annotations

import contextlib
import json
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

from parity.engine import yardstick
from parity.front.config import CheckConfig, xdist_worker_count

Shard = tuple[int, int]
EXIT_OK, EXIT_FAIL, EXIT_USAGE = 0, 1, 2


def compose(outer: Shard | None, inner: Shard | None) -> Shard | None:
    """Part `inner = (j, n)` of shard `outer = (I, S)`: shard `(I + S*j, S*n)` of the serial run's cases."""
    if outer is None:
        return inner
    if inner is None:
        return outer
    return (outer[0] + outer[1] * inner[0], outer[1] * inner[1])


@dataclass(frozen=True)
class Part:
    """What a `--jobs` child checks: one lowering, or part `shard = (j, n)` of it (`--shards NAME=n`)."""

    lowering: str
    shard: Shard | None = None

    def to_json(self) -> dict[str, Any]:
        return {"lowering": self.lowering, "shard": list(self.shard) if self.shard else None}


def _stderr(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


class CheckSession:
    """One check (see the module docstring). `say`: progress lines (None: none); `warn`: what is said
    even when quiet (stderr); `part`: this process is a `--jobs` child checking that part."""

    def __init__(self, config: CheckConfig, *, say: Callable[[str], None] | None = None,
                 warn: Callable[[str], None] = _stderr, part: Part | None = None, workers: int = 1) -> None:
        self.config = config
        # pytest-xdist workers running cases beside this process (1: none); a check started inside an xdist
        # worker (`cli.main` in a test) counts them too, or every worker would take every core
        self.workers = max(workers, xdist_worker_count())
        self.threads: int | None = None  # torch's CPU threads here once loaded (`CheckConfig.threads_per_process`)
        self._threads_before: int | None = None
        self.say = say or (lambda line: None)
        self.warn = warn
        self.part = part
        self.report_dir = Path(config.report) if config.report else None
        self.device: str | None = None
        self.policy = None
        self.plugin_of: dict[str, str] = {}  # lowering -> the plugin file that registered it
        self.header: dict[str, Any] | None = None
        self.mps_status: str | None = None  # `--mps`: parity.exec.mps.MpsState.status, once the daemon is settled
        self.run_id: str | None = None
        self.started: str | None = None
        self.overrides = config.overrides()
        self._executor = None
        self.worker_cpu_seconds = 0.0  # of the isolated workers, once closed (`close`)
        self._loaded = False
        self._said_server = False
        self._created = time.perf_counter()

    # ---- set-up -------------------------------------------------------------------------------------
    def load(self, probe: bool | None = None) -> None:
        """Load the plugins (first in a throwaway worker when `probe`, default: isolated and not a part:
        one that crashes, hangs or exits at import is refused before this process imports it), the
        device and the policy. Once."""
        if self._loaded:
            return
        import lowerings
        from parity.exec import hooks
        from parity.engine import policy as policy_mod

        cfg = self.config
        if probe is None:
            probe = cfg.isolate and self.part is None
        if cfg.isolate and self.part is not None:  # a --jobs child: before it imports a plugin (a server forked
            self._start_fork_server()  # from this process must hold none); a plain check's: probe_plugins, check
        with hooks.timeout_set(cfg.hook_timeout):
            if probe and cfg.plugins:
                from parity.exec.plugin_probe import probe_plugins
                probe_plugins(list(cfg.plugins))
            for path in cfg.plugins:
                for name in hooks.load_plugin(path):
                    self.plugin_of[name] = path
        self.device = cfg.device or default_device()
        import torch

        self.threads = cfg.threads_per_process(self.workers)
        self._threads_before = torch.get_num_threads()
        torch.set_num_threads(self.threads)  # isolated workers take the parent's (parity.exec.isolation)
        self.policy = policy_mod.load(cfg.tolerances, allow_loose_bounds=cfg.allow_loose_bounds)
        self.policy.check_lowerings(lowerings.names())
        self._loaded = True

    def _start_fork_server(self) -> None:
        from parity.exec import forked_server
        from parity.exec.isolation import start_fork_server

        start_fork_server()
        if forked_server.how is not None and not self._said_server:  # once: how it started (forked? why not?)
            self._said_server = True
            self.say(forked_server.describe())

    def selected(self) -> list:
        """The lowerings asked for, in order (every registered one when none is named)."""
        import lowerings

        names = list(self.config.lowerings) or lowerings.names()
        return [lowerings.get(n) for n in names]

    @contextlib.contextmanager
    def holding_report_dir(self) -> Iterator[None]:
        """The report directory free of links out of it, locked against another check, the previous run's
        verdict moved out of the gate's way and the directory proven writable, for the block
        (`parity.report.directory.taken`; nothing when the session writes no report)."""
        if self.report_dir is None:
            yield
            return
        from parity.report import directory as report_dir_mod
        from parity.report.files import PARTIAL_NAME

        with report_dir_mod.taken(self.report_dir) as d:
            (d / PARTIAL_NAME).unlink(missing_ok=True)
            yield

    def run_settings(self, names: Sequence[str], **extra: Any) -> dict[str, Any]:
        """The report's `settings` (`parity.report.provenance.run_settings`) for the lowerings `names`."""
        from parity.report import provenance

        extra.setdefault("threads", self.threads)
        extra.setdefault("yardstick", yardstick.DEFAULT)  # what the yardstick rule measured against (parity.engine.yardstick)
        if self.mps_status is not None:  # `--mps`: what parity.exec.mps did
            extra.setdefault("mps", self.mps_status)
        return provenance.run_settings(self.config, device=self.device, settings=self.config.hypothesis_settings(),
                                       lowerings=names, **extra)

    def start_run(self) -> None:
        """The run's id and start time; the report directory marked in progress (`parity.report.rundir`)."""
        from parity.report import provenance, rundir
        from parity.report import directory as report_dir_mod

        self.run_id, self.started = provenance.new_run_id(), provenance.now()
        if self.report_dir is not None:
            report_dir_mod.written(self.report_dir, rundir.begin, self.report_dir, self.run_id, self.started)

    def header_for(self, names: Sequence[str], **settings_extra: Any) -> None:
        """The report's header (`parity.report.provenance.run_header`) for the lowerings `names`."""
        from parity.report import provenance

        if self.run_id is None:
            self.run_id, self.started = provenance.new_run_id(), provenance.now()
        self.header = provenance.run_header(run_id=self.run_id, started=self.started, device=self.device,
                                            profile=self.config.profile, policy=self.policy, lowerings=list(names),
                                            plugins=list(self.config.plugins),
                                            settings=self.run_settings(names, **settings_extra))

    def end(self) -> None:
        """The report directory no longer marked in progress (its verdict is written)."""
        from parity.report import rundir

        if self.run_id is not None and self.report_dir is not None:
            rundir.end(self.report_dir, self.run_id)

    def saved_failures(self, name: str, shard: Shard | None = None) -> list:
        """The lowering's saved failure files and the case a previous run left in flight (each checked as a
        case file a user gives is; a bad one raises InvalidInput naming it), in shard 0 only."""
        if self.report_dir is None or (shard is not None and shard[0] != 0):
            return []
        from parity.front.intake import check_case_fits, read_case_file
        from parity.exec.isolation import inflight_path
        from parity.report.file_names import lowering_stem, stem_files

        files = stem_files(self.report_dir / "failures", lowering_stem(name))
        inflight = inflight_path(self.report_dir / "inflight", name)
        if inflight.exists() or inflight.is_symlink():
            files.append(inflight)
        out = []
        for f in files:
            case, wrapper = read_case_file(f)
            if wrapper.get("lowering") != name or case in out:  # another lowering's file of the same stem
                continue
            check_case_fits(case, self.device, str(f))
            out.append(case)
        return out

    # ---- checking -----------------------------------------------------------------------------------
    def run_options(self):
        from parity.engine.invocation import RunOptions

        cfg = self.config
        return RunOptions(device=self.device, check_inputs_untouched=cfg.hardening, check_determinism=cfg.hardening,
                          check_output_buffers=cfg.hardening, profile_every=cfg.kernel_names_every)

    def executor(self, work_dir: Path | None, *, isolate: bool | None = None, case_timeout: float | None = None):
        """The isolated executor for cases whose in-flight file goes to `work_dir/inflight` (None: in
        process). The session's own one is kept for the next lowering; a call that asks for another case
        timeout gets its own (the caller closes it)."""
        cfg = self.config
        if not (cfg.isolate if isolate is None else isolate):
            return None
        from parity.exec.isolation import DEFAULT_CASE_TIMEOUT, IsolatedExecutor

        timeout = case_timeout or cfg.case_timeout or DEFAULT_CASE_TIMEOUT
        inflight = work_dir / "inflight" if work_dir is not None else None
        if self._executor is not None and self._executor.case_timeout == timeout:
            self._executor.inflight_dir = inflight
            return self._executor
        ex = IsolatedExecutor(plugins=list(cfg.plugins), tolerances=cfg.tolerances, opts=self.run_options(),
                              yardstick=yardstick.DEFAULT, case_timeout=timeout, inflight_dir=inflight,
                              hook_timeout=cfg.hook_timeout)
        if self._executor is None:
            self._executor = ex
        return ex

    def close(self) -> None:
        if self._threads_before is not None:  # the caller's thread count back (a pytest session goes on)
            import torch

            torch.set_num_threads(self._threads_before)
            self._threads_before = None
        if self._executor is not None:
            ex, self._executor = self._executor, None
            ex.close()
            self.worker_cpu_seconds += ex.worker_cpu_seconds
            if not self.config.quiet:
                label = f"  {shard_label_of(self.part)}: " if self.part else ""
                _stderr(f"{label}isolated: {ex.workers_started} worker(s) started, {ex.crashes} case(s) crashed or "
                        f"hung one, {ex.worker_cpu_seconds:.1f} s of worker CPU")

    def sanitizer(self):
        """On CUDA, the stream sanitizer's replay of a nondeterministic failure (`parity.exec.sanitizer`)."""
        if self.device != "cuda":
            return None
        from parity.exec import sanitizer as san

        plugins = list(self.config.plugins)
        return lambda name, case, hist: san.replay(name, case, hist, plugins=plugins)

    def check(self, lowering, *, shard: Shard | None = None, work_dir: Path | None = None,
              progress: Callable | None = None, warm: bool | None = None, max_examples: int | None = None,
              isolate: bool | None = None, case_timeout: float | None = None, fixed: dict[str, Any] | None = None,
              replay: list | None = None, shared_draws: Path | None = None):
        """Check one lowering: its saved failures first (shard 0), its boundary cases, the drawn sweep (shard
        `shard` of the serial run's cases). A hook failure while planning fails it alone; SIGINT during the
        warm-up gives a failed, interrupted report. `fixed` case fields narrow the draw (no boundary cases);
        `replay`: the saved failures (default: read from the report directory now)."""
        from lowerings.protocol import returns_lse
        from parity.exec import hooks
        from parity.engine.outcome import LoweringReport
        from parity.engine.sweep import check_lowering, hook_failure_report
        from parity.exec.warmup import warm_up_lowering
        from strategies import PROFILES, check_cases

        marks = [("load", time.perf_counter())]  # (the phase that starts, when): a --jobs child's start-up line
        self.load()
        cfg = self.config
        if cfg.isolate if isolate is None else isolate:  # its imports overlap the planning and the warm-up
            self._start_fork_server()
        work_dir = work_dir if work_dir is not None else self.report_dir
        replay = self.saved_failures(lowering.name, shard) if replay is None else replay
        executor = self.executor(work_dir, isolate=isolate, case_timeout=case_timeout)  # asked a plugin's hooks too
        own = executor if executor is not None and executor is not self._executor else None  # closed after it
        with hooks.timeout_set(cfg.hook_timeout), hooks.answered_by(executor and executor.hook, self.plugin_of), \
                contextlib.closing(own) if own is not None else contextlib.nullcontext():
            try:  # the lowering's hooks before its cases; one that raises, exits or hangs fails it alone
                marks.append(("planning", time.perf_counter()))
                plan = check_cases(lowering, self.device, profile=cfg.profile, overrides=self.overrides, **(fixed or {}))
                marks.append(("precompile", time.perf_counter()))
                warm, pre = cfg.warm_up if warm is None else warm, None
                if warm or self.part is not None or self.workers > 1:  # --jobs, xdist: siblings compile beside it
                    from parity.exec.precompile import precompile_for_check
                    pre = precompile_for_check(plan.limits, self.device, f"{lowering.name} {shard}",
                                               (lambda line: None) if cfg.quiet else self.say, self.warn)
                marks.append(("warm-up", time.perf_counter()))
                if warm:
                    warm_up_lowering(lowering, self.device, None if cfg.quiet else self.say, plan.limits)
                if self.part is not None and not cfg.quiet:
                    from parity.exec.jobs import start_up_line

                    marks.append(("", time.perf_counter()))
                    self.say(start_up_line(shard_label_of(self.part), self._created, marks))
            except hooks.HookFailure as hf:
                return hook_failure_report(LoweringReport(lowering.name, self.device, "pass",
                                                          lse_checked=returns_lse(lowering)), hf, time.perf_counter())
            except KeyboardInterrupt:  # stopped while planning or compiling: said so in the report, not lost
                return LoweringReport(lowering.name, self.device, "fail", interrupted=True,
                                      lse_checked=returns_lse(lowering), extra=[
                    "interrupted before its first case, while planning its cases or during the JIT warm-up (a "
                    "partial run, not a verdict)"])
            rep = check_lowering(lowering, self.policy, strategy=plan.strategy, boundaries=plan.boundaries,
                                 settings=cfg.hypothesis_settings(max_examples), opts=self.run_options(),
                                 yardstick=_yardstick(), replay=replay, progress=progress,
                                 target=PROFILES[cfg.profile].target, seed=cfg.seed, executor=executor,
                                 shard=shard, flaky_runs=cfg.runs_of_a_failure(), sanitizer=self.sanitizer(),
                                 draw_ahead=cfg.draw_ahead_mode(self.workers),
                                 shared_draws=shared_draws if cfg.draw_ahead != "off" else None)
            return pre.charge(rep) if pre is not None else rep

    # ---- reports ------------------------------------------------------------------------------------
    def report_kw(self) -> dict[str, Any]:
        from parity.report import files as report_mod

        return dict(device=self.device, profile=self.config.profile, tolerances=self.policy.source,
                    replay=report_mod.replay_args(self.device, self.config.tolerances),
                    plugins={name: report_mod.plugin_records([path]) for name, path in self.plugin_of.items()})

    def write_progress(self, reports: list) -> None:
        """The lowerings finished so far on disk before the next one starts (a crash loses none)."""
        from parity.report import files as report_mod

        if self.report_dir is None:
            return
        kw = self.report_kw()
        try:
            report_mod.write_progress(self.report_dir, reports, device=kw["device"], profile=kw["profile"],
                                      tolerances=kw["tolerances"], replay=kw["replay"], plugins=kw["plugins"])
        except OSError as err:
            self.warn(f"dflash-parity: warning: could not write the progress report: {err}")

    def write(self, reports: list, *, part: Path | None = None, amend_part=None,
              work_dir: Path | None = None) -> dict[str, Any]:
        """The report of `reports` (run in this process): its files, or (`part`) a `--jobs` child's part,
        its failure files in `work_dir` (default: the report directory)."""
        from parity.report import files as report_mod
        from parity.report import directory as report_dir_mod

        kw = self.report_kw()
        if self.report_dir is None:
            return report_mod.to_json(reports, device=kw["device"], profile=kw["profile"],
                                      tolerances=kw["tolerances"], replay=kw["replay"], header=self.header,
                                      family_counts=self.config.shard is not None)
        return report_dir_mod.written(self.report_dir, report_mod.write_reports, work_dir or self.report_dir, reports,
                                      part=part, amend_part=amend_part, header=self.header,
                                      policy_entries=self.policy.entry_names(),
                                      family_counts=self.config.shard is not None, **kw)

    def write_parts(self, data: dict[str, Any], *, interrupted: bool) -> dict[str, Any]:
        """The report of merged parts (`parity.parts.merge`): unmatched tolerance entries noted, the
        verdict stamped, junit.xml, summary.md and parity.json written."""
        from parity.report import provenance
        from parity.report import files as report_mod
        from parity.report import directory as report_dir_mod

        report_mod.note_unmatched(data, self.policy.entry_names())
        data = provenance.finish(data, interrupted=interrupted)
        if self.report_dir is not None:
            report_dir_mod.written(self.report_dir, report_mod.write_merged, self.report_dir, data)
        return data

    def top(self) -> dict[str, Any]:
        """The top level of a report made of parts: the schema, this run's header."""
        from parity.report import files as report_mod

        return report_mod.to_json([], device=self.device, profile=self.config.profile,
                                  tolerances=self.policy.source, header=self.header)

    def gate(self):
        """`parity.report.gate` of the written report against `gate_baseline` (gate.md written next to it), or None."""
        if self.config.gate_baseline is None or self.report_dir is None:
            return None
        from parity.report import gate as gate_mod
        from parity.report.files import atomic_write

        why = gate_mod.unfinished(self.config.gate_baseline)
        if why:
            res = gate_mod.unfinished_result([f"--gate-baseline: {why}"])
        else:
            base = gate_mod.load_report(self.config.gate_baseline, "--gate-baseline")
            new = gate_mod.load_report(self.report_dir, "the report")
            res = gate_mod.gate(base, new, accept=gate_mod.parse_accept(list(self.config.gate_accept)))
        atomic_write(self.report_dir / "gate.md", res.markdown)
        return res

    # ---- the CLI's whole run ------------------------------------------------------------------------
    def run(self, progress_for: Callable[[str, Shard | None], Callable] | None = None) -> dict[str, Any]:
        """Check every selected lowering (over `--jobs` children when asked) and write the report; the
        report data. `progress_for(name, shard)`: the progress callback of one lowering's sweep."""
        from parity.exec import shards as shards_mod
        from parity.report.file_names import check_distinct
        from strategies import limit_overrides  # noqa: F401  (the limits were checked by the config)

        self.load()
        cfg = self.config
        selected = self.selected()
        names = [lw.name for lw in selected]
        check_distinct(names)  # one failure-file stem each (parity.report.file_names), said before the first case
        shard_counts = shards_mod.parse_shards(list(cfg.shards), names)
        if cfg.mps:
            from oracle.errors import InvalidInput

            if cfg.jobs < 2:
                raise InvalidInput("--mps", "shares one GPU among the --jobs processes: give --jobs N (N >= 2) too")
            from parity.exec.mps import device_refusal

            why = device_refusal(self.device)
            if why:
                raise InvalidInput("--mps", why)
        # saved failures and cases in flight are read (and refused if bad) before the first case runs
        # (under --jobs, here too: before any child starts)
        replays = {n: self.saved_failures(n, cfg.shard) for n in names}
        self.start_run()
        self.header_for(names)
        if cfg.jobs > 1 and (len(selected) > 1 or shard_counts):
            from parity.exec.jobs import run_jobs

            self.say(f"checking {len(selected)} lowerings on {self.device}, up to {cfg.jobs} at once ({cfg.profile} "
                     f"profile, {'isolated' if cfg.isolate else 'in process'} in each)")
            data, interrupted = run_jobs(self, names, shards=shard_counts)
            data = self.write_parts(data, interrupted=interrupted)
            self.end()
            return data
        if cfg.mps:
            self.mps_status = "not used: one process runs the cases (one lowering, no --shards)"
            self.say(f"[mps] --mps: {self.mps_status[len('not used: '):]}: nothing to share")
            self.header_for(names)
        where = "in process" if not cfg.isolate else \
            f"isolated, case timeout {cfg.case_timeout or _default_case_timeout():g} s"
        results = []
        try:
            for n, lw in enumerate(selected, 1):
                label = shards_mod.shard_label(lw.name, cfg.shard)
                self.say(f"[{n}/{len(selected)}] {label} on {self.device} ({cfg.profile} profile, {where})")
                rep = self.check(lw, shard=cfg.shard, replay=replays[lw.name],
                                 progress=progress_for(lw.name, cfg.shard) if progress_for else None)
                results.append(rep)
                if len(selected) > 1:  # on disk before the next lowering (a crash loses none)
                    self.write_progress(results)
                if rep.interrupted:  # SIGINT: report what ran, check nothing more
                    self.warn(f"dflash-parity: interrupted during {lw.name}; writing the partial report")
                    break
        finally:
            self.close()
        data = self.write(results)
        self.end()
        return data

    def run_part(self) -> tuple[dict[str, Any], bool]:
        """A `--jobs` child's check of its part: the part written (`parity.exec.jobs.part_path`); (data, interrupted)."""
        from parity.exec import jobs as jobs_mod
        from parity.exec import shards as shards_mod
        from parity.report.files import lowering_stem

        self.load()
        name, inner = self.part.lowering, self.part.shard
        shard = compose(self.config.shard, inner)
        work_dir = self.report_dir if inner is None else shards_mod.shard_dir(self.report_dir, lowering_stem(name), inner)
        import lowerings

        lw = lowerings.get(name)
        label = shards_mod.shard_label(name, inner)
        try:
            shared = jobs_mod.shared_draws_path(self.report_dir, name, inner[1]) if inner else None
            rep = self.check(lw, shard=shard, work_dir=work_dir, progress=self._part_progress(label), shared_draws=shared)
        finally:
            self.close()
            if self.worker_cpu_seconds:  # the parent's count of this child's CPU cannot see them (not its children)
                with contextlib.suppress(OSError):
                    jobs_mod.workers_cpu_path(self.report_dir, name, inner).write_text(f"{self.worker_cpu_seconds:.3f}\n")
        fams = rep.compile_families
        data = self.write([rep], part=jobs_mod.part_path(self.report_dir, name, inner), work_dir=work_dir,
                          amend_part=lambda entry: shards_mod.shard_part_entry(entry, work_dir if inner else None, fams))
        return data, rep.interrupted

    def _part_progress(self, label: str):
        if self.config.quiet:
            return None
        from parity.front.cli import progress_printer

        return progress_printer(False, lines=True, label=label)


def shard_label_of(part: Part) -> str:
    from parity.exec.shards import shard_label

    return shard_label(part.lowering, part.shard)


def default_device() -> str:
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def _default_case_timeout() -> float:
    from parity.exec.isolation import DEFAULT_CASE_TIMEOUT

    return DEFAULT_CASE_TIMEOUT


def _yardstick():
    return yardstick.get(yardstick.DEFAULT)


# ---- a --jobs child -----------------------------------------------------------------------------------
def part_spec(config: CheckConfig, part: Part) -> str:
    """The JSON a `--jobs` child gets on its command line: the whole config and its part."""
    return json.dumps({"config": config.to_json(), "part": part.to_json()})


def part_main(argv: Sequence[str]) -> int:
    """`python -m parity.front.session --part SPEC`: check one part and write it (exit 0 pass, 1 fail, 2 bad input,
    130 interrupted: the part of the cases that ran is written first)."""
    from oracle.errors import InvalidInput
    from parity.exec import host_profile, interrupt
    from parity.front.cli import EXIT_INTERRUPTED
    from parity.report.files import format_table, table_rows

    if len(argv) != 2 or argv[0] != "--part":
        print("usage: python -m parity.front.session --part SPEC (a dflash-parity check --jobs child)", file=sys.stderr)
        return EXIT_USAGE
    try:
        spec = json.loads(argv[1])
        config = CheckConfig.from_json(spec["config"])
        part = Part(spec["part"]["lowering"], tuple(spec["part"]["shard"]) if spec["part"]["shard"] else None)
        # a child always takes SIGINT (its parent's means "write your partial part"), even where the parent
        # was started with SIGINT ignored
        with interrupt.installed(force=True), host_profile.profiled("part"):
            session = CheckSession(config, say=None if config.quiet else _stderr, part=part)
            try:
                data, interrupted = session.run_part()
            except SystemExit as exc:  # plugin code exiting the process: never a clean (or any) verdict
                print(f"dflash-parity: error: plugin code raised SystemExit({exc.code!r}) outside any case; the "
                      f"part fails (none written)", file=sys.stderr)
                return EXIT_FAIL
    except (InvalidInput, ValueError, KeyError, TypeError) as err:
        print(f"dflash-parity: error: {err}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        return interrupt.exit_code()
    print(format_table(table_rows(data)))
    if interrupted:
        return EXIT_INTERRUPTED
    return EXIT_FAIL if any(v["status"] == "fail" for v in data["lowerings"].values()) else EXIT_OK


if __name__ == "__main__":  # pragma: no cover
    from parity.exec.leftovers import finish
    from parity.front.session import part_main as _main  # the module proper, not this __main__ copy

    finish(_main(sys.argv[1:]))
