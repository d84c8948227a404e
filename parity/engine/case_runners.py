"""Wrappers of `run_case` that the sweep composes: each takes a `run_case(lowering, case, policy, opts, yardstick)
-> CaseOutcome` and returns one of the same signature.

- `executor_run_case(executor)`: a case judged where the case executor runs it (`parity.engine.ports.CaseExecutor`);
- `sharded_run_case(run_case, (i, n))`: one shard's share of the draws (`check --shards`, pytest-xdist);
- `stops_on_interrupt(run_case)`: a stop the process machinery saw, raised before the next case;
- `refusing_invalid(run_case)`: bad input (an oracle that is not finite) raised, never judged;
- `keeping_smallest_failure(run_case, smallest)`: the smallest failing outcome kept (an interrupted shrink's).

Public: the five above, `shard_of_family`, `skipping_skipped`.
"""

from __future__ import annotations

import zlib
from typing import Callable

from lowerings import calls as hooks
from lowerings.protocol import Lowering
from oracle.case import Case
from parity.engine.answers import supports_answer
from parity.engine.case_run import refuse_invalid
from parity.engine.flakiness import case_size
from parity.engine.invocation import RunOptions
from parity.engine.outcome import SKIPPED, CaseOutcome, LoweringReport
from parity.engine.policy import Policy
from parity.engine.ports import CaseExecutor, raise_if_stop_requested


def refusing_invalid(run_case: Callable[..., CaseOutcome]) -> Callable[..., CaseOutcome]:
    """`run_case` that raises InvalidInput for a case whose oracle is not finite (`refuse_invalid`)."""
    def run(*args) -> CaseOutcome:
        return refuse_invalid(run_case(*args))
    return run


def stops_on_interrupt(run_case: Callable[..., CaseOutcome]) -> Callable[..., CaseOutcome]:
    """`run_case` that first raises a stop the interpreter swallowed (the stop request port,
    `parity.engine.ports.StopRequest`) as KeyboardInterrupt."""
    def run(*args) -> CaseOutcome:
        raise_if_stop_requested()
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


def executor_run_case(executor: CaseExecutor) -> Callable[..., CaseOutcome]:
    """`run_case`'s signature over `executor.run` (supports() is asked through `lowerings.calls.call`: here under
    the hook runner installed, or for a plugin's lowering in the executor's worker when `check` has it answered
    there)."""
    def run(lowering: Lowering, case: Case, policy: Policy, opts: RunOptions, yardstick: Lowering | None) -> CaseOutcome:
        why = hooks.call(lowering, "supports", case, case=case, expect=supports_answer)
        if why:
            return CaseOutcome(lowering.name, case, "unsupported", reason=why)
        return executor.run(lowering.name, case)
    return run


def keeping_smallest_failure(run_case: Callable[..., CaseOutcome], smallest: list[CaseOutcome]):
    """`run_case`, keeping in `smallest` (one item) the smallest failing outcome it returned (`case_size`)."""
    def run(*args, **kwargs) -> CaseOutcome:
        out = run_case(*args, **kwargs)
        if out.status == "fail" and (not smallest or case_size(out.case) < case_size(smallest[0].case)):
            smallest[:] = [out]
        return out

    return run


def skipping_skipped(progress: Callable[[LoweringReport, CaseOutcome], None] | None):
    """`progress` that shows no SKIPPED outcome (another shard's case, or one judged before a replay); None
    stays None."""
    if progress is None:
        return None
    return lambda rep, out: None if out.status == SKIPPED else progress(rep, out)
