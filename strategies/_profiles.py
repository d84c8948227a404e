"""Hypothesis profiles of dflash-parity, by name: `quick`, `dev`, `ci`, `gpu`, `nightly`, `scale`.

- `quick`: the first five minutes (`scripts/dev check`): every lowering, its boundary cases and a few
  derandomized draws; about two minutes for the CPU lowerings on two cores. The full `ci` sweep is
  `--profile ci`.
- `dev`: quick local runs, random, the local example database.
- `ci`: derandomized (the same cases every run), no deadline, no database: CI is deterministic.
- `gpu`: more cases per lowering on a GPU runner, derandomized.
- `nightly`: many random cases, pushed towards the worst ulp error with `hypothesis.target`.
- `scale`: the nightly GPU run at production scale: batches up to 256, contexts to 128K, pools padded
  past 2**31 and 2**32 elements, three quarters of the GPU for one case (`Profile.limits`: defaults for
  the limits a lowering leaves unset); a failure is shrunk by the case reducer (`parity.engine.reduce`), not by
  hypothesis, whose shrinker costs hundreds of production-scale cases (`Profile.shrinker`).

`flaky_runs` (R): how many times a failure is re-run before it is named ("failed k of R runs",
`parity.engine.flakiness`), and how many runs a case gets in the search that shrinks a flaky failure (it fails
when one of its R runs fails). More runs catch rarer races, at R times the cost of each shrink step.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from hypothesis import HealthCheck, Phase, settings


SHRINKERS = ("hypothesis", "cases")


@dataclass(frozen=True)
class Profile:
    name: str
    max_examples: int
    derandomize: bool
    target: bool
    description: str
    flaky_runs: int = 4
    # Defaults for the production limits a lowering leaves None (strategies._production.resolve), and the
    # share of the GPU's memory one case may take (None: oracle.footprint.CUDA_SHARE).
    limits: dict[str, Any] = field(default_factory=dict)
    case_share: float | None = None
    # Who shrinks a failure: "hypothesis" (its shrinker, over the choice sequence), or "cases" (hypothesis's
    # shrink phase off, `parity.engine.reduce` cuts the case itself: requests, pool, lengths; for cases that cost
    # too much for the hundreds of steps hypothesis's shrinker takes at production scale).
    shrinker: str = "hypothesis"

    def __post_init__(self) -> None:
        if self.shrinker not in SHRINKERS:
            raise ValueError(f"Profile {self.name!r}: shrinker must be one of {', '.join(SHRINKERS)}, got {self.shrinker!r}")
        if isinstance(self.flaky_runs, bool) or not isinstance(self.flaky_runs, int) or self.flaky_runs < 2:
            raise ValueError(f"Profile {self.name!r}: flaky_runs must be an integer >= 2, got {self.flaky_runs!r}")


PROFILES = {
    "quick": Profile("quick", 4, True, False, "a first look: the boundary cases and a few derandomized draws",
                     flaky_runs=4),
    "dev": Profile("dev", 40, False, False, "quick local runs, random draws", flaky_runs=4),
    "ci": Profile("ci", 60, True, False, "derandomized, no deadline, no example database", flaky_runs=4),
    "gpu": Profile("gpu", 200, True, False, "a GPU runner's sweep, derandomized", flaky_runs=8),
    "nightly": Profile("nightly", 1000, False, True, "random, targeted at the worst ulp error", flaky_runs=16),
    # scale: R as `gpu`'s (a derandomized GPU sweep); each re-run of a production case costs up to 75% of the GPU.
    # The case reducer shrinks: hypothesis's shrinker took minutes on a GPU and left a 32-bit-offset bug at
    # B = 72, 100,000 keys each (docs/gpu/2026-12-02-h200-session8.md).
    "scale": Profile("scale", 200, True, False, "nightly on a GPU at production scale: B to 256, 128K contexts, "
                     "pools past 2**31 elements", flaky_runs=8,
                     limits=dict(max_production_batch=256, max_pool_elements=2**33), case_share=0.75,
                     shrinker="cases"),
}


def profile_settings(name: str, *, max_examples: int | None = None, seed: int | None = None,
                     database: str | None = None) -> settings:
    """hypothesis `settings` for a named profile; `max_examples`, `seed` and `database` override it."""
    if name not in PROFILES:
        raise ValueError(f"--profile: one of {', '.join(PROFILES)}, got {name!r}")
    if max_examples is not None and (not isinstance(max_examples, int) or max_examples < 1):
        raise ValueError(f"--max-examples: a positive integer, got {max_examples!r}")
    prof = PROFILES[name]
    db = None
    if database:
        from hypothesis.database import DirectoryBasedExampleDatabase
        db = DirectoryBasedExampleDatabase(database)
    phases = [Phase.explicit, Phase.reuse, Phase.generate] + ([Phase.shrink] if prof.shrinker == "hypothesis" else [])
    if prof.target:
        phases.insert(3, Phase.target)
    return settings(
        max_examples=max_examples or prof.max_examples,
        derandomize=prof.derandomize and seed is None,
        deadline=None,
        database=db,
        phases=phases,
        report_multiple_bugs=False,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much, HealthCheck.data_too_large,
                               HealthCheck.differing_executors],
        print_blob=False,
    )
