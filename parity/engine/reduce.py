"""Case-level reduction of a failing case: the shrinker of a profile whose cases cost too much for
hypothesis's own (`Profile.shrinker == "cases"`: the `scale` profile, where one case holds pools past
2**31 elements and batches of 256 requests).

hypothesis shrinks the choice sequence a case was drawn from; at production scale that costs hundreds
of judged cases, each holding gigabytes on the GPU, and can stop on its time limit far from the smallest
case (measured: docs/lab/production-scale.md). `reduce_failure` works on the case itself, largest cuts
first, and keeps a cut when the case still fails (any failure, as hypothesis counts one):

1. the batch: each request alone (the longest first, then the one whose pages reach furthest into the
   pool, then the next longest: `SOLO_TRIES` of them), then chunks of the batch removed, halves first,
   down to single requests;
2. the pool: the pages no request owns dropped, the owned ones renumbered in their order (`compact_pool`);
   when the bug needs the large pool (a 32-bit-offset bug does), halved while it still fails (so within a
   factor of two of the smallest pool that shows it);
3. each request's context (the longest first): 0 keys, else bisection between the longest length that
   passes and the shortest that fails (a bug that starts at N keys lands on exactly N when it is
   monotone in the length). A `peak` key past a shorter context's keys sits on its last key
   (`oracle.case.Case.peak_key`).

A request's values do not depend on the other requests or on its own length (`oracle.values`: a shorter
context is a prefix), so a cut changes only what it cuts. Every step is a judged case, at most
`max_steps` of them; the log says what each phase did and whether the budget ended it.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable

from oracle.case import Case, pages_needed
from oracle.errors import InvalidInput

SOLO_TRIES = 4  # requests tried alone before the batch is cut in chunks
MAX_STEPS = 64  # judged cases one reduction may spend
COMPACT_SPARES = 1  # spare pages a compacted pool keeps (page 0's neighbour for a reader that runs past its pages)


def drop_requests(case: Case, keep: list[int]) -> Case:
    """`case` with only the requests `keep` (indices, in order); the pool and its other pages unchanged.
    A case without `value_keys` (its streams keyed by index) stays without them, so its kept requests take
    the values of their new index: such a cut is judged like any other. `peak_keys` go with their requests."""
    keys, peaks = case.value_keys, case.peak_keys
    return case.replace(context_lens=tuple(case.context_lens[b] for b in keep),
                        pages=tuple(case.pages[b] for b in keep),
                        value_keys=tuple(keys[b] for b in keep) if keys else (),
                        peak_keys=tuple(peaks[b] for b in keep) if peaks else ())


def shorten_request(case: Case, b: int, length: int) -> Case:
    """`case` with request `b`'s context cut to `length` keys: its page list keeps the pages the shorter
    context needs plus the extra pages it had (the others become spare pages of the pool)."""
    K, ps = case.block_size, case.page_size
    row = case.pages[b]
    extra = len(row) - pages_needed(case.context_lens[b], K, ps)  # >= 0: a Case holds the pages it needs
    lens = list(case.context_lens)
    lens[b] = length
    pages = list(case.pages)
    pages[b] = row[:pages_needed(length, K, ps) + extra]
    return case.replace(context_lens=tuple(lens), pages=tuple(pages))


def drop_spare_pages(case: Case, n: int) -> Case:
    """`case` with the `n` lowest-numbered spare pages (owned by no request) removed from the pool and the
    other pages renumbered in their order. Computed from the owned pages alone: a padded pool past 2**31
    elements can hold hundreds of millions of spare pages."""
    owned = sorted({p for row in case.pages for p in row})
    spares = case.num_pages - len(owned)
    if not 0 <= n <= spares:
        raise ValueError(f"n: between 0 and the pool's {spares} spare pages, got {n!r}")
    # page p has p - rank(p) spare pages below it; min(n, that) of them go
    new = {p: p - min(n, p - rank) for rank, p in enumerate(owned)}
    return case.replace(pages=tuple(tuple(new[p] for p in row) for row in case.pages), num_pages=case.num_pages - n)


def spare_page_count(case: Case) -> int:
    return case.num_pages - len({p for row in case.pages for p in row})


def compact_pool(case: Case) -> Case | None:
    """`case` with a pool of its owned pages and `COMPACT_SPARES` spare page(s) (`drop_spare_pages`); None
    when the pool is that small already."""
    n = spare_page_count(case) - COMPACT_SPARES
    return drop_spare_pages(case, n) if n > 0 else None


@dataclass
class Reduction:
    """What `reduce_failure` did: judged steps, cuts kept per phase, the phases its step budget ended."""

    steps: int = 0
    kept: dict[str, int] = field(default_factory=dict)
    cut_short: list[str] = field(default_factory=list)  # phases stopped by their share of the step budget
    interrupted: bool = False  # SIGINT during a step: the cuts made before it are kept
    seconds: float = 0.0
    start: str = ""

    @property
    def exhausted(self) -> bool:
        return bool(self.cut_short)

    def line(self) -> str:
        kept = ", ".join(f"{k} {v}" for k, v in self.kept.items() if v) or "none"
        return (f"shrunk by the case reducer (hypothesis's shrink phase is off in this profile) in {self.steps} "
                f"judged case(s), {self.seconds:.1f} s; cuts kept: {kept}"
                + (f"; stopped by the step budget in: {', '.join(self.cut_short)}" if self.cut_short else "")
                + ("; interrupted (SIGINT): the cuts made before it kept" if self.interrupted else "")
                + f"; from {self.start}")


class _Budget(Exception):
    pass


# Each phase's share of `max_steps` (of what is left when it starts): the batch may not take it all (a bug
# that needs 33 requests costs one removal per request at the last level), the lengths get the rest.
PHASE_SHARE = {"batch": 0.5, "pool": 0.25, "length": 1.0}


def reduce_failure(outcome, judge: Callable[[Case], object], *, max_steps: int = MAX_STEPS):
    """The smallest failing outcome found from the failing `outcome` (a `CaseOutcome`), and a `Reduction`.
    `judge(case) -> CaseOutcome` runs a case as the check does; a case it refuses (InvalidInput: a
    non-finite oracle) counts as not failing. Each phase spends at most its `PHASE_SHARE` of the steps
    left when it starts."""
    if isinstance(max_steps, bool) or not isinstance(max_steps, int) or max_steps < 1:
        raise ValueError(f"max_steps: a positive integer, got {max_steps!r}")
    log = Reduction(start=outcome.case.short()[:160])
    t0 = time.perf_counter()
    best = outcome
    cap = 0

    def fails(case: Case, phase: str) -> bool:
        nonlocal best
        if log.steps >= cap:
            log.cut_short.append(phase)
            raise _Budget
        log.steps += 1
        try:
            out = judge(case)
        except InvalidInput:
            return False
        if getattr(out, "status", None) == "fail":
            best = out
            log.kept[phase] = log.kept.get(phase, 0) + 1
            return True
        return False

    for phase, run in (("batch", _reduce_batch), ("pool", _reduce_pool), ("length", _reduce_lengths)):
        left = max_steps - log.steps
        cap = log.steps + max(1, int(left * PHASE_SHARE[phase])) if left > 0 else log.steps
        try:
            run(lambda c, phase=phase: fails(c, phase), lambda: best.case)
        except _Budget:
            pass
        except KeyboardInterrupt:  # SIGINT: what was cut so far is kept, the caller says it was interrupted
            log.interrupted = True
            break
    log.seconds = time.perf_counter() - t0
    return best, log


def _reduce_batch(fails: Callable[[Case], bool], current: Callable[[], Case]) -> None:
    case = current()
    if case.batch_size == 1:
        return
    longest = sorted(range(case.batch_size), key=lambda b: (-case.context_lens[b], b))
    furthest = max(range(case.batch_size), key=lambda b: (max(case.pages[b], default=-1), -b))
    order = list(dict.fromkeys([longest[0], furthest, *longest[1:]]))  # the pages furthest into the pool: offsets
    for b in order[:SOLO_TRIES]:
        if fails(drop_requests(case, [b])):
            return
    chunk = max(1, case.batch_size // 2)
    while chunk >= 1 and current().batch_size > 1:
        start = 0
        while start < current().batch_size and current().batch_size > 1:
            c = current()
            keep = [b for b in range(c.batch_size) if not start <= b < start + chunk]
            if keep and fails(drop_requests(c, keep)):
                continue  # the same start now names the next chunk
            start += chunk
        chunk //= 2


def _reduce_pool(fails: Callable[[Case], bool], current: Callable[[], Case]) -> None:
    small = compact_pool(current())
    if small is None or fails(small):
        return
    while True:  # the bug needs a large pool: halve it while it still fails
        c = current()
        n = min(spare_page_count(c) - COMPACT_SPARES, c.num_pages // 2)
        if n <= 0 or not fails(drop_spare_pages(c, n)):
            return


def _reduce_lengths(fails: Callable[[Case], bool], current: Callable[[], Case]) -> None:
    case = current()
    for b in sorted(range(case.batch_size), key=lambda i: (-case.context_lens[i], i)):
        top = current().context_lens[b]
        if top == 0 or fails(shorten_request(current(), b, 0)):
            continue
        lo, hi = 0, top  # lo passes, hi fails
        while hi - lo > 1:
            mid = (lo + hi) // 2
            if fails(shorten_request(current(), b, mid)):
                hi = mid
            else:
                lo = mid
