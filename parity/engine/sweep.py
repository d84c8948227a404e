"""A lowering over a hypothesis-drawn sweep: `check_lowering`.

Replay the saved failures, run the boundary cases (`_run_boundaries`), then draw cases with hypothesis,
which shrinks a failure to the smallest case that still fails (one that slips to a failure of another
reason is shrunk again under its own, both reported: `parity.engine.slips`); each failure re-run and classified
(`parity.engine.flakiness`). The wrappers of `run_case` it composes: `executor_run_case` (a case in an
isolated worker, `parity.exec.isolation`), `sharded_run_case` (one shard of the draws, `parity.exec.shards`),
`stops_on_interrupt`, `refusing_invalid`. A hook that raises, exits or hangs fails the lowering
(`hook_failure_report`); a plugin's `sys.exit()` too (`_exited`).
"""

from __future__ import annotations

import time
import zlib
from pathlib import Path
from typing import Any, Callable, Protocol, Sequence

from lowerings.protocol import Lowering, device_refusal, returns_lse
from oracle.case import Case
from oracle.errors import InvalidInput
from lowerings import calls as hooks
from parity.exec import draw_ahead as ahead
from parity.engine import flakiness as fl, slips
from parity.engine.answers import availability, supports_answer
from parity.engine.case_run import compile_family, refuse_invalid, run_case
from lowerings.calls import HookFailure
from parity.exec.interrupt import raise_if_requested, requested
from parity.engine.invocation import RunOptions
from parity.engine.policy import Policy
from parity.engine.outcome import SKIPPED, CaseOutcome, Failure, LoweringReport

_module_run_case = run_case  # check_lowering rebinds the name `run_case` locally (see there)


def compile_budget_message(lowering: Lowering, report: LoweringReport) -> str | None:
    """A message when the run compiled more than `max_compiles` per shape family it saw."""
    if lowering.max_compiles is None:
        return None
    over = {fam: n for fam, n in report.compile_families.items() if n > lowering.max_compiles}
    if not over:
        return None
    fam, n = max(over.items(), key=lambda kv: kv[1])
    return (f"compiled {n} times within one shape family {fam} (bound {lowering.max_compiles} per family; "
            f"{len(over)} of {len(report.compile_families)} families over it; kernels {dict(report.compiles)}): "
            f"a kernel recompiles for a value it must take at run time (batch size, lengths, split count)")


def _exited(report: LoweringReport, err: SystemExit, t0: float) -> LoweringReport:
    """The lowering's report when its plugin code (`supports()`, `expected_calls()`, or `run()` in process)
    raised SystemExit: a failure of that lowering, never a clean end of the run."""
    report.status = "fail"
    report.extra.append(f"plugin code raised SystemExit({err.code!r}) after {report.cases} case(s) (in supports(), "
                        f"expected_calls() or run()): a lowering must return, not exit the process")
    report.seconds = time.perf_counter() - t0
    return report


class CaseFailed(Exception):
    """A failing outcome raised inside hypothesis's test function, so that hypothesis shrinks its case."""

    def __init__(self, outcome: CaseOutcome):
        super().__init__(outcome.summary())
        self.outcome = outcome


_CaseFailed = CaseFailed  # the name `prop` raises: its source text seeds derandomized draws (see check_lowering)


def case_failures(err: BaseException) -> list[CaseFailed]:
    """The `CaseFailed` exceptions inside `err` (hypothesis's Flaky errors group them)."""
    if isinstance(err, CaseFailed):
        return [err]
    found: list[CaseFailed] = []
    for sub in getattr(err, "exceptions", ()) or ():
        found += case_failures(sub)
    if not found and err.__cause__ is not None:
        found = case_failures(err.__cause__)
    return found


def refusing_invalid(run_case: Callable[..., CaseOutcome]) -> Callable[..., CaseOutcome]:
    """`run_case` that raises InvalidInput for a case whose oracle is not finite (`refuse_invalid`)."""
    def run(*args) -> CaseOutcome:
        return refuse_invalid(run_case(*args))
    return run


