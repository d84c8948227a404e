"""What a `check --jobs` child checks (`Part`), and the command line that starts one (`child_argv`).

A child runs `python -m parity.front.child --part SPEC` (`CHILD_MODULE`; forked from the prefork, which imported
`CHILD_PRELOAD` once, or a fresh interpreter), SPEC being the run's `CheckConfig` as JSON and its part (`part_spec`).

`--shard I/S` (several machines) and `--shards NAME=S` / pytest-xdist shard items (several processes of one host)
compose: part `j` of `n` of shard `I` of `S` runs shard `I + S*j` of `S*n` of the serial run's cases (`compose`),
so the parts of every machine together run each case once.

Public: `Part`, `compose`, `part_spec`, `child_argv`, `CHILD_MODULE`, `CHILD_PRELOAD`.
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from parity.exec.prefork import PRELOAD

Shard = tuple[int, int]
CHILD_MODULE = "parity.front.child"
CHILD_PRELOAD = (*PRELOAD, CHILD_MODULE)  # what the prefork imports for the children: theirs too


def compose(outer: Shard | None, inner: Shard | None) -> Shard | None:
    """Part `inner = (j, n)` of shard `outer = (I, S)`: shard `(I + S*j, S*n)` of the serial run's cases."""
    if outer is None:
        return inner
    if inner is None:
        return outer
    return (outer[0] + outer[1] * inner[0], outer[1] * inner[1])


@dataclass(frozen=True)
class Part:
    """What a `--jobs` child checks: one lowering, or part `shard = (j, n)` of it (`--shards NAME=n`)."""

    lowering: str
    shard: Shard | None = None

    def to_json(self) -> dict[str, Any]:
        return {"lowering": self.lowering, "shard": list(self.shard) if self.shard else None}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> "Part":
        return cls(data["lowering"], tuple(data["shard"]) if data["shard"] else None)


def part_spec(config: Any, part: Part) -> str:
    """The JSON a `--jobs` child gets on its command line: the whole config and its part."""
    return json.dumps({"config": config.to_json(), "part": part.to_json()})


def child_argv(config: Any, part: Part) -> list[str]:
    """The child's command line: this run's config (as JSON) for one part, its plugin files made absolute."""
    child = config.replace(lowerings=(part.lowering,), plugins=tuple(str(Path(p).resolve()) for p in config.plugins),
                           jobs=1, threads=config.threads_per_process(), shards=(), gate_baseline=None, gate_accept=())
    return [sys.executable, "-m", CHILD_MODULE, "--part", part_spec(child, part)]
