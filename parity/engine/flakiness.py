"""Flakiness classified before it is named, and flaky failures shrunk.

A failure is named only after it is re-run. `classify` runs the failing case again `R` times on identical
inputs (the same canaries), judged ("failed k of R runs"); when not every run failed, `R` more runs, each
after one of the distinct cases that ran before the failure in the same process (its history); and it
probes the results bit for bit (`probe`: everything the lowering returns, output, LSE and every partial),
back to back and after each history case:

- back-to-back runs that differ: "nondeterministic across identical runs (a race, a missing stream sync,
  or uninitialized memory)";
- the same inputs giving other bits after another case ran (and the same bits back to back): also named
  nondeterministic, and it "depends on state left by a previous call" (a workspace or buffer read before
  it is written);
- identical bits everywhere, a failure only after the history: "depends on state left by a previous call";
- identical bits and no failure either way: "not reproduced" (a timing-dependent failure that shows
  rarely, a crash that does not come back).

A canary read is none of these: it reproduces with the same canary and changes with the canary
(`parity.engine.hardening.rerun_failures` names it inside the case).

`ShrinkingRunCase` is the `run_case` of the second search that shrinks a flaky failure: a case fails when
it fails in at least one of `R` runs (each after a history case when the failure depends on state), its
verdict kept per case so that hypothesis sees a deterministic test and shrinks it like any other bug.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

from lowerings.protocol import Lowering
from oracle.case import Case
from parity.engine.invocation import LoweringError, RunOptions, call_lowering, prepare_inputs
from parity.engine.result_bits import NONDETERMINISTIC, STATE, describe_diffs, differing_parts, nondeterminism_message, snapshot
from parity.engine.outcome import SKIPPED, CaseOutcome, Failure
from parity.engine.sanitizer_report import summary_line

NOT_REPRODUCED = "not reproduced"
CANARY_READ = "read outside the request's keys"  # parity.engine.hardening.rerun_failures
KINDS = ("reproducible", "nondeterministic", "state", "not reproduced", "crash", "hang")


# ---- the probe: identical runs, bit for bit (in the lowering's process) ------------------------------------

@dataclass(frozen=True)
class Probe:
    """`runs` calls of a case on identical inputs, back to back, then one more after each history case.

    `back_to_back[i]`: what call `i+1` changed against call `i` ("" when identical; call 0 follows whatever
    ran before, so `back_to_back[0]` may show state, the later ones a race); `after_history[j]`: what the
    call after history case `j` changed against the last back-to-back call; `errors`: calls that raised."""

    runs: int
    back_to_back: tuple[str, ...] = ()
    after_history: tuple[str, ...] = ()
    history: tuple[str, ...] = ()  # the history cases, `Case.short()`
    errors: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if isinstance(self.runs, bool) or not isinstance(self.runs, int) or self.runs < 0:
            raise ValueError(f"Probe.runs: an integer >= 0, got {self.runs!r}")
        if len(self.after_history) > len(self.history):
            raise ValueError(f"Probe: {len(self.after_history)} results after history cases, "
                             f"{len(self.history)} history cases")
        for name in ("back_to_back", "after_history", "history", "errors"):
            if not all(isinstance(x, str) for x in getattr(self, name)):
                raise ValueError(f"Probe.{name}: strings, got {getattr(self, name)!r}")

    @property
    def race(self) -> bool:
        """Calls right after the same inputs differ."""
        return any(self.back_to_back[1:])

    @property
    def state(self) -> bool:
        """The first call, or a call after another case, differs while the settled calls agree."""
        return not self.race and (bool(self.back_to_back[:1] and self.back_to_back[0]) or any(self.after_history))

    @property
    def varies(self) -> bool:
        return any(self.back_to_back) or any(self.after_history)

    def detail(self) -> str:
        if self.race:
            i, d = next((i, d) for i, d in enumerate(self.back_to_back) if i and d)
            n = sum(1 for d in self.back_to_back[1:] if d)
            return (f"{n} of {len(self.back_to_back) - 1} back-to-back runs on the same inputs (same canaries) "
                    f"changed the result; run {i + 2} changed {d}")
        hits = [(j, d) for j, d in enumerate(self.after_history) if d]
        if hits:
            j, d = hits[0]
            return (f"the same inputs (same canaries) give other bits after another case ran: after "
                    f"{self.history[j]} the call changed {d} ({len(hits)} of {len(self.after_history)} history "
                    f"cases change it); back to back the runs agree")
        return (f"the first run (after a different case) changed {self.back_to_back[0]} against the next one; "
                f"back to back the runs agree")

    def to_json(self) -> dict[str, Any]:
        return {"runs": self.runs, "back_to_back": list(self.back_to_back), "after_history": list(self.after_history),
                "history": list(self.history), "errors": list(self.errors), "race": self.race, "state": self.state}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> "Probe":
        return cls(runs=int(data["runs"]), back_to_back=tuple(data.get("back_to_back", ())),
                   after_history=tuple(data.get("after_history", ())), history=tuple(data.get("history", ())),
                   errors=tuple(data.get("errors", ())))


def leave_state(lowering: Lowering, case: Case, opts: RunOptions) -> None:
    """One call of `lowering` on `case`, its result dropped: what replaying a history case needs (the state
    the call leaves behind), at the cost of the call alone."""
    try:
        call_lowering(lowering, prepare_inputs(lowering, case, opts)[0], CaseOutcome(lowering.name, case, "pass"))
    except LoweringError:
        pass


def probe(lowering: Lowering, case: Case, opts: RunOptions, runs: int, history: Sequence[Case] = ()) -> Probe:
    """Call `lowering` on `case` `runs` times back to back, each on freshly built identical inputs (canary
    `opts.canary`), then once after one call on each `history` case, and compare every result bit for bit."""
    if runs < 2:
        raise ValueError(f"probe: runs must be >= 2, got {runs}")
    errors: list[str] = []

    def call(c: Case):
        try:
            return snapshot(call_lowering(lowering, prepare_inputs(lowering, c, opts)[0], CaseOutcome(lowering.name, c, "pass")))
        except LoweringError as err:
            errors.append(str(err))
            return None

    seq = [s for s in (call(case) for _ in range(runs)) if s is not None]
    b2b = tuple(describe_diffs(differing_parts(a, b)) for a, b in zip(seq, seq[1:]))
    after = []
    for h in history:
        leave_state(lowering, h, opts)
        s = call(case)
        after.append(describe_diffs(differing_parts(seq[-1], s)) if s is not None and seq else "")
    return Probe(runs, b2b, tuple(after), tuple(h.short() for h in history), tuple(errors))


# ---- classification ----------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Classification:
    """What re-running a failing case showed (see the module docstring).

    `failed` of `runs` judged runs alone failed; `failed_after_history` of `runs` runs each after a case of
    `history` (None: not tried); `history`: distinct cases that ran before the failure, the latest first;
    `probe` compared the results bit for bit (None: not probed); `message`: the name it gets ("" for a
    failure that reproduces and is nothing more)."""

    kind: str
    runs: int
    failed: int
    message: str = ""
    failed_after_history: int | None = None
    history: tuple[Case, ...] = ()
    probe: Probe | None = None

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"kind: one of {KINDS}, got {self.kind!r}")
        if not 0 <= self.failed <= self.runs:
            raise ValueError(f"failed: between 0 and runs={self.runs}, got {self.failed}")

    @property
    def runs_line(self) -> str:
        """`"failed 3 of 4 runs"` (`" alone, 4 of 4 after a previous case"` when tried)."""
        if self.kind == "hang":
            return "not re-run (it hung)"
        line = f"failed {self.failed} of {self.runs} runs"
        if self.failed_after_history is not None:
            line += f" alone, {self.failed_after_history} of {self.runs} after a previous case"
        return line

    @property
    def names_it(self) -> bool:
        """Whether the message names the failure (put first in its messages)."""
        return self.kind in ("nondeterministic", "state")

    @property
    def depends_on_history(self) -> bool:
        """Replays need a previous case first (the failure shows after one, or results change after one)."""
        return bool(self.history) and (self.kind == "state" or (self.probe is not None and self.probe.state))

    def to_json(self) -> dict[str, Any]:
        return {"kind": self.kind, "runs": self.runs, "failed": self.failed, "runs_line": self.runs_line,
                "failed_after_history": self.failed_after_history, "message": self.message,
                "depends_on_history": self.depends_on_history,
                "history": [h.to_json_dict() for h in self.history],
                "probe": self.probe.to_json() if self.probe is not None else None}


def classify(lowering: Lowering, outcome: CaseOutcome, history: Sequence[Case], *, runs: int,
             judge: Callable[[Case], CaseOutcome], leave: Callable[[Case], None],
             prober: Callable[[Case, int, Sequence[Case]], Probe] | None) -> Classification:
    """Re-run the failing `outcome`'s case: `runs` judged runs alone; when not every one failed, `runs` more,
    each after a case of `history` in turn; then the bit-for-bit probe. `judge` runs one case where the check
    runs them (in process or in a worker), `leave` calls the lowering once on a history case there
    (`leave_state`), `prober` probes there."""
    case = outcome.case
    history = tuple(h for h in history if h != case)[:runs]
    first = outcome.failures[0] if outcome.failures else ""
    if first.startswith("hung:"):
        return Classification("hang", runs, 0)
    failed = sum(judge(case).status == "fail" for _ in range(runs))
    after = None
    if failed < runs and history:
        after = 0
        for j in range(runs):
            leave(history[j % len(history)])
            after += judge(case).status == "fail"
    if first.startswith("crashed:"):  # a probe would kill the process again: the counts say it all
        kind = "crash" if failed or after else "not reproduced"
        return Classification(kind, runs, failed, "" if failed or after else _not_reproduced(runs, after), after,
                              history)
    pr = prober(case, runs, history) if prober is not None else None
    if pr is not None and pr.varies and getattr(lowering, "deterministic", True):
        msg = nondeterminism_message(pr.detail(), pr.state)
        return Classification("nondeterministic", runs, failed, msg, after, history, pr)
    if failed == 0 and after:
        msg = (f"{STATE}: fails after another case ran ({after} of {runs} runs, each after one of "
               f"{len(history)} earlier case(s), the latest {history[0].short()}) and passes alone (0 of {runs}); "
               f"identical runs agree bit for bit")
        return Classification("state", runs, failed, msg, after, history, pr)
    if failed == 0:
        return Classification("not reproduced", runs, failed, _not_reproduced(runs, after), after, history, pr)
    return Classification("reproducible", runs, failed, "", after, history, pr)


def _not_reproduced(runs: int, after: int | None) -> str:
    where = " alone" + (" and after earlier cases" if after is not None else "")
    return (f"{NOT_REPRODUCED}: failed once, then passed {runs} of {runs} identical runs{where} (a timing-dependent "
            f"failure that shows rarely?)")


def name_failure(outcome: CaseOutcome, c: Classification) -> None:
    """Put the classification's name first in `outcome.failures`, with the run counts, replacing the
    in-case nondeterminism line it supersedes (and a canary-read line when back-to-back runs on the same
    canary differ: a race whose calls alternate can look like one)."""
    if not c.names_it:
        return
    drop = (NONDETERMINISTIC, CANARY_READ) if c.probe is not None and c.probe.race else (NONDETERMINISTIC,)
    rest = [m for m in outcome.failures if not m.startswith(drop)]  # a race can mimic a canary read's pattern
    outcome.failures = [f"{c.message}; {c.runs_line}", *rest]


# ---- shrinking a flaky failure -----------------------------------------------------------------------------

HISTORY_KEPT = 16


@dataclass
class RunHistory:
    """Wraps `run_case`: remembers the distinct cases that ran (the latest first) before each failing outcome,
    and the first failing case drawn."""

    recent: list[Case] = field(default_factory=list)
    first_failure: Case | None = None
    before: dict[int, tuple[CaseOutcome, tuple[Case, ...]]] = field(default_factory=dict)

    def wrap(self, run_case: Callable[..., CaseOutcome]) -> Callable[..., CaseOutcome]:
        def run(lowering, case, policy, opts, yardstick) -> CaseOutcome:
            out = run_case(lowering, case, policy, opts, yardstick)
            if out.status in ("pass", "fail"):  # it ran (unsupported and skipped cases did not)
                if out.status == "fail":
                    self.before[id(out)] = (out, tuple(self.recent))
                    if self.first_failure is None:
                        self.first_failure = case
                self.note(case)
            return out
        return run

    def note(self, case: Case) -> None:
        self.recent = [case, *(c for c in self.recent if c != case)][:HISTORY_KEPT]

    def history_of(self, outcome: CaseOutcome) -> tuple[Case, ...]:
        entry = self.before.get(id(outcome))
        return entry[1] if entry is not None and entry[0] is outcome else ()


class ShrinkingRunCase:
    """The `run_case` of the search that shrinks a flaky failure. Draws before `target` (the first failing
    case of the first search) are skipped (answered SKIPPED: a pass) without running; `target` and every
    case after it once it failed are run up to `runs` times (run `j` after a call on `history[j]`, when
    given: `leave`) and fail if any run fails; a case is judged once and its verdict kept (hypothesis replays
    see the same answer). Draws after `target` while nothing failed are skipped too: the search ends at no
    cost."""

    def __init__(self, run_case: Callable[..., CaseOutcome], target: Case, runs: int,
                 history: Sequence[Case] = (), leave: Callable[[Case], None] | None = None) -> None:
        if history and leave is None:
            raise ValueError("ShrinkingRunCase: a history needs `leave` to replay it")
        self.run_case, self.target, self.runs, self.history, self.leave = run_case, target, runs, tuple(history), leave
        self.seen_target = False
        self.failing = False
        self.verdicts: dict[str, CaseOutcome] = {}

    def __call__(self, lowering, case, policy, opts, yardstick) -> CaseOutcome:
        if not self.failing and (self.seen_target or case != self.target):
            return CaseOutcome(lowering.name, case, SKIPPED)
        self.seen_target = True
        key = json.dumps(case.to_json_dict(), sort_keys=True)
        if key not in self.verdicts:
            out = None
            for j in range(self.runs):
                if self.history:
                    self.leave(self.history[j % len(self.history)])
                out = self.run_case(lowering, case, policy, opts, yardstick)
                if out.status != "pass":
                    break
            self.verdicts[key] = out
        out = self.verdicts[key]
        self.failing = self.failing or out.status == "fail"
        return out


def case_size(case: Case) -> tuple:
    """An order on cases by size (smaller first), for picking the smallest of several failures."""
    return (case.batch_size, case.block_size, sum(case.context_lens), case.num_q_heads, case.head_dim)


class Reruns:
    """Where a check re-runs a failure: judged runs (`judge`, as the check runs its cases), calls on history
    cases and the bit-for-bit probe where the lowering runs (this process, or `executor`'s worker when it has
    `leave_state` / `probe`); `history` is the check's `RunHistory`, `runs` its R (0: no re-runs)."""

    def __init__(self, lowering: Lowering, opts: RunOptions, judge: Callable[[Case], CaseOutcome], executor: Any,
                 runs: int) -> None:
        if isinstance(runs, bool) or not isinstance(runs, int) or (runs != 0 and runs < 2):
            raise ValueError(f"flaky_runs: 0 (no re-runs) or an integer >= 2, got {runs!r}")
        self.lowering, self.judge, self.runs, self.history = lowering, judge, runs, RunHistory()
        leave_in, probe_in = getattr(executor, "leave_state", None), getattr(executor, "probe", None)
        if executor is None:
            self.leave = lambda c: leave_state(lowering, c, opts)
            self.prober = lambda c, n, h: probe(lowering, c, opts, n, h)
        else:
            self.leave = (lambda c: leave_in(lowering.name, c)) if callable(leave_in) else judge
            self.prober = (lambda c, n, h: probe_in(lowering.name, c, n, h)) if callable(probe_in) else None

    def classify(self, outcome: CaseOutcome) -> Classification:
        return classify(self.lowering, outcome, self.history.history_of(outcome), runs=self.runs, judge=self.judge,
                        leave=self.leave, prober=self.prober)