def _interrupt_kept(run: Callable[[], None]) -> None:
    """`run()`; an error it raises after a SIGINT came (`parity.exec.interrupt.requested`) is that interrupt: a
    KeyboardInterrupt raised inside hypothesis's own set-up (reading the test's source for its database key)
    came back as hypothesis's `AssertionError`, and the check process exited without its partial report (seen
    on CPU under load: 2 runs in 18). A case's failure stays what it is."""
    from hypothesis.errors import Flaky, Unsatisfiable

    try:
        run()
    except (KeyboardInterrupt, SystemExit, _CaseFailed, Flaky, Unsatisfiable):
        raise
    except Exception as err:
        if requested():
            raise KeyboardInterrupt from err
        raise


def stops_on_interrupt(run_case: Callable[..., CaseOutcome]) -> Callable[..., CaseOutcome]:
    """`run_case` that first raises a SIGINT the interpreter swallowed (`parity.exec.interrupt`)."""
    def run(*args) -> CaseOutcome:
        raise_if_requested()
        return run_case(*args)
    return run


def shard_of_family(family: tuple, n: int) -> int:
    """The shard (0 <= s < n) of a compile family where the shards draw different cases: a hash of its text,
    the same in every process (Python's own `hash` of a string differs between processes)."""
    return zlib.crc32(repr(family).encode()) % n


def sharded_run_case(run_case: Callable[..., CaseOutcome], shard: tuple[int, int],
                     failing: bool = False, family: Callable[[Case], tuple] | None = None,
                     shared_draws: bool = True) -> Callable[..., CaseOutcome]:
    """`run_case` for shard `i` of `n`: of the cases hypothesis draws, it runs its share and answers SKIPPED
    (a pass, to hypothesis) for the rest, so that the `n` shards of a derandomized profile draw the serial
    run's sequence and together run each of its cases once. The share: the draws whose index is `i` modulo
    `n`, or, given `family(case)` (a lowering that compiles: its compile family), every case of the
    families whose order of first appearance in the draws is `i` modulo `n` (every shard sees the same
    draws, so they agree on it), so that each family is compiled in one process only instead of in every
    shard, and the frequent families, drawn early, are spread over the shards. Where the shards do not draw
    the same sequence (`shared_draws` False: a random profile without a seed, or one targeted at the worst
    error), each family goes to the shard `shard_of_family` names, so that every family drawn is still judged
    by one shard and compiled by one. After a failure (or from the start, `failing`: a boundary case failed, the
    draw is to shrink it) it runs every case: hypothesis's shrinking must see each of its attempts judged."""
    i, n = shard
    state = {"drawn": 0, "failing": failing}
    owners: dict[tuple, int] = {}

    def mine(idx: int, case: Case) -> bool:
        if family is None:
            return idx % n == i
        key = family(case)
        if key not in owners:
            owners[key] = len(owners) % n if shared_draws else shard_of_family(key, n)
        return owners[key] == i

    def run(lowering: Lowering, case: Case, policy: Policy, opts: RunOptions, yardstick: Lowering | None) -> CaseOutcome:
        idx = state["drawn"]
        state["drawn"] += 1
        if not state["failing"] and not mine(idx, case):
            return CaseOutcome(lowering.name, case, SKIPPED)
        out = run_case(lowering, case, policy, opts, yardstick)
        state["failing"] = state["failing"] or out.status == "fail"
        return out
    return run


def executor_run_case(executor: "CaseExecutor") -> Callable[..., CaseOutcome]:
    """`run_case`'s signature over `executor.run` (supports() is asked through `lowerings.calls.call`: here under
    its watchdog, or for a plugin's lowering in the executor's worker when `check` has it answered there)."""
    def run(lowering: Lowering, case: Case, policy: Policy, opts: RunOptions, yardstick: Lowering | None) -> CaseOutcome:
        why = hooks.call(lowering, "supports", case, case=case, expect=supports_answer)
        if why:
            return CaseOutcome(lowering.name, case, "unsupported", reason=why)
        return executor.run(lowering.name, case)
    return run


