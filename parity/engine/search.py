"""hypothesis's search over one lowering's cases, after its saved failures and boundary cases: `search(state)`.

hypothesis draws cases from the sweep's strategy and calls the test function (`drawn_property`) on each; a
failing outcome is raised inside it (`CaseFailed`), so hypothesis shrinks its case like any failure (a crash
too). Where its shrinker is off the case reducer shrinks it (`parity.engine.reduce`); a shrink that slipped to
a failure of another reason is shrunk again under its own, both reported (`parity.engine.slips`); a failure that
passed on hypothesis's replay (`Flaky`) is shrunk in a second search where a case fails if it fails in one of R
runs (`parity.engine.flakiness.shrink_flaky`). The cases may be drawn by another process while this one judges
them (the drawer port, `parity.engine.ports.DrawAhead`, `parity.engine.draws`): the same cases, verdicts and
shrunk failures. SIGINT keeps what ran (the smallest failure found so far, when hypothesis was shrinking one).

Public: `search`, `drawn_property`, `CaseFailed`, `case_failures`, `interrupt_kept`.
"""

from __future__ import annotations

import random
from typing import Callable

from hypothesis import given, seed as hyp_seed, settings as hyp_settings, target as hyp_target
from hypothesis.errors import Flaky, Unsatisfiable

from oracle.case import Case
from parity.engine import slips
from parity.engine.case_run import compile_family
from parity.engine.case_runners import (keeping_smallest_failure, refusing_invalid, sharded_run_case, skipping_skipped,
                                        stops_on_interrupt)
from parity.engine.draws import replaying, seed_fixes_the_draws, wanted
from parity.engine.flakiness import case_size, shrink_flaky
from parity.engine.outcome import CaseOutcome, Failure, LoweringReport
from parity.engine.ports import current, stop_requested
from parity.engine.sweep_report import exited, reduce_again, reduced
from parity.engine.sweep_state import SweepState
from strategies import seed_only_draws


class CaseFailed(Exception):
    """A failing outcome raised inside hypothesis's test function, so that hypothesis shrinks its case."""

    def __init__(self, outcome: CaseOutcome):
        super().__init__(outcome.summary())
        self.outcome = outcome


_CaseFailed = CaseFailed  # the name the test function raises: its text seeds derandomized draws (`drawn_property`)


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


def interrupt_kept(run: Callable[[], None]) -> None:
    """`run()`; an error it raises after a stop was requested (the stop request port) is that interrupt: a
    KeyboardInterrupt raised inside hypothesis's own set-up (reading the test's source for its database key)
    came back as hypothesis's `AssertionError`, and the check process exited without its partial report (seen
    on a loaded CPU). A case's failure stays what it is."""
    try:
        run()
    except (KeyboardInterrupt, SystemExit, _CaseFailed, Flaky, Unsatisfiable):
        raise
    except Exception as err:
        if stop_requested():
            raise KeyboardInterrupt from err
        raise


class _Current:
    """What the test function calls as `run_case` (and tests as `progress`): the sweep state's one now, looked
    up at each call, so that the search swaps them (`SweepState.run_case`) without an edit of the function's text."""

    __slots__ = ("state", "attr")

    def __init__(self, state: SweepState, attr: str) -> None:
        self.state, self.attr = state, attr

    def __bool__(self) -> bool:
        return bool(getattr(self.state, self.attr))

    def __call__(self, *args):
        return getattr(self.state, self.attr)(*args)


def drawn_property(s: SweepState):
    """hypothesis's test function (`prop`) over the sweep's strategy under its settings: each case judged by the
    `run_case` in use, counted and shown, its `out_ulp` a target where the search is targeted, a failure raised
    (`CaseFailed`). Its text, decorators included, seeds hypothesis's derandomized draws (hypothesis hashes a test
    function's source): an edit of it changes every draw, in process and isolated alike."""
    lowering, policy, opts, yardstick = s.lowering, s.policy, s.spec.opts, s.spec.yardstick
    report, target, strategy, settings = s.report, s.spec.target, s.spec.strategy, s.spec.settings
    run_case, progress = _Current(s, "run_case"), _Current(s, "progress")

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

    return prop


