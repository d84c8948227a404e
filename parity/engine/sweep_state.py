"""The settings of one lowering's sweep (`SweepSpec`: what `check_lowering` is asked) and its state while it runs
(`SweepState`: the report, the `run_case` in use, what the search left behind).

Public: `SweepSpec`, `SweepState`.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

from hypothesis import Phase

from lowerings.protocol import Lowering
from oracle.case import Case
from parity.engine.case_run import compile_family
from parity.engine.invocation import RunOptions
from parity.engine.outcome import CaseOutcome, LoweringReport
from parity.engine.policy import Policy
from parity.engine.ports import CaseExecutor, SanitizerReplay


@dataclass(frozen=True)
class SweepSpec:
    """What one lowering's check draws and how it runs its cases (`parity.engine.sweep.check_lowering`).

    `strategy`: the hypothesis strategy of `Case`s; `settings`: the hypothesis settings it is drawn under (a
    `settings` object: profile, examples, derandomization; a decorator); `opts`: what `run_case` checks besides
    the numbers; `yardstick`: the lowering the working-dtype rule measures against (None: the built-in);
    `replay`: saved failures judged first; `progress(report, outcome)`: called after each counted case;
    `target`: steer the draw to the largest `out_ulp` (hypothesis `target()`); `seed`: hypothesis's seed (None:
    the profile's); `executor`: where a case runs (`parity.engine.ports.CaseExecutor`; None: in this process);
    `shard=(i, n)`: run the i-th of n shares of the draws (0 <= i < n); `flaky_runs`: R, the re-runs of each
    failure (0, or 2 and more); `sanitizer`: the stream sanitizer's replay of a run-dependent failure
    (`parity.engine.ports.SanitizerReplay`; None: none); `boundaries`: `strategies.Boundary` cases run before the
    draw; `draw_ahead`: `auto`, `on` or `off` (`parity.engine.draws.wanted`); `shared_draws`: the file through
    which a lowering's shards share one drawer (a `--jobs` shard; None: a drawer of its own)."""

    strategy: Any
    settings: Any
    opts: RunOptions = RunOptions()
    yardstick: Lowering | None = None
    replay: Sequence[Case] = ()
    progress: Callable[[LoweringReport, CaseOutcome], None] | None = None
    target: bool = False
    seed: int | None = None
    executor: CaseExecutor | None = None
    shard: tuple[int, int] | None = None
    flaky_runs: int = 4
    sanitizer: SanitizerReplay | None = None
    boundaries: Sequence[Any] = ()
    draw_ahead: str = "auto"
    shared_draws: Path | None = None


@dataclass
class SweepState:
    """One lowering's check while it runs.

    `run_case(lowering, case, policy, opts, yardstick) -> CaseOutcome` is the one in use: each phase wraps it
    (`parity.engine.case_runners`), and the search swaps it (a drawer's `send`, the replay after a drawer, the
    shrink of a flaky failure); `base_run_case` is it before any phase wrapped it (the history of what ran kept:
    what a flaky failure is shrunk with). `progress` likewise (None: nothing shown). `seed`: the search's
    (the spec's, or one of the sweep's own: a flaky failure's second search must draw the same cases).
    `boundary_failure`: the first failing boundary case and its label, reported if the draw finds none;
    `smallest`: the smallest failing outcome seen (one item; what an interrupted shrink reports); `first_failing`:
    the failure a shrink started from (`parity.engine.slips`)."""

    lowering: Lowering
    policy: Policy
    spec: SweepSpec
    report: LoweringReport
    t0: float
    run_case: Callable[..., CaseOutcome]
    base_run_case: Callable[..., CaseOutcome]
    reruns: Any  # parity.engine.flakiness.Reruns
    progress: Callable[[LoweringReport, CaseOutcome], None] | None = None
    seed: int | None = None
    boundary_failure: tuple[CaseOutcome, str] | None = None
    smallest: list[CaseOutcome] = field(default_factory=list)
    first_failing: list[CaseOutcome] = field(default_factory=list)

    @property
    def reducing(self) -> bool:
        """Whether a failure is shrunk by the case reducer (`parity.engine.reduce`): hypothesis's shrinker is off
        (`Profile.shrinker == "cases"`)."""
        return Phase.shrink not in self.spec.settings.phases

    def run(self, case: Case) -> CaseOutcome:
        """`case` through the `run_case` in use (not counted)."""
        return self.run_case(self.lowering, case, self.policy, self.spec.opts, self.spec.yardstick)

    def count(self, case: Case, out: CaseOutcome) -> None:
        """A judged case counted in the report, and shown (`progress`)."""
        self.report.absorb(out, compile_family(self.lowering, case))
        if self.progress:
            self.progress(self.report, out)

    def judge(self, case: Case) -> CaseOutcome:
        """`case` judged and counted (a step of the case reducer, ...)."""
        out = self.run(case)
        self.count(case, out)
        return out

    def timed(self) -> LoweringReport:
        """The report, its `seconds` set: the wall time since the check started."""
        self.report.seconds = time.perf_counter() - self.t0
        return self.report
