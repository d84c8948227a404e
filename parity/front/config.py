"""The configuration of one check: what `dflash-parity check` and a pytest session run with.

`CheckConfig` is frozen and validated in `__post_init__`: a bad value raises `InvalidInput` naming the
CLI option (`--case-timeout`, `--limit`, ...; the pytest front end names its own spelling,
`parity.front.options.pytest_message`). It is built by both front ends from the option table of
`parity.front.options`, and travels to `check --jobs` children as JSON (`to_json` / `from_json`).

Public: `CheckConfig`, `default_threads`, `xdist_worker_count`, `parse_shard`, `DEVICES`.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from parity.engine import ranges
from parity.report.provenance import parse_shard  # noqa: F401  (`--shard I/S` -> (I, S); public here too)

DEVICES = ("cpu", "cuda")
JOBS_STARTS = ("prefork", "spawn")  # `--jobs-start`: see parity.exec.prefork
DRAW_AHEAD = ("auto", "on", "off")  # `--draw-ahead`: see parity.exec.draw_ahead (its MODES)


def InvalidInput(where: str, rule: str) -> Exception:  # noqa: N802  (imported late: `oracle` imports torch)
    """`oracle.errors.InvalidInput(where, rule)`: this module is imported by the pytest plugin of every suite."""
    from oracle.errors import InvalidInput as invalid

    return invalid(where, rule)


def _positive_number(where: str, value: Any) -> None:
    problem = ranges.seconds_problem(value)
    if problem is not None:
        raise InvalidInput(where, f"{problem}, got {value!r}")


def _int_at_least(where: str, value: Any, least: int, most: int | None = None) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < least:
        raise InvalidInput(where, f"an integer >= {least}, got {value!r}")
    if most is not None and value > most:
        raise InvalidInput(where, f"an integer at most {most}, got {value!r}")


def default_threads(processes: int, cpus: int | None = None) -> int:
    """The cores over the processes that run cases at once, at least 1. torch's own default (every core in
    every process) oversubscribes a runner that checks several lowerings or xdist workers side by side: on
    a loaded 2-core machine it made a CPU check 4.4x slower than one thread per worker (the yardstick of
    one case 0.10 s -> 4.9 s)."""
    import os

    return max(1, (cpus if cpus is not None else os.cpu_count() or 1) // max(1, processes))


def xdist_worker_count() -> int:
    """The pytest-xdist workers of the session this process is a worker of (`PYTEST_XDIST_WORKER_COUNT`), or 1."""
    import os

    try:
        return max(1, int(os.environ.get("PYTEST_XDIST_WORKER_COUNT") or 1))
    except ValueError:
        return 1


@dataclass(frozen=True)
class CheckConfig:
    """Every setting of a check (`dflash-parity check --help` and `pytest --help` say what each does).

    - what: `lowerings` (names; empty: every registered one), `plugins` (files that register lowerings),
      `device` (None: cuda if available), `tolerances` (None: the packaged file), `allow_loose_bounds`;
    - the draw: `profile`, `seed`, `max_examples` (None: the profile's), `database`, `limits`
      (`FIELD=V[,V...]` texts, `strategies.limit_overrides`), `flaky_runs` (None: the profile's);
    - how hard: `hardening`, `kernel_names_every`, `isolate`, `case_timeout` (None: 120 s), `hook_timeout`;
    - where: `jobs` (processes on this host), `threads` (torch CPU threads per process running cases; None:
      `default_threads`), `shards` (`NAME=S` texts: one lowering over S of them),
      `shard` (`(I, S)`: this run is shard I of S of the serial run's cases, for several machines),
      `jobs_start` (how `--jobs` children start: `prefork`, forked from one process that imported once:
      `parity.exec.prefork`; or `spawn`, a fresh interpreter each), `warm_up`, `mps` (the `--jobs` children in
      one CUDA MPS context: `parity.exec.mps`), `draw_ahead` (`auto`, `on`, `off`: the cases drawn by a forked
      process while this one judges them, `parity.exec.draw_ahead`);
    - reports: `report` (directory; None: no files), `gate_baseline` and `gate_accept` (gate the report
      against a baseline report once written), `allow_nothing_judged`, `quiet`.
    """

    lowerings: tuple[str, ...] = ()
    plugins: tuple[str, ...] = ()
    device: str | None = None
    tolerances: str | None = None
    allow_loose_bounds: bool = False
    hook_timeout: float | None = None
    profile: str = "ci"
    seed: int | None = None
    max_examples: int | None = None
    database: str | None = None
    limits: tuple[str, ...] = ()
    flaky_runs: int | None = None
    hardening: bool = True
    kernel_names_every: int = 4
    isolate: bool = True
    case_timeout: float | None = None
    jobs: int = 1
    jobs_start: str = "prefork"
    threads: int | None = None
    shards: tuple[str, ...] = ()
    shard: tuple[int, int] | None = None
    warm_up: bool = False
    mps: bool = False
    draw_ahead: str = "auto"
    report: str | None = "parity-report"
    gate_baseline: str | None = None
    gate_accept: tuple[str, ...] = ()
    allow_nothing_judged: bool = False
    quiet: bool = False

    def __post_init__(self) -> None:
        from strategies import PROFILES, limit_overrides

        for name in ("lowerings", "plugins", "limits", "shards", "gate_accept"):
            value = getattr(self, name)
            if isinstance(value, str) or not all(isinstance(x, str) for x in value):
                raise InvalidInput(f"config {name}", f"a list of strings, got {value!r}")
            object.__setattr__(self, name, tuple(value))
        if self.device is not None and self.device not in DEVICES:
            raise InvalidInput("--device", f"one of {', '.join(DEVICES)}, got {self.device!r}")
        if self.profile not in PROFILES:
            raise InvalidInput("--profile", f"one of {', '.join(sorted(PROFILES))}, got {self.profile!r}")
        if self.seed is not None:
            _int_at_least("--seed", self.seed, 0)
        if self.max_examples is not None:
            _int_at_least("--max-examples", self.max_examples, 1, ranges.MAX_EXAMPLES)
        if self.flaky_runs is not None:
            _int_at_least("--flaky-runs", self.flaky_runs, 0, ranges.MAX_FLAKY_RUNS)
        _int_at_least("--kernel-names-every", self.kernel_names_every, 0)
        _int_at_least("--jobs", self.jobs, 1, ranges.MAX_JOBS)
        if self.jobs_start not in JOBS_STARTS:
            raise InvalidInput("--jobs-start", f"one of {', '.join(JOBS_STARTS)}, got {self.jobs_start!r}")
        if self.draw_ahead not in DRAW_AHEAD:
            raise InvalidInput("--draw-ahead", f"one of {', '.join(DRAW_AHEAD)}, got {self.draw_ahead!r}")
        if self.threads is not None:
            _int_at_least("--threads", self.threads, 1, ranges.MAX_THREADS)
        for where in ("case_timeout", "hook_timeout"):
            if getattr(self, where) is not None:
                _positive_number("--" + where.replace("_", "-"), getattr(self, where))
        if not self.isolate and self.case_timeout is not None:
            raise InvalidInput("--case-timeout", "applies to isolated runs only; drop it or drop --no-isolate")
        if self.shard is not None:
            shard = tuple(self.shard)
            if len(shard) != 2 or not all(isinstance(x, int) and not isinstance(x, bool) for x in shard) \
                    or not 0 <= shard[0] < shard[1] <= ranges.MAX_RUN_SHARDS:
                raise InvalidInput("--shard", f"expected I/S with 0 <= I < S <= {ranges.MAX_RUN_SHARDS}, got "
                                              f"{self.shard!r}")
            object.__setattr__(self, "shard", shard)
        if self.shards and self.jobs < 2:
            raise InvalidInput("--shards", "runs a lowering's shards side by side: give --jobs N (N >= 2) too")
        if self.mps and self.device == "cpu":
            raise InvalidInput("--mps", "shares a GPU among processes (CUDA MPS): it needs --device cuda, got cpu")
        if self.report == "":
            raise InvalidInput("--report", "an empty path: give a report directory (or leave the option out)")
        if self.gate_baseline == "":
            raise InvalidInput("--gate-baseline", "an empty path: give the baseline's report directory")
        if self.gate_accept and self.gate_baseline is None:
            raise InvalidInput("--gate-accept", "accepts a gate rule: give --gate-baseline DIR too")
        if self.gate_baseline is not None and self.report is None:
            raise InvalidInput("--gate-baseline", "gates the report this run writes: give a report directory too")
        if self.gate_accept:
            from parity.report.gate import parse_accept
            try:
                parse_accept(list(self.gate_accept))
            except ValueError as err:
                raise InvalidInput("--gate-accept", getattr(err, "rule", str(err))) from None
        try:
            limit_overrides(self.limits)
        except ValueError as err:
            where, _, rule = str(err).partition(": ")
            raise InvalidInput(where, rule) from None

    # -- derived --------------------------------------------------------------------------------------
    def overrides(self) -> dict[str, Any]:
        """The `--limit`s as `strategies.Limits` field overrides."""
        from strategies import limit_overrides

        return limit_overrides(self.limits)

    def hypothesis_settings(self, max_examples: int | None = None):
        """The profile's hypothesis settings with this run's seed, case count (`max_examples` first) and
        example database."""
        from strategies import profile_settings

        return profile_settings(self.profile, max_examples=max_examples or self.max_examples, seed=self.seed,
                                database=self.database)

    def threads_per_process(self, workers: int = 1) -> int:
        """torch's CPU threads for each process that runs cases: `threads`, else `default_threads` over
        `jobs` x `workers` processes (`workers`: pytest-xdist's)."""
        return self.threads if self.threads is not None else default_threads(self.jobs * max(1, workers))

    def draw_ahead_mode(self, workers: int = 1) -> str:
        """`draw_ahead` for this process: `auto` turns `off` where this process has fewer than two cores of its own
        (`threads_per_process`: `--jobs` children side by side, xdist workers), since a drawer then takes a core
        another process's cases need: with one core per child, a `--jobs` run was slower with drawers than
        without (docs/gpu/2026-12-03-h200-session21.md)."""
        if self.draw_ahead == "auto" and self.threads_per_process(workers) < 2:
            return "off"
        return self.draw_ahead

    def runs_of_a_failure(self) -> int:
        """How many times a failure is re-run to classify it (`flaky_runs`, else the profile's)."""
        from strategies import PROFILES

        return PROFILES[self.profile].flaky_runs if self.flaky_runs is None else self.flaky_runs

    def replace(self, **changes: Any) -> "CheckConfig":
        return dataclasses.replace(self, **changes)

    # -- JSON -----------------------------------------------------------------------------------------
    def to_json(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        for k, v in out.items():
            if isinstance(v, tuple):
                out[k] = list(v)
        return out

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> "CheckConfig":
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise InvalidInput(f"config {unknown[0]}", f"unknown setting; known: {', '.join(sorted(known))}")
        data = dict(data)
        if data.get("shard") is not None:
            data["shard"] = tuple(data["shard"])
        return cls(**data)