class CaseExecutor(Protocol):
    """Where `check_lowering` runs a case: in process (the default) or in a worker (parity.exec.isolation).
    An executor may also answer `available(lowering_name, device) -> (ok, why)` (asked there, isolated)."""

    def run(self, lowering_name: str, case: Case) -> CaseOutcome: ...


def lowering_available(lowering: Lowering, device: str, executor: CaseExecutor | None = None) -> tuple[bool, str]:
    """`(False, why)` on a device the lowering does not declare in `devices` (`device_refusal`; its
    `available()` is not asked); else `lowering.available(device)`: in the executor's worker when it offers
    it, else here under the hook watchdog; a hook failure raises `HookFailure`, a malformed answer too."""
    refused = device_refusal(lowering, device)
    if refused:
        return False, refused
    asked = getattr(executor, "available", None)
    if callable(asked):
        return asked(lowering.name, device)
    return availability(lowering.name, hooks.call(lowering, "available", device))


def hook_failure_report(report: "LoweringReport", hf: HookFailure, t0: float) -> "LoweringReport":
    """`report` failed by a hook's failure: the note names the hook; the case it was asked about (if any)
    becomes a failure (not shrunk) with its replayable file."""
    report.status = "fail"
    report.extra.append(f"{hf.message}; the check of this lowering stopped there (after {report.cases} case(s))")
    if hf.case is not None:
        report.failures.append(Failure(CaseOutcome(report.lowering, hf.case, "fail", failures=[hf.message]),
                                       shrunk=False))
    report.seconds = time.perf_counter() - t0
    return report


def _reduce(report: LoweringReport, outcome: CaseOutcome, judge: Callable[[Case], CaseOutcome]) -> CaseOutcome:
    """`outcome`'s case reduced by `parity.engine.reduce` (its line in the report's notes); on SIGINT the cuts made
    so far are kept and the report is marked interrupted; a plugin's SystemExit keeps the failure as found."""
    from parity.engine.reduce import reduce_failure

    try:
        best, log = reduce_failure(outcome, judge)
    except SystemExit as err:  # as `_exited` says of a plugin's exit in a drawn case
        report.extra.append(f"plugin code raised SystemExit({err.code!r}) while the case reducer ran: a lowering "
                            f"must return, not exit the process; the failure is kept as found")
        return outcome
    report.extra.append(log.line())
    if log.interrupted:
        report.interrupted = True
        report.extra.append("interrupted while reducing a failing case: a partial run, not a verdict")
    return best


def _reduce_again(report: LoweringReport, first: CaseOutcome, judge: Callable[[Case], CaseOutcome]):
    """`want -> outcome`: `first` reduced again where only a failure for one of the reasons `want` counts
    (`parity.engine.slips.record`, after a reduction that slipped to another reason)."""
    return lambda want: _reduce(report, first, slips.same_reason_judge(judge, want))


def _name_failures(report: LoweringReport, reruns, sanitizer) -> None:
    """`parity.engine.flakiness.name_failures`; SIGINT while re-running keeps the report (marked interrupted)."""
    try:
        fl.name_failures(report, reruns.classify, sanitizer)
    except KeyboardInterrupt:
        report.interrupted = True
        report.status = "fail"
        report.extra.append("interrupted while re-running a failure to classify it: a partial run, not a verdict")


def _run_boundaries(boundaries: Sequence[Any], lowering: Lowering, policy: Policy, opts: RunOptions,
                    yardstick: Lowering | None, run_case: Callable[..., CaseOutcome], report: LoweringReport,
                    progress) -> tuple[bool, tuple[CaseOutcome, str] | None]:
    """Run the boundary cases in order, up to the first that fails. Returns `(done, failure)`: `done` when
    the report is final (a failing case whose other side passes: the bug needs this side of a declared
    boundary, and the case, every other field at its simplest, is minimal: recorded as shrunk); else the
    first failing case and its label, for `check_lowering` to report if the random draw finds none to
    shrink."""
    ran: dict[str, CaseOutcome] = {}

    def run(case: Case) -> CaseOutcome:
        key = case.to_json(indent=None)
        if key not in ran:
            raise_if_requested()
            out = ran[key] = refuse_invalid(run_case(lowering, case, policy, opts, yardstick))
            report.absorb(out, compile_family(lowering, case))
            if progress:
                progress(report, out)
        return ran[key]

    for bnd in boundaries:
        out = run(bnd.case)
        if out.status != "fail":
            continue
        if bnd.other_side is not None and run(bnd.other_side).status == "pass":
            report.failures.append(Failure(out, shrunk=True))
            report.extra.append(f"caught by the boundary case {bnd.label}, run before the random draw: its other "
                                f"side passes and every other field is the simplest, so it is the minimal case")
            report.status = "fail"
            return True, None
        return False, (out, bnd.label)
    return False, None