class _Draws:
    """One lowering's search through the drawer port (`run`), and the second search a flaky failure's shrink asks
    for (`again`). `enabled`: a drawer is wanted (`parity.engine.draws.wanted`); `shared`: the shards' one drawer's
    file, only where every shard draws the same cases."""

    def __init__(self, s: SweepState, prop) -> None:
        spec = s.spec
        self.s, self.prop = s, prop
        self.enabled = wanted(spec.draw_ahead, spec.settings, s.seed, spec.target)
        fixed = seed_fixes_the_draws(spec.settings, s.seed, spec.target)
        self.shared = spec.shared_draws if spec.shard is not None and fixed else None

    def run(self) -> None:
        current().draw_ahead.search(self.prop, enabled=self.enabled or self.shared is not None,
                                    draw=self.drawing_only, judge=self.judge_drawn, resume=self.resumed,
                                    shared=self.shared)

    def drawing_only(self, send: Callable[..., CaseOutcome]) -> None:
        """In the drawer: the test function draws, `send` answers each case."""
        self.s.run_case, self.s.progress = send, None
        self.prop()

    def judge_drawn(self, case: Case) -> CaseOutcome:
        """The test function's body for a case the drawer drew (a failure is counted when hypothesis replays it)."""
        out = self.s.run(case)
        if out.status != "fail":
            self.s.count(case, out)
        return out

    def resumed(self, judged: list[Case], last) -> None:
        """hypothesis's own search, the cases judged so far replayed (`parity.engine.draws.replaying`)."""
        s = self.s
        s.run_case, s.progress = replaying(s.run_case, judged, last), skipping_skipped(s.progress)
        self.prop()

    def again(self, shrinking_run_case: Callable[..., CaseOutcome]) -> CaseOutcome | None:
        """The test function again (its text unchanged, so the same draws), over `shrinking_run_case`, no
        database; the smallest failing outcome it found, or None."""
        s = self.s
        s.run_case = keeping_smallest_failure(refusing_invalid(stops_on_interrupt(shrinking_run_case)), s.smallest)
        again = hyp_settings(s.spec.settings, database=None)(given(case=s.spec.strategy)(self.prop.hypothesis.inner_test))
        if s.seed is not None:
            again = hyp_seed(s.seed)(again)
        try:
            with seed_only_draws():  # the draws of the first search, in any process
                again()
        except CaseFailed as err:
            return err.outcome
        except Flaky as err:  # the verdicts are kept per case: only a lowering that changes its draws gets here
            found = case_failures(err)
            return min((e.outcome for e in found), key=lambda o: case_size(o.case)) if found else None
        return None


def _wrapped_for_the_draw(s: SweepState) -> None:
    """The `run_case` the search judges with: a shard's share of the draws (after the replays, which run in every
    shard given them), stops and bad input raised, the smallest and the first failure kept."""
    spec = s.spec
    if spec.shard is not None:
        by_family = None if s.lowering.max_compiles is None else (lambda c: compile_family(s.lowering, c))
        shared = (spec.settings.derandomize or s.seed is not None) and not spec.target  # every shard draws the same
        s.run_case = sharded_run_case(s.run_case, spec.shard, failing=s.boundary_failure is not None,
                                      family=by_family, shared_draws=shared)
        s.progress = skipping_skipped(s.progress)
    s.run_case = refusing_invalid(stops_on_interrupt(s.run_case))
    # The smallest failing outcome so far, what an interrupted shrink leaves: kept by a wrapper of `run_case`,
    # not in the test function, whose text seeds hypothesis's derandomized draws.
    s.run_case = keeping_smallest_failure(s.run_case, s.smallest)
    s.run_case = slips.keeping_first_failure(s.run_case, s.first_failing)  # where the shrink starts


