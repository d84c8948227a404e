"""The documented range of every number a user gives (`docs/cli.md`, "Bad input and other messages"): a
value outside it is refused naming the option (or environment variable) before anything is allocated,
armed or started.

- seconds (`--hook-timeout`, `$DFLASH_PARITY_HOOK_TIMEOUT`, `--case-timeout`, `bench --time-cap`): more
  than 0 and at most `MAX_SECONDS` (one day). The timers that enforce them overflow far below 1e12 s
  (`signal.setitimer` past the platform's time_t, `Connection.poll` past its _PyTime_t), and a day is
  longer than any hook or case should take.
- counts: `--shard I/S` and the shard reports `merge` reads, S at most `MAX_RUN_SHARDS`; `--threads` at
  most `MAX_THREADS` (OpenMP allocates per thread: 10^9 aborts the process); `--jobs` at most `MAX_JOBS`;
  `--max-examples` at most `MAX_EXAMPLES`; `--flaky-runs` at most `MAX_FLAKY_RUNS`; `bench --replays` at
  most `MAX_REPLAYS`.
- sizes: the shard reports one `merge` reads, together at most `MAX_MERGE_BYTES` (each one at most
  `parity.front.intake.MAX_JSON_BYTES`), checked from their sizes on disk before one is read.

`seconds_problem(x)` and `count_problem(x, least, most)` say what is wrong with a value (None: in range),
in words that follow "FLAG must be". This module imports nothing of the project: every front end and
report module may use it.

Public: the constants above, `seconds_problem`, `count_problem`.
"""

from __future__ import annotations

import math
from typing import Any

MAX_SECONDS = 86400.0
MAX_RUN_SHARDS = 1024
MAX_THREADS = 1024
MAX_JOBS = 1024
MAX_EXAMPLES = 10_000_000
MAX_FLAKY_RUNS = 1000
MAX_REPLAYS = 1_000_000
MAX_MERGE_BYTES = 1 << 30


def seconds_problem(value: Any) -> str | None:
    """What is wrong with `value` as a number of seconds (see the module docstring), or None."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0 or not math.isfinite(value):
        return "a positive number of seconds"
    if value > MAX_SECONDS:
        return f"at most {MAX_SECONDS:g} seconds (one day)"
    return None


def count_problem(value: Any, least: int, most: int, expected: str) -> str | None:
    """What is wrong with `value` as an integer from `least` to `most` (`expected` says the lower bound in
    words: "a positive integer", "an integer >= 0"), or None."""
    if isinstance(value, bool) or not isinstance(value, int) or value < least:
        return expected
    if value > most:
        return f"at most {most}"
    return None