def check_lowering(lowering: Lowering, policy: Policy, *, strategy, settings, opts: RunOptions = RunOptions(),
                   yardstick: Lowering | None = None, replay: list[Case] = (),
                   progress: Callable[[LoweringReport, CaseOutcome], None] | None = None,
                   target: bool = False, seed: int | None = None,
                   executor: CaseExecutor | None = None, shard: tuple[int, int] | None = None,
                   flaky_runs: int = 4, sanitizer: Callable[[str, Case, Case | None], str] | None = None,
                   boundaries: Sequence[Any] = (), draw_ahead: str = "auto",
                   shared_draws: Path | None = None) -> LoweringReport:
    """Replay saved failures, run the boundary cases, then draw cases with hypothesis; a failure is shrunk
    and recorded.

    `boundaries` (`strategies.Boundary`: `.case`, `.label`, `.other_side`; `strategies.check_cases`
    gives a lowering's) run before the first drawn case, whatever the seed (`_run_boundaries`).

    `executor` (an object with `run(lowering_name, case) -> CaseOutcome`, e.g.
    `parity.exec.isolation.IsolatedExecutor`) runs each supported case elsewhere, typically in a worker process
    that survives the lowering crashing or hanging; None runs `run_case` in this process. Either way a
    failing outcome is raised inside hypothesis's test function, so crashes shrink like any failure.
    `shard=(i, n)` runs every n-th drawn case from the i-th, or for a lowering that compiles the cases of
    every n-th compile family from the i-th (`sharded_run_case`; 0 <= i < n).
    A hook of the lowering (`available`, `supports`, ...) that raises, exits, hangs or answers the wrong type
    fails the lowering at once, naming the hook, the time and the case (`parity.exec.hooks`; not shrunk); so does
    any other exception but bad input (`InvalidInput`), named as one the framework did not foresee; the caller
    goes on.
    Each failure is then re-run `flaky_runs` (R) times and classified (`parity.engine.flakiness`: "failed k of R
    runs", nondeterministic, state-dependent); a failure that passed on hypothesis's replay is shrunk in a
    second search where a case fails if it fails in one of R runs; `sanitizer(lowering_name, case, history)`
    (on CUDA: `parity.exec.sanitizer`) replays a nondeterministic one and its report is attached. 0: none of it.
    `draw_ahead` (`auto`, `on`, `off`): the cases drawn by a forked process while this one judges them, the
    same search (`parity.exec.draw_ahead`); `shared_draws` (a `--jobs` shard): the file through which the shards of
    this lowering share one drawer (`parity.exec.draw_ahead.SharedDraws`).
    """
    # `run_case` is rebound locally (not renamed) on purpose: derandomized hypothesis profiles seed their
    # draws from the test function's source, so `prop` below keeps the exact text it always had and a
    # given profile draws the same cases in process and isolated.
    run_case = _module_run_case if executor is None else executor_run_case(executor)

    judge_again = stops_on_interrupt(run_case)  # re-runs that classify a failure (not absorbed in the report)
    reruns = fl.Reruns(lowering, opts, lambda c: judge_again(lowering, c, policy, opts, yardstick), executor,
                       flaky_runs)
    run_case = base_run_case = reruns.history.wrap(run_case)

    t0 = time.perf_counter()
    report = LoweringReport(lowering.name, opts.device, "pass", max_compiles=lowering.max_compiles,
                            lse_checked=returns_lse(lowering))
    try:
        return _check_lowering(lowering, policy, report, t0, strategy=strategy, settings=settings, opts=opts,
                               yardstick=yardstick, replay=replay, progress=progress, target=target, seed=seed,
                               executor=executor, shard=shard, run_case=run_case, flaky_runs=flaky_runs,
                               sanitizer=sanitizer, reruns=reruns, base_run_case=base_run_case,
                               boundaries=boundaries, draw_ahead=draw_ahead, shared_draws=shared_draws)
    except HookFailure as hf:  # a hook raised, exited or hung: this lowering's failure, the run goes on
        return hook_failure_report(report, hf, t0)
    except ahead.DrawDiverged as err:  # never seen: the draws read more than the seed
        report.status = "fail"
        report.extra.append(f"the search stopped: {err}")
        report.seconds = time.perf_counter() - t0
        return report
    except InvalidInput:  # bad input (a saved case whose oracle is not finite, ...): the run's, exit 2
        raise
    except Exception as err:  # noqa: BLE001  (what no check foresaw: this lowering's failure, the run goes on)
        report.status = "fail"
        report.extra.append(f"the check of this lowering stopped on an error the framework did not foresee, after "
                            f"{report.cases} case(s): {hooks.describe_exception(err, lowering)}"[:600])
        report.seconds = time.perf_counter() - t0
        return report
    except KeyboardInterrupt:  # between the phases (setting up hypothesis's search): what ran is kept all the same
        if not report.interrupted:
            report.status, report.interrupted = "fail", True
            report.extra.append(f"interrupted after {report.cases} case(s): a partial run, not a verdict")
        report.seconds = time.perf_counter() - t0
        return report


