"""The draw-ahead search as the engine sees it: when cases may be drawn elsewhere, and the replay that hands a
search back to hypothesis (`--draw-ahead`).

A derandomized (or seeded) search draws the same sequence whatever the test function does, as long as no case
fails: hypothesis's generate phase reads nothing of a passing call but that it returned. So another process can
draw the cases (the drawer port, `parity.engine.ports.DrawAhead`; the process machinery forks one:
`parity.exec.draw_ahead`) while this one judges them, and the report is the search's without the drawer. When a
case fails, hypothesis runs the search here over `replaying(run_case, judged, last)`: the cases judged already
answered without judging them again, every later call judged.

- `seed_fixes_the_draws(settings, seed, target)`: whether the draws depend on the seed alone: derandomized or
  seeded, no example database (its replays and saves), not targeted (`target()` steers the draw by the figures),
  with the generate phase. Whether the platform can run a drawer is the drawer port's to know.
- `wanted(mode, settings, seed, target)`: `--draw-ahead on|off|auto` (auto: for `AUTO_MIN_EXAMPLES` draws or more)
  where the seed fixes the draws.
- `DrawHere`: the drawer port's pure default: hypothesis draws in this process, `prop()` and nothing more.

Public: `MODES`, `AUTO_MIN_EXAMPLES`, `seed_fixes_the_draws`, `wanted`, `replaying`, `DrawDiverged`, `DrawHere`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

from hypothesis import Phase

from oracle.case import Case
from parity.engine.case_outcome import SKIPPED, CaseOutcome

MODES = ("auto", "on", "off")
AUTO_MIN_EXAMPLES = 100  # fewer draws gain little (a fork and exit with torch loaded: 4-11 ms on a CI-like CPU)


class DrawDiverged(BaseException):
    """hypothesis drew another case than the drawer did at the same index: the draws were not a function of
    the seed alone (a strategy or `supports()` that reads the clock, the process or the outcomes). A
    BaseException, so that hypothesis does not take it for a failure to shrink: it ends the lowering's check
    (`parity.engine.sweep.check_lowering` fails it, saying so)."""


def seed_fixes_the_draws(settings: Any, seed: int | None, target: bool) -> bool:
    """Whether a search under hypothesis `settings` draws a sequence fixed by its seed alone (a drawer can draw
    it elsewhere): derandomized or seeded, no example database, not targeted, with the generate phase."""
    if target or settings.database is not None or Phase.generate not in settings.phases:
        return False
    return bool(settings.derandomize or seed is not None)


def wanted(mode: str, settings: Any, seed: int | None, target: bool) -> bool:
    """Whether the search asks the drawer port to draw ahead under hypothesis `settings` (see the module
    docstring); ValueError for a mode not in `MODES`."""
    if mode not in MODES:
        raise ValueError(f"draw_ahead: one of {', '.join(MODES)}, got {mode!r}")
    if mode == "off" or not seed_fixes_the_draws(settings, seed, target):
        return False
    return mode == "on" or settings.max_examples >= AUTO_MIN_EXAMPLES


def replaying(run_case: Callable[..., CaseOutcome], judged: list[Case],
              last: tuple[Case, CaseOutcome | BaseException] | None) -> Callable[..., CaseOutcome]:
    """`run_case` for the search that resumes after the drawer: its first `len(judged)` calls answer SKIPPED
    (judged already), the next answers `last`'s outcome or raises its exception (judged already), every later
    one is judged. Each replayed call must get the case judged at its index (else `DrawDiverged`)."""
    state = {"at": 0}

    def run(lowering, case, policy, opts, yardstick) -> CaseOutcome:
        i = state["at"]
        state["at"] += 1
        if i < len(judged) or (i == len(judged) and last is not None):
            want = judged[i] if i < len(judged) else last[0]
            if case != want:
                raise DrawDiverged(f"draw {i}: hypothesis drew {case.short()} where the drawer drew {want.short()}; "
                                   f"the draws depend on more than the seed (run with --draw-ahead off)")
            if i < len(judged):
                return CaseOutcome(lowering.name, case, SKIPPED)
            if isinstance(last[1], BaseException):
                raise last[1]
            return last[1]
        return run_case(lowering, case, policy, opts, yardstick)
    return run


class DrawHere:
    """The drawer port's pure default: no drawer; hypothesis draws and the cases are judged in this process
    (`prop()`), whatever was asked (`enabled`, `shared`)."""

    def search(self, prop: Callable[[], None], *, enabled: bool, draw: Callable[..., None],
               judge: Callable[[Case], CaseOutcome], resume: Callable[..., None], shared: Path | None = None) -> None:
        prop()
