"""A failure that slips while shrinking: the shrunk case fails for another reason than the first failure.

hypothesis shrinks towards any failure of the test (with `report_multiple_bugs=False`, the profiles'
setting, its engine shrinks "allowing slips to any bug with a smaller minimal test case"), and so does
the case reducer (`parity.engine.reduce`, any failure counts): a lowering with two bugs can start from a failure
of one and end on a small case of the other, the first bug lost. `record` compares the reasons of the
first failing case with those of the case the shrink ended on; when they share none (a slip), the first
failure is shrunk again under its own reasons (`SameReason` for a hypothesis search, `same_reason_judge`
for the reducer: a case fails only when it fails for one of them) and both are reported, each with its
own case file and messages (`Failure.slip` says how they stand), with a note that says so. No slip, no
second shrink: a check without one costs and reports what it always did.

A reason is a kind of criterion, not a figure (`reasons`): `output`, `LSE`, `partial <name> output` /
`LSE`, `kernel calls`, `kernel names`, `inputs written`, `output buffers`, `canary read`,
`nondeterministic`, `request isolation`, `raised` (the lowering raised or returned no valid result, in
any run), `crash`, `hang`, `out of memory`, `other`. Reasons that overlap are the same failure seen
through a narrower set of criteria (a score bug fails output and LSE, then the LSE alone on one key):
only disjoint reasons are a slip. Nor is a change of reason on the same case, or to or from a
`nondeterministic` failure: a lowering whose identical runs differ fails one run on its output and the
next on its re-run (an uninitialized accumulator does both), so its reasons prove no second bug.
"""

from __future__ import annotations

import re
from typing import Any, Callable

from oracle.case import Case
from parity.engine.outcome import SKIPPED, CaseOutcome, Failure
from parity.engine.result_bits import NONDETERMINISTIC

PREFIXES = (  # a message that is not a comparison's, by how it starts -> its reason
    ("kernel calls:", "kernel calls"),
    ("GPU kernels:", "kernel names"),
    ("input mutated:", "inputs written"),
    ("read outside the request's keys", "canary read"),
    ("output with ", "canary read"),  # a nondeterministic lowering judged again with the other canary
    (NONDETERMINISTIC, "nondeterministic"),
    ("request isolation:", "request isolation"),
    ("crashed:", "crash"),
    ("hung:", "hang"),
    ("out of device memory", "out of memory"),
    ("second run", "raised"), ("third run", "raised"), ("fourth run", "raised"), ("isolation run", "raised"),
    ("profiled run", "raised"),
)
_BUFFER = re.compile(r"given (out|lse_out)\b|\((out|lse_out)[,)]")  # parity.engine.hardening.output_buffer_failures


def _comparison_reason(label: str, message: str) -> str:
    """`output` / `LSE` (the main comparison) or `partial A output` / `partial A LSE`."""
    rest = message[len(label):] if message.startswith(label) else message
    lse = rest.startswith((" LSE", ": LSE", ": max |LSE"))
    if label == "output":
        return "LSE" if lse else "output"
    return f"{label} {'LSE' if lse else 'output'}"


def message_reason(message: str, lowering: str) -> str:
    """The reason of a failure message that is no comparison's (see the module docstring)."""
    for prefix, reason in PREFIXES:
        if message.startswith(prefix):
            return reason
    if _BUFFER.search(message):
        return "output buffers"
    if message.startswith((f"{lowering} ", f"{lowering}:", f"{lowering}.")):  # parity.engine.invocation.LoweringError
        return "raised"
    return "other"


def reasons(outcome: CaseOutcome) -> frozenset[str]:
    """The reasons a failing outcome fails for: its comparisons' criteria, then its other messages'."""
    found: set[str] = set()
    judged: set[str] = set()
    for c in outcome.comparisons:
        for m in c.failures:
            judged.add(m)
            found.add(_comparison_reason(c.label, m))
    found.update(message_reason(m, outcome.lowering) for m in outcome.failures if m not in judged)
    return frozenset(found)


def describe(rs: frozenset[str]) -> str:
    return ", ".join(sorted(rs)) or "no reason"


RUN_DEPENDENT = frozenset({"nondeterministic"})  # reasons whose failure changes from one identical run to the next


def slipped(first: CaseOutcome, last: CaseOutcome) -> bool:
    """Whether the shrink from `first` ended on another case, `last`, failing for other reasons only, neither
    of them run-dependent (see the module docstring)."""
    a, b = reasons(first), reasons(last)
    if not a or not b or a & b or (a | b) & RUN_DEPENDENT:
        return False
    return first.case != last.case


