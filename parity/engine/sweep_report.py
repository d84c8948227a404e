"""What a lowering's sweep writes into its report besides the cases it judged: a check that stopped (a plugin's
exit, a hook's failure), a failing case reduced and named, the compile budget.

- `exited(report, err, t0)`: plugin code raised SystemExit: that lowering's failure, never a clean end of the run;
- `hook_failure_report(report, hf, t0)`: a hook raised, exited, hung or answered the wrong type;
- `reduced(report, outcome, judge)`: a failing case reduced by `parity.engine.reduce` (the case reducer, where
  hypothesis's shrinker is off), and `reduce_again` for a reduction that slipped to another reason;
- `named(report, reruns, sanitizer)`: each failure re-run and classified (`parity.engine.flakiness`);
- `compile_budget_message(lowering, report)`: a lowering that compiled past its `max_compiles` per family.

Public: the six above.
"""

from __future__ import annotations

import time
from typing import Callable

from lowerings.calls import HookFailure
from lowerings.protocol import Lowering
from oracle.case import Case
from parity.engine import flakiness as fl, reduce as reducer, slips
from parity.engine.outcome import CaseOutcome, Failure, LoweringReport
from parity.engine.ports import SanitizerReplay


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


def exited(report: LoweringReport, err: SystemExit, t0: float) -> LoweringReport:
    """The lowering's report when its plugin code (`supports()`, `expected_calls()`, or `run()` in process)
    raised SystemExit: a failure of that lowering, never a clean end of the run."""
    report.status = "fail"
    report.extra.append(f"plugin code raised SystemExit({err.code!r}) after {report.cases} case(s) (in supports(), "
                        f"expected_calls() or run()): a lowering must return, not exit the process")
    report.seconds = time.perf_counter() - t0
    return report


def hook_failure_report(report: LoweringReport, hf: HookFailure, t0: float) -> LoweringReport:
    """`report` failed by a hook's failure: the note names the hook; the case it was asked about (if any)
    becomes a failure (not shrunk) with its replayable file."""
    report.status = "fail"
    report.extra.append(f"{hf.message}; the check of this lowering stopped there (after {report.cases} case(s))")
    if hf.case is not None:
        report.failures.append(Failure(CaseOutcome(report.lowering, hf.case, "fail", failures=[hf.message]),
                                       shrunk=False))
    report.seconds = time.perf_counter() - t0
    return report


def reduced(report: LoweringReport, outcome: CaseOutcome, judge: Callable[[Case], CaseOutcome]) -> CaseOutcome:
    """`outcome`'s case reduced by `parity.engine.reduce` (its line in the report's notes); on SIGINT the cuts made
    so far are kept and the report is marked interrupted; a plugin's SystemExit keeps the failure as found."""
    try:
        best, log = reducer.reduce_failure(outcome, judge)
    except SystemExit as err:  # as `exited` says of a plugin's exit in a drawn case
        report.extra.append(f"plugin code raised SystemExit({err.code!r}) while the case reducer ran: a lowering "
                            f"must return, not exit the process; the failure is kept as found")
        return outcome
    report.extra.append(log.line())
    if log.interrupted:
        report.interrupted = True
        report.extra.append("interrupted while reducing a failing case: a partial run, not a verdict")
    return best


def reduce_again(report: LoweringReport, first: CaseOutcome, judge: Callable[[Case], CaseOutcome]):
    """`want -> outcome`: `first` reduced again where only a failure for one of the reasons `want` counts
    (`parity.engine.slips.record`, after a reduction that slipped to another reason)."""
    return lambda want: reduced(report, first, slips.same_reason_judge(judge, want))


def named(report: LoweringReport, reruns: fl.Reruns, sanitizer: SanitizerReplay | None) -> None:
    """`parity.engine.flakiness.name_failures`; SIGINT while re-running keeps the report (marked interrupted)."""
    try:
        fl.name_failures(report, reruns.classify, sanitizer)
    except KeyboardInterrupt:
        report.interrupted = True
        report.status = "fail"
        report.extra.append("interrupted while re-running a failure to classify it: a partial run, not a verdict")
