"""A check session: one `CheckConfig` run, from the plugins it loads to the report files it writes.

Both front ends drive it. `dflash-parity check` calls `run()` (every lowering, serially or over `--jobs` child
processes, then the report); `dflash-parity repro` replays one case through `available()` and `run_one()` (the same
executor, policy and options as `check`); the pytest plugin calls `check()` once per parity test and writes the
session's report at its end (`write_parts`, the merge of pytest-xdist workers' parts included). Steps:

- `load()`: the plugin files (first imported in a throwaway worker when cases run isolated,
  `parity.exec.plugin_probe`), the device, the tolerance policy; `selected()`: the lowerings asked for;
- the report's steps (`parity.front.session_report.ReportSteps`): the directory held and marked in progress, the
  header, the files, the gate;
- `check(lowering, shard=...)`: the lowering's saved failures replayed first (in shard 0), then its boundary cases
  and the drawn sweep (`parity.engine.sweep.check_lowering`), optionally after a JIT warm-up
  (`parity.exec.warmup`, `parity.exec.precompile`), cases run by the isolated executor (`parity.exec.isolation`);
- `run()`: `check` for each lowering and `write`, or, under `--jobs`, the children (`parity.front.controller`),
  each a `parity.front.part` process checking one part, and `write_parts` of their merge.

The options of one `check`, from the command line to the judge (each file hands them down, none back up a layer):
`parity/front/cli.py` (the parser, `parity/front/options.py`'s table) -> `parity/front/cmd_check.py`
(`config_from_args`) -> `parity/front/config.py` (`CheckConfig`, validated) -> `parity/front/session.py`
(`CheckSession.check`: `RunOptions`, the hypothesis settings, the executor) -> `parity/engine/sweep.py`
(`check_lowering`) -> `parity/engine/case_run.py` (`run_case`) -> `parity/engine/judge.py`: seven files.

`--shard I/S` (several machines) and `--shards NAME=S` / pytest-xdist shard items (several processes of
one host) compose: part `j` of `n` of shard `I` of `S` runs shard `I + S*j` of `S*n` of the serial run's
cases (`parity.front.part.compose`), so the parts of every machine together run each case once.

Public: `CheckSession`, `Asked`, `default_device`.
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import lowerings
from lowerings.protocol import returns_lse
from oracle.errors import InvalidInput
from parity.engine import policy as policy_mod
from parity.engine import yardstick
from parity.engine.invocation import RunOptions
from parity.engine.outcome import LoweringReport
from parity.engine.runner import executor_run_case, lowering_available, run_case
from parity.engine import sweep
from parity.exec import forked_server, hooks, warmup
from parity.exec.isolation import DEFAULT_CASE_TIMEOUT, IsolatedExecutor, start_fork_server
from parity.exec.plugin_probe import probe_plugins
from parity.exec.precompile import precompile_for_check
from parity.front import shards as shards_mod
from parity.front.config import CheckConfig, xdist_worker_count
from parity.front.progress import say as _stderr, start_up_line
from parity.front.session_report import ReportSteps
from parity.report.file_names import check_distinct
from strategies import PROFILES, check_cases

Shard = tuple[int, int]


@dataclass(frozen=True)
class Asked:
    """What one `check` call asks beyond the session's config (the pytest plugin's `parity_check(...)`): `warm`
    (the JIT warm-up; None: the config's), `max_examples` (None: the config's), `isolate` and `case_timeout`
    (None: the config's; another case timeout gets its own executor), `fixed` case fields (narrow the draw; no
    boundary cases)."""

    warm: bool | None = None
    max_examples: int | None = None
    isolate: bool | None = None
    case_timeout: float | None = None
    fixed: dict[str, Any] = field(default_factory=dict)


class CheckSession(ReportSteps):
    """One check (see the module docstring). `say`: progress lines (None: none); `warn`: what is said
    even when quiet (stderr); `part`: this process is a `--jobs` child checking that part
    (`parity.front.part.Part`); `workers`: pytest-xdist workers running cases beside this process."""

    def __init__(self, config: CheckConfig, *, say: Callable[[str], None] | None = None,
                 warn: Callable[[str], None] = _stderr, part: Any = None, workers: int = 1) -> None:
        self.config = config
        # a check started inside an xdist worker (`cli.main` in a test) counts them too, or every worker would take
        # every core
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
        self.created = time.perf_counter()

    # ---- set-up -------------------------------------------------------------------------------------
    def load(self, probe: bool | None = None) -> None:
        """Load the plugins (first in a throwaway worker when `probe`, default: isolated and not a part:
        one that crashes, hangs or exits at import is refused before this process imports it), the
        device and the policy. Once."""
        if self._loaded:
            return
        cfg = self.config
        if probe is None:
            probe = cfg.isolate and self.part is None
        if cfg.isolate and self.part is not None:  # a --jobs child: before it imports a plugin (a server forked
            self._start_fork_server()  # from this process must hold none); a plain check's: probe_plugins, check
        with hooks.timeout_set(cfg.hook_timeout):
            if probe and cfg.plugins:
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
        start_fork_server()
        if forked_server.how is not None and not self._said_server:  # once: how it started (forked? why not?)
            self._said_server = True
            self.say(forked_server.describe())

    def selected(self) -> list:
        """The lowerings asked for, in order (every registered one when none is named)."""
        names = list(self.config.lowerings) or lowerings.names()
        return [lowerings.get(n) for n in names]

    # ---- running cases --------------------------------------------------------------------------------
    def run_options(self) -> RunOptions:
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

    def available(self, lowering) -> tuple[bool, str]:
        """`lowering.available(device)`, asked where its cases run (the isolated worker, or here)."""
        self.load()
        return lowering_available(lowering, self.device, self.executor(None))

    def run_one(self, lowering, case):
        """One case of `lowering` judged as `check` judges it (`dflash-parity repro`): in the isolated worker, or
        here; its `CaseOutcome`."""
        self.load()
        ex = self.executor(None)
        run = run_case if ex is None else executor_run_case(ex)
        return run(lowering, case, self.policy, self.run_options(), _yardstick())

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
                label = f"  {self.part_label()}: " if self.part else ""
                _stderr(f"{label}isolated: {ex.workers_started} worker(s) started, {ex.crashes} case(s) crashed or "
                        f"hung one, {ex.worker_cpu_seconds:.1f} s of worker CPU")

    def part_label(self) -> str:
        return shards_mod.shard_label(self.part.lowering, self.part.shard) if self.part else ""

    def sanitizer(self):
        """On CUDA, the stream sanitizer's replay of a nondeterministic failure (`parity.exec.sanitizer`)."""
        if self.device != "cuda":
            return None
        from parity.exec import sanitizer as san

        plugins = list(self.config.plugins)
        return lambda name, case, hist: san.replay(name, case, hist, plugins=plugins)

    # ---- one lowering ---------------------------------------------------------------------------------
    def check(self, lowering, *, shard: Shard | None = None, work_dir: Path | None = None,
              progress: Callable | None = None, replay: list | None = None, shared_draws: Path | None = None,
              asked: Asked = Asked()) -> LoweringReport:
        """Check one lowering: its saved failures first (shard 0), its boundary cases, the drawn sweep (shard
        `shard` of the serial run's cases). A hook failure while planning fails it alone; SIGINT during the
        warm-up gives a failed, interrupted report. `replay`: the saved failures (default: read from the report
        directory now); `asked`: what this call asks beyond the config (`Asked`)."""
        marks = [("load", time.perf_counter())]  # (the phase that starts, when): a --jobs child's start-up line
        self.load()
        cfg = self.config
        if cfg.isolate if asked.isolate is None else asked.isolate:  # its imports overlap the planning, the warm-up
            self._start_fork_server()
        work_dir = work_dir if work_dir is not None else self.report_dir
        replay = self.saved_failures(lowering.name, shard) if replay is None else replay
        executor = self.executor(work_dir, isolate=asked.isolate, case_timeout=asked.case_timeout)  # asked hooks too
        own = executor if executor is not None and executor is not self._executor else None  # closed after it
        with hooks.timeout_set(cfg.hook_timeout), hooks.answered_by(executor and executor.hook, self.plugin_of), \
                contextlib.closing(own) if own is not None else contextlib.nullcontext():
            try:  # the lowering's hooks before its cases; one that raises, exits or hangs fails it alone
                plan, pre = self._prepare(lowering, shard, asked, marks)
            except hooks.HookFailure as hf:
                return sweep.hook_failure_report(LoweringReport(lowering.name, self.device, "pass",
                                                          lse_checked=returns_lse(lowering)), hf, time.perf_counter())
            except KeyboardInterrupt:  # stopped while planning or compiling: said so in the report, not lost
                return LoweringReport(lowering.name, self.device, "fail", interrupted=True,
                                      lse_checked=returns_lse(lowering), extra=[
                    "interrupted before its first case, while planning its cases or during the JIT warm-up (a "
                    "partial run, not a verdict)"])
            rep = self._sweep(lowering, plan, executor, shard=shard, replay=replay, progress=progress,
                              shared_draws=shared_draws, max_examples=asked.max_examples)
            return pre.charge(rep) if pre is not None else rep

    def _prepare(self, lowering, shard: Shard | None, asked: Asked, marks: list):
        """The lowering's planned cases (`strategies.check_cases`), then its precompile and JIT warm-up where asked
        (or where sibling processes compile beside it); (plan, the precompile or None)."""
        cfg = self.config
        marks.append(("planning", time.perf_counter()))
        plan = check_cases(lowering, self.device, profile=cfg.profile, overrides=self.overrides, **asked.fixed)
        marks.append(("precompile", time.perf_counter()))
        warm, pre = cfg.warm_up if asked.warm is None else asked.warm, None
        if warm or self.part is not None or self.workers > 1:  # --jobs, xdist: siblings compile beside it
            pre = precompile_for_check(plan.limits, self.device, f"{lowering.name} {shard}",
                                       (lambda line: None) if cfg.quiet else self.say, self.warn)
        marks.append(("warm-up", time.perf_counter()))
        if warm:
            warmup.warm_up_lowering(lowering, self.device, None if cfg.quiet else self.say, plan.limits)
        if self.part is not None and not cfg.quiet:
            marks.append(("", time.perf_counter()))
            self.say(start_up_line(self.part_label(), self.created, marks))
        return plan, pre

    def _sweep(self, lowering, plan, executor, *, shard, replay, progress, shared_draws, max_examples):
        """The engine's sweep of one lowering (`parity.engine.sweep.check_lowering`) with the session's options."""
        cfg = self.config
        return sweep.check_lowering(lowering, self.policy, strategy=plan.strategy, boundaries=plan.boundaries,
                                    settings=cfg.hypothesis_settings(max_examples), opts=self.run_options(),
                                    yardstick=_yardstick(), replay=replay, progress=progress,
                                    target=PROFILES[cfg.profile].target, seed=cfg.seed, executor=executor,
                                    shard=shard, flaky_runs=cfg.runs_of_a_failure(), sanitizer=self.sanitizer(),
                                    draw_ahead=cfg.draw_ahead_mode(self.workers),
                                    shared_draws=shared_draws if cfg.draw_ahead != "off" else None)

    # ---- the CLI's whole run ------------------------------------------------------------------------
    def run(self, progress_for: Callable[[str, Shard | None], Callable] | None = None) -> dict[str, Any]:
        """Check every selected lowering (over `--jobs` children when asked) and write the report; the
        report data. `progress_for(name, shard)`: the progress callback of one lowering's sweep."""
        self.load()
        cfg = self.config
        selected = self.selected()
        names = [lw.name for lw in selected]
        check_distinct(names)  # one failure-file stem each (parity.report.file_names), said before the first case
        shard_counts = shards_mod.parse_shards(list(cfg.shards), names)
        self._refuse_mps()
        # saved failures and cases in flight are read (and refused if bad) before the first case runs
        # (under --jobs, here too: before any child starts)
        replays = {n: self.saved_failures(n, cfg.shard) for n in names}
        self.start_run()
        self.header_for(names)
        if cfg.jobs > 1 and (len(selected) > 1 or shard_counts):
            from parity.front.controller import run_jobs

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
        data = self.write(self._run_serially(selected, replays, progress_for))
        self.end()
        return data

    def _refuse_mps(self) -> None:
        """`--mps` without `--jobs N`, or on a device MPS cannot serve: bad input, before anything runs."""
        if not self.config.mps:
            return
        if self.config.jobs < 2:
            raise InvalidInput("--mps", "shares one GPU among the --jobs processes: give --jobs N (N >= 2) too")
        from parity.exec.mps import device_refusal

        why = device_refusal(self.device)
        if why:
            raise InvalidInput("--mps", why)

    def _run_serially(self, selected: list, replays: dict[str, list], progress_for) -> list:
        """Each lowering checked in this process, the finished ones on disk before the next starts."""
        cfg = self.config
        where = "in process" if not cfg.isolate else \
            f"isolated, case timeout {cfg.case_timeout or DEFAULT_CASE_TIMEOUT:g} s"
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
        return results


def default_device() -> str:
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def _yardstick():
    return yardstick.get(yardstick.DEFAULT)
