"""`check --jobs N --shards NAME=S`: one lowering's cases split over S child processes.

A lowering whose cases are dominated by per-process work that does not parallelize inside a process
(`torch.compile` traces a new graph for each shape family it sees: about a second of dynamo per family)
gets S child `check` processes instead of one. Shard `i` draws the very cases a serial run draws and
runs those whose draw index is `i` modulo S (`parity.engine.sweep.sharded_run_case`), so the S shards of a
derandomized profile run each of the serial run's cases exactly once; a random profile's shards each draw
their own. For a lowering that compiles (`max_compiles` set) the share is by compile family instead: shard
`i` runs every case of the families whose order of first appearance in the draws is `i` modulo S (where the
shards draw different cases, a random profile: the families a hash of each gives shard `i`), so each family
compiles in one process. Split by draw index instead, each shard
would compile nearly every family it saw. A shard that finds a failure shrinks it itself, judging every case
hypothesis tries.

Each shard writes its entry to `<report>/parts/<lowering>.shard-<i>-of-<S>.json` and works in its own
directory next to it (its failure files, its case in flight), so shards never write the same file. Only
shard 0 replays the lowering's saved failures. `merge_entries` makes one report entry of the shards'
(`parity.engine.outcome.LoweringReport.merged`: counts add up, the worst figures are the worst of any shard,
compile counts stay per process). `collect_failures` moves the
shards' failure files into `<report>/failures/`, numbered as a serial run numbers them, and keeps the
first case a dead shard left in flight for the next run's replay.

Public: `parse_shards(values, names) -> {name: S}`, `shard_label`, `shard_dir`, `merge_entries`,
`collect_failures`, `shard_part_entry`; `parse_shard` is `parity.front.config`'s.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any, Sequence

from oracle.errors import InvalidInput
from parity.front.config import parse_shard  # noqa: F401  (`--shard I/S` -> (I, S))
from parity.engine.outcome import FAMILY_KEYS, merge_entries as _merge  # a part's {family: compilations}; merged away
from parity.report.file_names import stem_files
from parity.report.files import atomic_write, dumps, replay_command

MAX_SHARDS = 64


def parse_shards(values: Sequence[str], names: Sequence[str]) -> dict[str, int]:
    """`--shards NAME=S` values (repeatable) -> {lowering: S}; NAME must be one of the lowerings checked."""
    out: dict[str, int] = {}
    for text in values:
        name, sep, count = text.rpartition("=")
        if not sep or not name:
            raise InvalidInput("--shards", f"expected NAME=S (a lowering and a shard count), got {text!r}")
        if name not in names:
            raise InvalidInput("--shards", f"{name!r} is not among the lowerings checked ({', '.join(names)})")
        try:
            n = int(count)
        except ValueError:
            n = 0
        if not 2 <= n <= MAX_SHARDS:
            raise InvalidInput("--shards", f"the shard count of {name} must be an integer from 2 to {MAX_SHARDS}, "
                                           f"got {count!r}")
        if name in out:
            raise InvalidInput("--shards", f"{name} is given twice")
        out[name] = n
    return out


def shard_label(name: str, shard: tuple[int, int] | None) -> str:
    """How progress lines and notes name one shard of a lowering."""
    return name if shard is None else f"{name} [shard {shard[0] + 1}/{shard[1]}]"


def shard_dir(report_dir: Path, stem: str, shard: tuple[int, int]) -> Path:
    """The directory one shard writes its failure files and its case in flight to."""
    return Path(report_dir) / "parts" / f"{stem}.shard-{shard[0]}-of-{shard[1]}"


def merge_entries(entries: Sequence[dict[str, Any]], lowering: str = "") -> dict[str, Any]:
    """One report entry from the entries of a lowering's shards (in shard order): `parity.engine.outcome`'s one
    merge (`LoweringReport.merged`)."""
    return _merge(entries, lowering)


def collect_failures(report_dir: Path, stem: str, entry: dict[str, Any], shard_dirs: Sequence[Path]) -> None:
    """Move the failure files `entry["failures"]` names from the shards' directories into
    `<report>/failures/` as `<stem>-1.json`, `-2`, ... in the entry's order (replacing this lowering's old
    ones), pointing each `file` (and the file's own replay command) there, and remove the files the entry
    no longer names (a case two shards shrank to: one failure); keep the first case a shard left in flight
    in `<report>/inflight/` for the next run's replay."""
    fdir = Path(report_dir) / "failures"
    for old in stem_files(fdir, stem):
        old.unlink()
    by_name = {f"{d.name}/failures/{f.name}": f for d in shard_dirs for f in stem_files(d / "failures", stem)}
    for n, fl in enumerate(entry.get("failures", []), 1):
        src = by_name.get(fl.get("file", ""))
        if src is None or not src.is_file():
            continue
        new = f"failures/{stem}-{n}.json"
        fdir.mkdir(parents=True, exist_ok=True)
        os.replace(src, Path(report_dir) / new)
        fl["file"] = new
        _point_replay_at(Path(report_dir) / new, fl.get("replay_args"))
    for f in by_name.values():  # the same shrunk case from another shard: merged into one failure
        f.unlink(missing_ok=True)
    inflight = Path(report_dir) / "inflight"
    for d in shard_dirs:
        for f in (d / "inflight").glob("*.json") if (d / "inflight").is_dir() else ():
            if not (inflight / f.name).exists():
                inflight.mkdir(parents=True, exist_ok=True)
                shutil.move(str(f), inflight / f.name)


def _point_replay_at(path: Path, replay_args: Sequence[str] | None) -> None:
    """The moved failure file's own replay command, naming where it is now."""
    try:
        saved = json.loads(path.read_text())
    except (OSError, ValueError):
        return
    if isinstance(saved, dict) and "replay" in saved:
        saved["replay"] = replay_command(path, replay_args)
        atomic_write(path, dumps(saved) + "\n")


def shard_part_entry(entry: dict[str, Any], work_dir: Path | None, family_counts: dict[tuple, int]) -> dict[str, Any]:
    """A part's entry: its failure files named by its shard directory `work_dir` (so `collect_failures`
    finds them; None: they are in the report's own `failures/`) and its per-family compile counts (so
    `merge_entries` counts distinct families)."""
    out = json.loads(json.dumps(entry))
    if work_dir is not None:
        for fl in out.get("failures", []):
            fl["file"] = f"{work_dir.name}/{fl['file']}"
    out[FAMILY_KEYS] = {k if isinstance(k, str) else repr(k): n for k, n in family_counts.items()}
    return out
