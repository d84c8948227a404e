"""A lowering over a hypothesis-drawn sweep: `check_lowering`.

Replay the saved failures, run the boundary cases, then draw cases with hypothesis (`parity.engine.search`), which
shrinks a failure to the smallest case that still fails; each failure re-run and classified
(`parity.engine.flakiness`). Its settings: `SweepSpec` (`parity.engine.sweep_state`); the wrappers of `run_case` it
composes: `parity.engine.case_runners`; what it writes into the report besides the cases:
`parity.engine.sweep_report`. A hook that raises, exits or hangs fails the lowering (`hook_failure_report`); a
plugin's `sys.exit()` too (`exited`); the run goes on with the next lowering.

Public: `check_lowering`, `SweepSpec`, `lowering_available`, `hook_failure_report`.
"""

from __future__ import annotations

import time
from dataclasses import replace
from typing import Any

from lowerings import calls as hooks
from lowerings.calls import HookFailure
from lowerings.protocol import Lowering, device_refusal, returns_lse
from oracle.errors import InvalidInput
from parity.engine import flakiness as fl, search, slips
from parity.engine.answers import availability
from parity.engine.case_run import refuse_invalid, run_case as run_case_here
from parity.engine.case_runners import executor_run_case, stops_on_interrupt
from parity.engine.draws import DrawDiverged
from parity.engine.outcome import CaseOutcome, Failure, LoweringReport
from parity.engine.policy import Policy
from parity.engine.ports import CaseExecutor, raise_if_stop_requested
from parity.engine.sweep_report import compile_budget_message, exited, hook_failure_report, named, reduce_again, reduced
from parity.engine.sweep_state import SweepSpec, SweepState


def lowering_available(lowering: Lowering, device: str, executor: CaseExecutor | None = None) -> tuple[bool, str]:
    """`(False, why)` on a device the lowering does not declare in `devices` (`device_refusal`; its
    `available()` is not asked); else `lowering.available(device)`: in the executor's worker when it offers
    it, else here under the hook runner; a hook failure raises `HookFailure`, a malformed answer too."""
    refused = device_refusal(lowering, device)
    if refused:
        return False, refused
    asked = getattr(executor, "available", None)
    if callable(asked):
        return asked(lowering.name, device)
    return availability(lowering.name, hooks.call(lowering, "available", device))


def check_lowering(lowering: Lowering, policy: Policy, spec: SweepSpec | None = None, /,
                   **fields: Any) -> LoweringReport:
    """Replay saved failures, run the boundary cases, then draw cases with hypothesis; a failure is shrunk
    and recorded. Returns the lowering's report.

    `spec` gives the sweep's settings (`SweepSpec`: the strategy, hypothesis's settings, the executor, the shard,
    ...), or `fields` do, by `SweepSpec`'s field names (`check_lowering(lw, pol, strategy=..., settings=...)`); both:
    the fields replace the spec's. An unknown name is a TypeError.

    `boundaries` run before the first drawn case, whatever the seed. `executor` runs each supported case
    elsewhere, typically in a worker process that survives the lowering crashing or hanging; None runs
    `run_case` in this process. Either way a failing outcome is raised inside hypothesis's test function, so
    crashes shrink like any failure. `shard=(i, n)` runs every n-th drawn case from the i-th, or for a lowering
    that compiles the cases of every n-th compile family from the i-th (`sharded_run_case`).
    A hook of the lowering (`available`, `supports`, ...) that raises, exits, hangs or answers the wrong type
    fails the lowering at once, naming the hook, the time and the case (not shrunk); so does any other exception
    but bad input (`InvalidInput`, raised), named as one the framework did not foresee; the caller goes on.
    Each failure is then re-run `flaky_runs` (R) times and classified ("failed k of R runs", nondeterministic,
    state-dependent); a failure that passed on hypothesis's replay is shrunk in a second search where a case
    fails if it fails in one of R runs; `sanitizer` replays a run-dependent one and its report is attached.
    0: none of it. `draw_ahead`: the cases drawn by another process while this one judges them, the same
    search (the drawer port, `parity.engine.ports.DrawAhead`); `shared_draws`: the file through which the
    shards of this lowering share one drawer.
    """
    spec = SweepSpec(**fields) if spec is None else replace(spec, **fields)
    opts, yardstick = spec.opts, spec.yardstick
    run_case = run_case_here if spec.executor is None else executor_run_case(spec.executor)
    judge_again = stops_on_interrupt(run_case)  # re-runs that classify a failure (not absorbed in the report)
    reruns = fl.Reruns(lowering, opts, lambda c: judge_again(lowering, c, policy, opts, yardstick), spec.executor,
                       spec.flaky_runs)
    run_case = reruns.history.wrap(run_case)
    t0 = time.perf_counter()
    report = LoweringReport(lowering.name, opts.device, "pass", max_compiles=lowering.max_compiles,
                            lse_checked=returns_lse(lowering))
    state = SweepState(lowering, policy, spec, report, t0, run_case=run_case, base_run_case=run_case, reruns=reruns,
                       progress=spec.progress, seed=spec.seed)
    try:
        return _check(state)
    except HookFailure as hf:  # a hook raised, exited or hung: this lowering's failure, the run goes on
        return hook_failure_report(report, hf, t0)
    except DrawDiverged as err:  # never seen: the draws read more than the seed
        report.status = "fail"
        report.extra.append(f"the search stopped: {err}")
        return state.timed()
    except InvalidInput:  # bad input (a saved case whose oracle is not finite, ...): the run's, exit 2
        raise
    except Exception as err:  # noqa: BLE001  (what no check foresaw: this lowering's failure, the run goes on)
        report.status = "fail"
        report.extra.append(f"the check of this lowering stopped on an error the framework did not foresee, after "
                            f"{report.cases} case(s): {hooks.describe_exception(err, lowering)}"[:600])
        return state.timed()
    except KeyboardInterrupt:  # between the phases (setting up hypothesis's search): what ran is kept all the same
        if not report.interrupted:
            report.status, report.interrupted = "fail", True
            report.extra.append(f"interrupted after {report.cases} case(s): a partial run, not a verdict")
        return state.timed()