def replayable(settings: Any, seed: int | None, target: bool) -> bool:
    """Whether a search under hypothesis `settings` can be run again to draw the same cases (derandomized or
    seeded, not targeted, no example database): what shrinking the first failure again needs."""
    return bool(settings.derandomize or seed is not None) and not target and settings.database is None


def keeping_first_failure(run_case: Callable[..., CaseOutcome], first: list[CaseOutcome]):
    """`run_case`, keeping in `first` (one item) the first failing outcome it returned."""
    def run(*args, **kwargs) -> CaseOutcome:
        out = run_case(*args, **kwargs)
        if out.status == "fail" and not first:
            first.append(out)
        return out

    return run


class SameReason:
    """The `run_case` of the search that shrinks the first failure again under its own reasons (`want`):
    draws before `target` (the first failing case) are answered SKIPPED (a pass) without running; from
    `target` on, a case that fails for none of `want` is answered SKIPPED too, its outcome kept in `others`.
    Once `target` has run without failing (a flaky one), every later draw is skipped: the search ends at no
    cost."""

    def __init__(self, run_case: Callable[..., CaseOutcome], target: Case, want: frozenset[str]) -> None:
        self.run_case, self.target, self.want = run_case, target, want
        self.seen_target = self.failing = False
        self.others: list[CaseOutcome] = []

    def __call__(self, lowering, case, policy, opts, yardstick) -> CaseOutcome:
        if not self.failing and (self.seen_target or case != self.target):
            return CaseOutcome(lowering.name, case, SKIPPED)
        self.seen_target = True
        out = self.run_case(lowering, case, policy, opts, yardstick)
        if out.status == "fail" and not reasons(out) & self.want:
            self.others.append(out)
            return CaseOutcome(lowering.name, case, SKIPPED)
        self.failing = self.failing or out.status == "fail"
        return out


def same_reason_judge(judge: Callable[[Case], Any], want: frozenset[str]) -> Callable[[Case], Any]:
    """`judge` (the case reducer's) where a case failing for none of `want` counts as not failing."""
    def run(case: Case):
        out = judge(case)
        if getattr(out, "status", None) == "fail" and not reasons(out) & want:
            return CaseOutcome(out.lowering, case, SKIPPED)
        return out

    return run


def record(report: Any, first: CaseOutcome, last: CaseOutcome, *, shrunk: bool,
           shrink_again: Callable[[frozenset[str]], CaseOutcome | None] | None) -> None:
    """Append to `report.failures` the failure the shrink ended on (`last`, from `first`). When it slipped
    (`slipped`), `shrink_again(reasons of first)` shrinks the first failure again under its own reasons
    (None: it cannot, or found none: the first failure is reported as found, not shrunk); both are
    appended, the first failure's first, and a note says so."""
    if not slipped(first, last):
        report.failures.append(Failure(last, shrunk=shrunk))
        return
    want, other = reasons(first), reasons(last)
    again, why = None, "its draws cannot be replayed (random or targeted draws, or an example database)"
    if report.interrupted:
        why = "the check was interrupted"
    elif shrink_again is not None:
        try:
            again = shrink_again(want)
            why = "it did not fail again when drawn again"
        except KeyboardInterrupt:
            report.interrupted = True
            why = "interrupted (SIGINT) while shrinking it again"
        except SystemExit as err:  # a plugin's exit, as `parity.engine.sweep._exited` says of one in a drawn case
            why = f"plugin code raised SystemExit({err.code!r}) while it was shrunk again"
    if again is not None and not reasons(again) & want:
        again = None
    kept = again if again is not None else first
    how = "shrunk again under its own reasons" if again is not None else f"as first found, not shrunk: {why}"
    report.failures.append(Failure(kept, shrunk=shrunk and again is not None,
                                   slip=f"the first failure ({describe(want)}), {how}; the shrink slipped from "
                                        f"it to a case failing for {describe(other)}"))
    report.failures.append(Failure(last, shrunk=shrunk,
                                   slip=f"where the shrink of the first failure ({describe(want)}) ended: a case "
                                        f"failing for another reason ({describe(other)}), a second bug"))
    report.extra.append(f"the shrink slipped from one failure to another: the first failing case ({describe(want)}) "
                        f"shrank to a case that fails for another reason ({describe(other)}), a second bug; both "
                        f"are reported, each with its own case file: {kept.case.short()} ({describe(want)}, {how}) "
                        f"and {last.case.short()} ({describe(other)})")