def shrink_flaky(report: Any, outcomes: list[CaseOutcome], reruns: Reruns, run_case: Callable[..., CaseOutcome],
                 search: Callable[[ShrinkingRunCase], CaseOutcome | None]) -> None:
    """A failure hypothesis could not replay: classify it (which decides whether each run needs a case that
    ran before it), then `search` again with `ShrinkingRunCase` from the first failing case drawn (`search`
    returns the smallest failing outcome it found, or None); record it (shrunk), else the failure as it was
    (not shrunk), and a note."""
    history, runs = reruns.history, reruns.runs
    first = min(outcomes, key=lambda o: case_size(o.case))
    before = reruns.classify(first)
    hist = before.history if before.depends_on_history else ()
    shrinker = ShrinkingRunCase(run_case, history.first_failure or first.case, runs, hist, reruns.leave)
    found = search(shrinker)
    if found is not None:
        if hist:
            history.before[id(found)] = (found, hist)
        report.failures.append(Failure(found, shrunk=True))
        how = f"shrunk with a case failing when it fails in at least one of {runs} runs" + (
            " (each after an earlier case: the failure depends on state)" if hist else "")
    else:
        report.failures.append(Failure(first, shrunk=False, classification=before))
        how = f"not shrunk: it failed in none of {runs} runs when drawn again"
    report.extra.append(f"flaky: the case below failed, then passed when hypothesis replayed it "
                        f"({first.failures[0][:120]}); {how}")


SANITIZED_KINDS = ("nondeterministic", "state", "not reproduced")


def name_failures(report: Any, classify: Callable[[CaseOutcome], Classification],
                  sanitizer: Callable[[str, Case, Case | None], str] | None) -> None:
    """Classify each failure not classified yet (its name goes first in its messages), and with a `sanitizer`
    (`parity.engine.ports.SanitizerReplay`, on CUDA) replay the run-dependent ones under the stream sanitizer,
    its report attached (`parity.engine.sanitizer_report`)."""
    for f in report.failures:
        if f.classification is None:
            f.classification = classify(f.outcome)
        c = f.classification
        name_failure(f.outcome, c)
        if c.kind == "not reproduced" and f"flaky: {c.message}" not in report.extra:
            report.extra.append(f"flaky: {c.message}")
        if sanitizer is not None and c.kind in SANITIZED_KINDS:
            f.sanitizer = sanitizer(report.lowering, f.outcome.case, c.history[0] if c.depends_on_history else None)
            f.outcome.failures.append(summary_line(f.sanitizer))  # one line; the whole report in the file