def _check(s: SweepState) -> LoweringReport:
    """The phases of one lowering's check, in order, up to the first that ends it; then the report finished."""
    ok, why = lowering_available(s.lowering, s.spec.opts.device, s.spec.executor)
    if not ok:
        s.report.status, s.report.reason = "unavailable", why
        return s.report
    for phase in (_replay_saved, _boundaries_first, search.search):
        ended = phase(s)
        if ended is not None:
            return ended
    return _finished(s)


def _replay_saved(s: SweepState) -> LoweringReport | None:
    """The saved failures, judged first: the final report when one still fails (a saved failure is fixed before
    new cases are drawn), on SIGINT, or on a plugin's exit; else None."""
    report = s.report
    try:
        for case in s.spec.replay:
            raise_if_stop_requested()
            out = refuse_invalid(s.run(case))
            s.count(case, out)
            if out.status == "fail":
                report.failures.append(Failure(out, shrunk=False))
    except KeyboardInterrupt:
        report.status, report.interrupted = "fail", True
        report.extra.append(f"interrupted after {report.cases} case(s), replaying the saved failures: a partial "
                            f"run, not a verdict")
        return s.timed()
    except SystemExit as err:
        return exited(report, err, s.t0)
    if not report.failures:
        return None
    report.status = "fail"
    report.extra.append("a saved failure still fails; fix it before new cases are drawn")
    if s.spec.flaky_runs:
        named(report, s.reruns, s.spec.sanitizer)
    return s.timed()


def _boundaries_first(s: SweepState) -> LoweringReport | None:
    """The boundary cases (like the replays: once, in the first shard): the final report when one decides it
    (`_run_boundaries`), on SIGINT, or on a plugin's exit; else None, the first failing one kept for the draw."""
    spec, report = s.spec, s.report
    if not spec.boundaries or (spec.shard is not None and spec.shard[0] != 0):
        return None
    try:
        done, s.boundary_failure = _run_boundaries(s)
    except KeyboardInterrupt:
        report.status, report.interrupted = "fail", True
        report.extra.append(f"interrupted after {report.cases} case(s), running the boundary cases: a partial "
                            f"run, not a verdict")
        done = True
    except SystemExit as err:
        return exited(report, err, s.t0)
    if not done:
        return None
    if spec.flaky_runs and report.failures and not report.interrupted:
        named(report, s.reruns, spec.sanitizer)
    return s.timed()


def _run_boundaries(s: SweepState) -> tuple[bool, tuple[CaseOutcome, str] | None]:
    """Run the boundary cases (`strategies.Boundary`: `.case`, `.label`, `.other_side`) in order, up to the first
    that fails. Returns `(done, failure)`: `done` when the report is final (a failing case whose other side
    passes: the bug needs this side of a declared boundary, and the case, every other field at its simplest, is
    minimal: recorded as shrunk); else the first failing case and its label, for the sweep to report if the
    random draw finds none to shrink."""
    ran: dict[str, CaseOutcome] = {}

    def run(case) -> CaseOutcome:
        key = case.to_json(indent=None)
        if key not in ran:
            raise_if_stop_requested()
            out = ran[key] = refuse_invalid(s.run(case))
            s.count(case, out)
        return ran[key]

    for bnd in s.spec.boundaries:
        out = run(bnd.case)
        if out.status != "fail":
            continue
        if bnd.other_side is not None and run(bnd.other_side).status == "pass":
            s.report.failures.append(Failure(out, shrunk=True))
            s.report.extra.append(f"caught by the boundary case {bnd.label}, run before the random draw: its other "
                                  f"side passes and every other field is the simplest, so it is the minimal case")
            s.report.status = "fail"
            return True, None
        return False, (out, bnd.label)
    return False, None


def _finished(s: SweepState) -> LoweringReport:
    """The report after the search: a boundary case's failure the draw did not reach, the failures named, the
    compile budget, the verdict and the seconds."""
    report, spec = s.report, s.spec
    if s.boundary_failure is not None and not report.failures and not report.interrupted:
        first, label = s.boundary_failure
        report.extra.append(f"caught by the boundary case ({label}) run before the random draw, which did not "
                            f"reach it in {report.cases} case(s)" + ("" if s.reducing else "; not shrunk"))
        found = reduced(report, first, s.judge) if s.reducing else first
        slips.record(report, first, found, shrunk=s.reducing and not report.interrupted,
                     shrink_again=reduce_again(report, first, s.judge))
    if spec.flaky_runs and report.failures and not report.interrupted:
        named(report, s.reruns, spec.sanitizer)
    msg = compile_budget_message(s.lowering, report)
    if msg:
        report.extra.append(msg)
    if report.failures or report.extra:
        report.status = "fail"
    return s.timed()