def _seeded(s: SweepState, prop):
    """`prop` under the search's seed: the spec's, or, for a random profile whose failures are re-run, one of
    its own (the search that shrinks a flaky failure must draw the same cases)."""
    if s.seed is None and not s.spec.settings.derandomize and s.spec.flaky_runs:
        s.seed = random.getrandbits(64)
    return prop if s.seed is None else hyp_seed(s.seed)(prop)


def search(s: SweepState) -> LoweringReport | None:
    """hypothesis's search of the lowering's cases, its failures recorded in `s.report`: the final report where a
    plugin's exit ended the check, else None (the sweep finishes the report)."""
    _wrapped_for_the_draw(s)
    draws = _Draws(s, _seeded(s, drawn_property(s)))
    report = s.report
    try:
        with seed_only_draws():  # the same cases in any process, whatever it imported
            interrupt_kept(draws.run)
    except KeyboardInterrupt:  # keep what ran: the caller writes a partial report, failed, and stops
        report.interrupted = True
        report.extra.append(f"interrupted after {report.cases} case(s): a partial run, not a verdict")
        if s.smallest:  # a failure was found and hypothesis was shrinking it: report the smallest seen so far
            report.failures.append(Failure(s.smallest[0], shrunk=False))
            report.extra.append("interrupted while shrinking a failure: the smallest failing case found so far "
                                "is reported, not shrunk further")
    except SystemExit as err:
        return exited(report, err, s.t0)
    except Unsatisfiable:  # supports() (or the limits) admit no case the strategy can draw: nothing judged
        report.reason = (f"no case could be drawn that supports() accepts under these limits ({report.cases} "
                         f"judged): nothing judged")
    except CaseFailed as err:
        _record_shrunk(s, draws, err.outcome)
    except Flaky as err:  # failed, then passed on hypothesis's replay: a race, a crash or hang, state
        failed = case_failures(err)
        if not failed:
            raise
        _record_flaky(s, draws, [f.outcome for f in failed])
    return None


def _record_shrunk(s: SweepState, draws: _Draws, shrunk: CaseOutcome) -> None:
    """The failure hypothesis shrank to `shrunk` (or, with its shrinker off, the case reducer's), recorded with
    the failure the shrink started from (`parity.engine.slips.record`)."""
    report = s.report
    first = shrunk if s.reducing or not s.first_failing else s.first_failing[0]  # where the shrink started
    if s.reducing:  # hypothesis's shrinker is off (`Profile.shrinker == "cases"`): the case reducer's turn
        found, again = reduced(report, first, s.judge), reduce_again(report, first, s.judge)
    else:  # after a slip, the same search again, shrinking the first failure under its own reasons
        found, again = shrunk, None
        if slips.replayable(s.spec.settings, s.seed, s.spec.target):
            again = lambda want: draws.again(slips.SameReason(s.base_run_case, first.case, want))  # noqa: E731
    slips.record(report, first, found, shrunk=not report.interrupted, shrink_again=again)


def _record_flaky(s: SweepState, draws: _Draws, failed: list[CaseOutcome]) -> None:
    """Failures that passed on hypothesis's replay: shrunk in a second search (`flaky_runs`), else kept as found."""
    report = s.report
    if not s.spec.flaky_runs:
        report.failures.append(Failure(failed[0], shrunk=False))
        report.extra.append(f"flaky: the case below failed, then passed when hypothesis replayed it "
                            f"({failed[0].failures[0][:120]}); not shrunk")
        return
    try:
        shrink_flaky(report, failed, s.reruns, s.base_run_case, draws.again)
    except KeyboardInterrupt:
        report.interrupted = True
        report.failures.append(Failure(failed[0], shrunk=False))
        report.extra.append("interrupted while shrinking a flaky failure: a partial run, not a verdict")