def _keeping_smallest_failure(run_case: Callable[..., CaseOutcome], smallest: list[CaseOutcome]):
    """`run_case`, keeping in `smallest` (one item) the smallest failing outcome it returned (`fl.case_size`)."""
    def run(*args, **kwargs) -> CaseOutcome:
        out = run_case(*args, **kwargs)
        if out.status == "fail" and (not smallest or fl.case_size(out.case) < fl.case_size(smallest[0].case)):
            smallest[:] = [out]
        return out

    return run


def _check_lowering(lowering: Lowering, policy: Policy, report: LoweringReport, t0: float, *, strategy, settings,
                    opts: RunOptions, yardstick: Lowering | None, replay: list[Case], progress, target: bool,
                    seed: int | None, executor: CaseExecutor | None, shard: tuple[int, int] | None,
                    run_case: Callable[..., CaseOutcome], flaky_runs: int, sanitizer, reruns,
                    base_run_case: Callable[..., CaseOutcome], boundaries: Sequence[Any],
                    draw_ahead: str, shared_draws: Path | None) -> LoweringReport:
    from hypothesis import Phase, given, target as hyp_target
    from hypothesis.errors import Flaky, Unsatisfiable

    ok, why = lowering_available(lowering, opts.device, executor)
    if not ok:
        report.status, report.reason = "unavailable", why
        return report
    try:
        for case in replay:
            raise_if_requested()
            out = refuse_invalid(run_case(lowering, case, policy, opts, yardstick))
            report.absorb(out, compile_family(lowering, case))
            if progress:
                progress(report, out)
            if out.status == "fail":
                report.failures.append(Failure(out, shrunk=False))
    except KeyboardInterrupt:
        report.status, report.interrupted = "fail", True
        report.extra.append(f"interrupted after {report.cases} case(s), replaying the saved failures: a partial "
                            f"run, not a verdict")
        report.seconds = time.perf_counter() - t0
        return report
    except SystemExit as err:
        return _exited(report, err, t0)
    if report.failures:
        report.status = "fail"
        report.extra.append("a saved failure still fails; fix it before new cases are drawn")
        if flaky_runs:
            _name_failures(report, reruns, sanitizer)
        report.seconds = time.perf_counter() - t0
        return report

    boundary_failure = None
    if boundaries and (shard is None or shard[0] == 0):  # like the replays: once, in the first shard
        try:
            done, boundary_failure = _run_boundaries(boundaries, lowering, policy, opts, yardstick, run_case,
                                                     report, progress)
        except KeyboardInterrupt:
            report.status, report.interrupted = "fail", True
            report.extra.append(f"interrupted after {report.cases} case(s), running the boundary cases: a partial "
                                f"run, not a verdict")
            done = True
        except SystemExit as err:
            return _exited(report, err, t0)
        if done:
            if flaky_runs and report.failures and not report.interrupted:
                _name_failures(report, reruns, sanitizer)
            report.seconds = time.perf_counter() - t0
            return report

    if shard is not None:  # after the replays: they run in every shard that is given them
        by_family = None if lowering.max_compiles is None else (lambda c: compile_family(lowering, c))
        shared = (settings.derandomize or seed is not None) and not target  # every shard draws the same cases
        run_case = sharded_run_case(run_case, shard, failing=boundary_failure is not None, family=by_family,
                                    shared_draws=shared)
        if progress is not None:
            shown = progress
            progress = lambda rep, out: None if out.status == SKIPPED else shown(rep, out)  # noqa: E731
    run_case = refusing_invalid(stops_on_interrupt(run_case))
    reducing = Phase.shrink not in settings.phases

    def reduce_judge(case: Case) -> CaseOutcome:  # a step of the case reducer, judged and counted as a case
        out = run_case(lowering, case, policy, opts, yardstick)
        report.absorb(out, compile_family(lowering, case))
        if progress:
            progress(report, out)
        return out

    # The smallest failing outcome so far, what an interrupted shrink leaves: kept by a wrapper of `run_case`,
    # not in `prop`, whose text seeds hypothesis's derandomized draws (an edit of it changes every draw).
    smallest: list[CaseOutcome] = []
    run_case = _keeping_smallest_failure(run_case, smallest)
    first_failing: list[CaseOutcome] = []  # the failure the shrink starts from (`parity.engine.slips`)
    run_case = slips.keeping_first_failure(run_case, first_failing)

    @settings
    @given(case=strategy)
    def prop(case: Case) -> None:
        out = run_case(lowering, case, policy, opts, yardstick)
        report.absorb(out, compile_family(lowering, case))
        if progress:
            progress(report, out)
        if target and out.status == "pass":
            hyp_target(float(out.figure("out_ulp", 0.0) or 0.0), label="out_ulp")
        if out.status == "fail":
            raise _CaseFailed(out)

    if seed is None and not settings.derandomize and flaky_runs:
        import random  # a seed of our own: the search that shrinks a flaky failure draws the same cases
        seed = random.getrandbits(64)
    if seed is not None:
        from hypothesis import seed as hyp_seed
        prop = hyp_seed(seed)(prop)
    from strategies import seed_only_draws

    def search_again(shrinking_run_case) -> CaseOutcome | None:
        """`prop` again (its text unchanged, so the same draws), over `shrinking_run_case`, no database;
        the smallest failing outcome it found, or None."""
        nonlocal run_case
        from hypothesis import settings as hyp_settings
        run_case = _keeping_smallest_failure(refusing_invalid(stops_on_interrupt(shrinking_run_case)), smallest)
        again = hyp_settings(settings, database=None)(given(case=strategy)(prop.hypothesis.inner_test))
        if seed is not None:
            from hypothesis import seed as hyp_seed
            again = hyp_seed(seed)(again)
        try:
            with seed_only_draws():  # the draws of the first search, in any process
                again()
        except CaseFailed as err:
            return err.outcome
        except Flaky as err:  # the verdicts are kept per case: only a lowering that changes its draws gets here
            found = case_failures(err)
            return min((e.outcome for e in found), key=lambda o: fl.case_size(o.case)) if found else None
        return None

    def drawing_only(send: Callable[..., CaseOutcome]) -> None:  # in the drawer process: prop draws, `send` answers
        nonlocal run_case, progress
        run_case, progress = send, None
        prop()

    def judge_drawn(case: Case) -> CaseOutcome:  # prop's body for a case the drawer drew (a failure: prop's again)
        out = run_case(lowering, case, policy, opts, yardstick)
        if out.status != "fail":
            report.absorb(out, compile_family(lowering, case))
            if progress:
                progress(report, out)
        return out

    def resumed(judged: list[Case], last) -> None:  # hypothesis's own search, the cases judged so far replayed
        nonlocal run_case, progress
        run_case = ahead.replaying(run_case, judged, last)
        if progress is not None:
            shown_ = progress
            progress = lambda rep, out: None if out.status == SKIPPED else shown_(rep, out)  # noqa: E731
        prop()

    enabled = ahead.wanted(draw_ahead, settings, seed, target)
    if shard is None or shared_draws is None or not ahead.seed_fixes_the_draws(settings, seed, target):
        shared_draws = None  # one drawer for the shards only where they all draw the same cases
    try:
        with seed_only_draws():  # the same cases in any process, whatever it imported
            _interrupt_kept(lambda: ahead.search(prop, enabled=enabled or shared_draws is not None, draw=drawing_only,
                                                 judge=judge_drawn, resume=resumed, shared=shared_draws))
    except KeyboardInterrupt:  # keep what ran: the caller writes a partial report, failed, and stops
        report.interrupted = True
        report.extra.append(f"interrupted after {report.cases} case(s): a partial run, not a verdict")
        if smallest:  # a failure was found and hypothesis was shrinking it: report the smallest seen so far
            report.failures.append(Failure(smallest[0], shrunk=False))
            report.extra.append("interrupted while shrinking a failure: the smallest failing case found so far "
                                "is reported, not shrunk further")
    except SystemExit as err:
        return _exited(report, err, t0)
    except Unsatisfiable:  # supports() (or the limits) admit no case the strategy can draw: nothing judged
        report.reason = (f"no case could be drawn that supports() accepts under these limits ({report.cases} "
                         f"judged): nothing judged")
    except _CaseFailed as err:
        first = err.outcome if reducing or not first_failing else first_failing[0]  # where the shrink started
        if reducing:  # hypothesis's shrinker is off (`Profile.shrinker == "cases"`): the case reducer's turn
            found, again = _reduce(report, first, reduce_judge), _reduce_again(report, first, reduce_judge)
        else:  # after a slip, the same search again, shrinking the first failure under its own reasons
            found, again = err.outcome, None
            if slips.replayable(settings, seed, target):
                again = lambda want: search_again(slips.SameReason(base_run_case, first.case, want))  # noqa: E731
        slips.record(report, first, found, shrunk=not report.interrupted, shrink_again=again)
    except Flaky as err:  # failed, then passed on hypothesis's replay: a race, a crash or hang, state
        failed = case_failures(err)
        if not failed:
            raise
        if not flaky_runs:
            report.failures.append(Failure(failed[0].outcome, shrunk=False))
            report.extra.append(f"flaky: the case below failed, then passed when hypothesis replayed it "
                                f"({failed[0].outcome.failures[0][:120]}); not shrunk")
        else:
            try:
                fl.shrink_flaky(report, [f.outcome for f in failed], reruns, base_run_case, search_again)
            except KeyboardInterrupt:
                report.interrupted = True
                report.failures.append(Failure(failed[0].outcome, shrunk=False))
                report.extra.append("interrupted while shrinking a flaky failure: a partial run, not a verdict")
    if boundary_failure is not None and not report.failures and not report.interrupted:
        report.extra.append(f"caught by the boundary case ({boundary_failure[1]}) run before the random draw, "
                            f"which did not reach it in {report.cases} case(s)" + ("" if reducing else "; not shrunk"))
        first = boundary_failure[0]
        found = _reduce(report, first, reduce_judge) if reducing else first
        slips.record(report, first, found, shrunk=reducing and not report.interrupted,
                     shrink_again=_reduce_again(report, first, reduce_judge))
    if flaky_runs and report.failures and not report.interrupted:
        _name_failures(report, reruns, sanitizer)
    msg = compile_budget_message(lowering, report)
    if msg:
        report.extra.append(msg)
    if report.failures or report.extra:
        report.status = "fail"
    report.seconds = time.perf_counter() - t0
    return report

